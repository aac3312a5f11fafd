"""Values derived from the config at start (behavior.md §3.4) and the config's log forms."""

from __future__ import annotations

import hashlib

import pytest

from dracpu.config import (
    ConfigError,
    DriverConfig,
    KubeletPaths,
    config_dump_yaml,
    config_fingerprint,
    deprecated_flag_warnings,
    deprecated_flags_set,
    kubelet_paths,
    load_config,
    parse_reserved_cpus,
    resolve_node_name,
)
from dracpu.cpuset import CPUSet
from dracpu.flags import parse_root_flags

NODE_NAME_ERROR = (
    "can not obtain the node name, use the hostname-override flag if you want to set it to a "
    "specific value: "
)


# -- reserved CPUs ------------------------------------------------------------------------------


def test_reserved_cpus() -> None:
    assert parse_reserved_cpus(DriverConfig()) == CPUSet()
    assert parse_reserved_cpus(DriverConfig(reservedCPUs="0-1,8")) == CPUSet([0, 1, 8])
    # Not checked against the online CPUs.
    assert parse_reserved_cpus(DriverConfig(reservedCPUs="4096")) == CPUSet([4096])


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("1-", "not a cpu id or range: '1-'"),
        ("0,", "empty item: ''"),
        (" 1", "not a cpu id or range: ' 1'"),
        ("-1", "not a cpu id or range: '-1'"),
        ("3-1", "range end below its start: '3-1'"),
    ],
)
def test_reserved_cpus_errors(text: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_reserved_cpus(DriverConfig(reservedCPUs=text))
    assert str(info.value) == f"failed to parse reserved CPUs: invalid cpuset '{text}': {reason}"


# -- node name ----------------------------------------------------------------------------------


def test_node_name_sources_in_order() -> None:
    def host() -> str:
        return " Host-1\n"

    override = DriverConfig(hostnameOverride="  Node-A ")
    assert resolve_node_name(override, host, {"NODE_NAME": "env"}) == "node-a"
    assert resolve_node_name(DriverConfig(), host, {"NODE_NAME": "Env-Node"}) == "env-node"
    assert resolve_node_name(DriverConfig(), host, {}) == "host-1"
    assert resolve_node_name(DriverConfig(), hostname=host, env={}) == "host-1"


@pytest.mark.parametrize(
    ("cfg", "env"),
    [
        (DriverConfig(hostnameOverride=" \t"), {"NODE_NAME": "n"}),
        (DriverConfig(), {"NODE_NAME": "  "}),
        (DriverConfig(), {}),
    ],
)
def test_empty_node_name(cfg: DriverConfig, env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_node_name(cfg, lambda: "   ", env)
    assert str(info.value) == NODE_NAME_ERROR + "empty hostname is invalid"


def test_hostname_lookup_failure() -> None:
    def broken() -> str:
        raise OSError(5, "Input/output error")

    with pytest.raises(ConfigError) as info:
        resolve_node_name(DriverConfig(), broken, {})
    assert str(info.value) == (
        NODE_NAME_ERROR + "couldn't determine hostname: [Errno 5] Input/output error"
    )


# -- kubelet paths ------------------------------------------------------------------------------


def test_kubelet_paths_default_root() -> None:
    assert kubelet_paths(DriverConfig()) == KubeletPaths(
        registrar_dir="/var/lib/kubelet/plugins_registry",
        plugin_dir="/var/lib/kubelet/plugins/dra.cpu",
        registrar_socket="/var/lib/kubelet/plugins_registry/dra.cpu-reg.sock",
        dra_socket="/var/lib/kubelet/plugins/dra.cpu/dra.sock",
    )


def test_kubelet_paths_under_the_filesystem_root() -> None:
    paths = kubelet_paths(load_config("", {"kubelet-root-dir": "/"}))
    assert paths.registrar_socket == "/plugins_registry/dra.cpu-reg.sock"
    assert paths.dra_socket == "/plugins/dra.cpu/dra.sock"


def test_socket_path_limit_is_107_bytes() -> None:
    longest = "/" + "k" * 72  # 73 bytes: the socket path is exactly 107
    paths = kubelet_paths(load_config("", {"kubelet-root-dir": longest}))
    assert len(paths.registrar_socket) == 107
    too_long = "/" + "k" * 73
    with pytest.raises(ConfigError) as info:
        kubelet_paths(load_config("", {"kubelet-root-dir": too_long}))
    assert str(info.value) == (
        f'kubelet registrar socket path "{too_long}/plugins_registry/dra.cpu-reg.sock" is 108 '
        "bytes, over the 107-byte limit for a Unix socket path: kubeletRootDir has 73 bytes to "
        "spend and is using 74"
    )


def test_socket_path_limit_counts_bytes_not_characters() -> None:
    root = "/" + "é" * 37  # 37 characters but 75 bytes
    with pytest.raises(ConfigError) as info:
        kubelet_paths(DriverConfig(kubeletRootDir=root))
    assert str(info.value) == (
        f'kubelet registrar socket path "{root}/plugins_registry/dra.cpu-reg.sock" is 109 '
        "bytes, over the 107-byte limit for a Unix socket path: kubeletRootDir has 73 bytes to "
        "spend and is using 75"
    )


# -- the startup dump, fingerprint and deprecation warnings ---------------------------------------


def test_config_dump_lists_every_key_with_zero_values_sorted() -> None:
    assert config_dump_yaml(DriverConfig()) == (
        "alignMemory: false\n"
        "bindAddress: :8080\n"
        "cdiDir: /var/run/cdi\n"
        "cgroupRoot: /sys/fs/cgroup\n"
        "claimStatus: true\n"
        "cpuDeviceMode: grouped\n"
        "debugAddress: 127.0.0.1:8081\n"
        "exposePCIeRoots: false\n"
        "groupBy: numanode\n"
        "hostnameOverride: ''\n"
        "isolateIRQs: false\n"
        "kubeconfig: ''\n"
        "kubeletRootDir: /var/lib/kubelet\n"
        "logFormat: text\n"
        "nriSocket: /var/run/nri/nri.sock\n"
        "procRoot: /proc\n"
        "publishIsolatedCPUs: true\n"
        "publishNodeAllocatableResourceMapping: false\n"
        "reservedCPUs: ''\n"
        "stateDir: /var/lib/dracpu\n"
        "sysfsOverlay: ''\n"
        "sysfsRoot: /sys\n"
    )


def test_config_dump_quotes_what_yaml_would_misread() -> None:
    dump = config_dump_yaml(DriverConfig(reservedCPUs="0-1", hostnameOverride="on"))
    assert "reservedCPUs: 0-1\n" in dump
    assert "hostnameOverride: 'on'\n" in dump


def test_fingerprint_is_stable() -> None:
    # Pinned: a change here means restarted daemons see a different configuration.
    payload = (
        b'{"cpuDeviceMode":"grouped","exposePCIeRoots":false,"groupBy":"numanode",'
        b'"publishNodeAllocatableResourceMapping":false,"reservedCPUs":"","v":1}'
    )
    assert config_fingerprint(DriverConfig()) == hashlib.sha256(payload).hexdigest()
    assert config_fingerprint(DriverConfig()) == (
        "61f589cc35ca516a2dd6d501becf3511a3741208ac497f429644dce0a4024dc1"
    )


def test_fingerprint_follows_only_allocation_fields() -> None:
    base = config_fingerprint(DriverConfig())
    assert len(base) == 64
    same = [
        DriverConfig(kubeconfig="/k", hostnameOverride="n", bindAddress=":1"),
        DriverConfig(sysfsOverlay="/o", kubeletRootDir="/k", sysfsRoot="/h", logFormat="json"),
    ]
    assert {config_fingerprint(c) for c in same} == {base}
    changed = [
        DriverConfig(cpuDeviceMode="individual"),
        DriverConfig(groupBy="socket"),
        DriverConfig(reservedCPUs="0"),
        DriverConfig(exposePCIeRoots=True),
        DriverConfig(publishNodeAllocatableResourceMapping=True),
    ]
    prints = {config_fingerprint(c) for c in changed}
    assert len(prints) == len(changed) and base not in prints


def test_fingerprint_normalises_equivalent_configs() -> None:
    assert config_fingerprint(DriverConfig(reservedCPUs="0,1,2")) == config_fingerprint(
        DriverConfig(reservedCPUs="0-2")
    )
    individual = DriverConfig(cpuDeviceMode="individual")
    assert config_fingerprint(individual) == config_fingerprint(
        DriverConfig(cpuDeviceMode="individual", groupBy="socket")
    )
    # An unparsable cpuset still has a fingerprint (the raw text).
    assert config_fingerprint(DriverConfig(reservedCPUs="x")) != config_fingerprint(
        DriverConfig(reservedCPUs="y")
    )


def test_deprecated_flag_warnings_in_flag_name_order() -> None:
    parsed = parse_root_flags(
        [
            "--sysfs-overlay=/o",
            "--reserved-cpus=0",
            "-v=2",
            "--group-by=socket",
            "--hostname-override=n",
            "--cpu-device-mode=grouped",
            "--bind-address=:1",
        ]
    )
    expected = [
        ("cpu-device-mode", "cpuDeviceMode"),
        ("group-by", "groupBy"),
        ("hostname-override", "hostnameOverride"),
        ("reserved-cpus", "reservedCPUs"),
        ("sysfs-overlay", "sysfsOverlay"),
    ]
    assert deprecated_flag_warnings(parsed.explicit) == expected
    assert deprecated_flag_warnings(list(parsed.explicit)) == expected
    assert deprecated_flags_set(parsed.explicit) == expected
    assert deprecated_flag_warnings(["v", "config", "expose-pcie-roots"]) == []
