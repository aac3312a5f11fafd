"""Config layering and validation (behavior.md §3) and Go-style root flags (§2.2)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dracpu.config import (
    ConfigError,
    DriverConfig,
    config_dump_yaml,
    config_fingerprint,
    deprecated_flags_set,
    kubelet_paths,
    load_config,
    parse_reserved_cpus,
    reconstruct_from_cmdline,
    resolve_node_name,
)
from dracpu.cpuset import CPUSet
from dracpu.flags import FlagError, parse_root_flags, usage_text


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_defaults() -> None:
    cfg = load_config("", {})
    assert cfg == DriverConfig()
    assert cfg.bindAddress == ":8080"
    assert cfg.kubeletRootDir == "/var/lib/kubelet"
    assert (cfg.cpuDeviceMode, cfg.groupBy) == ("grouped", "numanode")
    assert (cfg.sysfsRoot, cfg.nriSocket, cfg.cdiDir) == (
        "/sys",
        "/var/run/nri/nri.sock",
        "/var/run/cdi",
    )
    assert (cfg.cgroupRoot, cfg.stateDir) == ("/sys/fs/cgroup", "/var/lib/dracpu")


def test_example_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'apiVersion: v1alpha1\ncpuDeviceMode: grouped\ngroupBy: numanode\nreservedCPUs: "0-1"\n'
        "publishNodeAllocatableResourceMapping: false\n",
    )
    cfg = load_config(path, {})
    assert cfg.reservedCPUs == "0-1"
    assert parse_reserved_cpus(cfg) == CPUSet([0, 1])


def test_flag_wins_only_when_set(tmp_path: Path) -> None:
    path = write(tmp_path, "groupBy: socket\nreservedCPUs: '0'\n")
    assert load_config(path, {}).groupBy == "socket"
    cfg = load_config(path, {"group-by": "machine"})
    assert (cfg.groupBy, cfg.reservedCPUs) == ("machine", "0")
    assert load_config(path, {"v": 3, "config": path}).groupBy == "socket"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: 1\na: 2\n", "cannot apply {p}: parsing {p}: duplicate key 'a' (line 2, column 1)"),
        ("a: [\n", "cannot apply {p}: parsing {p}: "),
        ("apiVersion: v2\n", 'cannot apply {p}: unsupported apiVersion "v2", want "v1alpha1"'),
        ("apiVersion: 3\n", 'cannot apply {p}: unsupported apiVersion "", want "v1alpha1"'),
        (
            "cpudevicemode: grouped\ngroupby: socket\nreservedcpus: '1'\n",
            'cannot apply {p}: field "cpudevicemode" is spelled differently from the schema; '
            'use "cpuDeviceMode"; field "groupby" is spelled differently from the schema; use '
            '"groupBy"; field "reservedcpus" is spelled differently from the schema; use '
            '"reservedCPUs"',
        ),
        (
            "BindAddress: ':1'\n",
            'cannot apply {p}: field "BindAddress" is not configurable via the config file; '
            "use --bind-address instead (and move the DaemonSet's healthz port with it)",
        ),
        (
            "bindAddress: ':1'\n",
            'cannot apply {p}: field "bindAddress" is not configurable via the config file; '
            "use --bind-address instead (and move the DaemonSet's healthz port with it)",
        ),
        (
            "exposePCIeRoots: true\n",
            'cannot apply {p}: field "exposePCIeRoots" is not configurable via the config '
            "file; use --expose-pcie-roots instead",
        ),
        (
            "kubeletRootDir: /x\n",
            'cannot apply {p}: field "kubeletRootDir" is not configurable via the config file; '
            "use --kubelet-root-dir instead",
        ),
        (
            "sysfsRoot: /x\n",
            'cannot apply {p}: field "sysfsRoot" is not configurable via the config file; '
            "use --sysfs-root instead",
        ),
        (
            "showMetrics: true\n",
            'cannot apply {p}: applying config map: json: unknown field "showMetrics"',
        ),
        (
            "reservedCPUs: 0\n",
            "cannot apply {p}: applying config map: json: cannot unmarshal number into field "
            "reservedCPUs of type string",
        ),
        (
            'publishNodeAllocatableResourceMapping: "true"\n',
            "cannot apply {p}: applying config map: json: cannot unmarshal string into field "
            "publishNodeAllocatableResourceMapping of type bool",
        ),
        ("- a\n", "cannot apply {p}: parsing {p}: the top level must be a mapping"),
        (
            "cpuDeviceMode: fancy\n",
            'cannot validate config: invalid cpuDeviceMode "fancy": must be "grouped" or '
            '"individual"',
        ),
        (
            "groupBy: rack\n",
            'cannot validate config: invalid groupBy "rack": must be "socket", "numanode", or '
            '"machine"',
        ),
    ],
)
def test_file_errors(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    assert str(info.value).startswith(message.format(p=path))


def test_yaml_11_booleans_and_empty_file(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, ""), {}) == DriverConfig()
    cfg = load_config(write(tmp_path, "publishNodeAllocatableResourceMapping: yes\n"), {})
    assert cfg.publishNodeAllocatableResourceMapping is True


def test_bogus_group_by_ignored_in_individual_mode(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "cpuDeviceMode: individual\ngroupBy: rack\n"), {})
    assert cfg.cpuDeviceMode == "individual"


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match=r"^cannot apply /nonexistent\.yaml: reading "):
        load_config("/nonexistent.yaml", {})


def test_kubelet_root_dir_cleaning_and_validation() -> None:
    assert load_config("", {"kubelet-root-dir": "/mnt/a/../kubelet//"}).kubeletRootDir == (
        "/mnt/kubelet"
    )
    with pytest.raises(ConfigError) as info:
        load_config("", {"kubelet-root-dir": ""})
    assert str(info.value) == "cannot validate config: invalid kubeletRootDir: must not be empty"
    with pytest.raises(ConfigError) as info:
        load_config("", {"kubelet-root-dir": "var/lib"})
    assert str(info.value) == (
        'cannot validate config: invalid kubeletRootDir "var/lib": must be an absolute path'
    )


def test_socket_path_limit() -> None:
    ok = "/" + "k" * 72
    paths = kubelet_paths(load_config("", {"kubelet-root-dir": ok}))
    assert paths.registrar_socket == ok + "/plugins_registry/dra.cpu-reg.sock"
    assert paths.dra_socket == ok + "/plugins/dra.cpu/dra.sock"
    too_long = "/" + "k" * 73
    with pytest.raises(ConfigError) as info:
        kubelet_paths(load_config("", {"kubelet-root-dir": too_long}))
    assert str(info.value) == (
        f'kubelet registrar socket path "{too_long}/plugins_registry/dra.cpu-reg.sock" is 108 '
        "bytes, over the 107-byte limit for a Unix socket path: kubeletRootDir has 73 bytes "
        "to spend and is using 74"
    )


def test_node_name() -> None:
    cfg = DriverConfig(hostnameOverride="  Node-A ")
    assert resolve_node_name(cfg, hostname=lambda: "h", env={}) == "node-a"
    assert resolve_node_name(DriverConfig(), hostname=lambda: "H", env={"NODE_NAME": "n1"}) == "n1"
    assert resolve_node_name(DriverConfig(), hostname=lambda: "Host", env={}) == "host"
    with pytest.raises(ConfigError) as info:
        resolve_node_name(DriverConfig(), hostname=lambda: " ", env={})
    assert str(info.value) == (
        "can not obtain the node name, use the hostname-override flag if you want to set it to "
        "a specific value: empty hostname is invalid"
    )


def test_reserved_parse_error() -> None:
    with pytest.raises(ConfigError, match=r"^failed to parse reserved CPUs: invalid cpuset '1-'"):
        parse_reserved_cpus(DriverConfig(reservedCPUs="1-"))


def test_dump_fingerprint_deprecations() -> None:
    dump = config_dump_yaml(DriverConfig())
    assert dump.splitlines()[:2] == ["alignMemory: false", "bindAddress: :8080"]
    assert "exposePCIeRoots: false" in dump and "hostnameOverride: ''" in dump
    assert config_fingerprint(DriverConfig()) == config_fingerprint(DriverConfig(kubeconfig="x"))
    assert config_fingerprint(DriverConfig()) != config_fingerprint(DriverConfig(groupBy="socket"))
    assert deprecated_flags_set({"group-by": "socket", "v": 1}) == [("group-by", "groupBy")]


def test_reconstruct_from_cmdline(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "c.yaml").write_text("groupBy: socket\nreservedCPUs: '0-3'\n")

    def resolve(p: str) -> str:
        return str(tmp_path / p.lstrip("/"))

    cfg = reconstruct_from_cmdline(
        ["/dracpu", "--unknown", "value", "--config=/etc/c.yaml", "--reserved-cpus", "0-1"],
        resolve,
    )
    assert (cfg.groupBy, cfg.reservedCPUs) == ("socket", "0-1")
    assert reconstruct_from_cmdline(["/dracpu", "--", "--group-by=machine"], resolve) == (
        DriverConfig()
    )
    assert reconstruct_from_cmdline(["/dracpu", "--v=bad"], resolve) == DriverConfig()
    with pytest.raises(ConfigError, match=r"^failed to resolve driver config: cannot validate"):
        reconstruct_from_cmdline(["/dracpu", "--kubelet-root-dir=rel"], resolve)


# -- flags --------------------------------------------------------------------------------


def test_flag_forms() -> None:
    p = parse_root_flags(["-v=4", "--group-by", "socket", "-expose-pcie-roots", "introspect", "-x"])
    assert p.explicit == {"v": 4, "group-by": "socket", "expose-pcie-roots": True}
    assert p.positionals == ["introspect", "-x"]
    assert parse_root_flags(["--v", "4"]).explicit == {"v": 4}
    assert parse_root_flags(["--expose-pcie-roots=false"]).explicit == {"expose-pcie-roots": False}
    b = parse_root_flags(["--expose-pcie-roots", "false"])
    assert b.explicit == {"expose-pcie-roots": True} and b.positionals == ["false"]
    assert parse_root_flags(["--", "-v=1"]).positionals == ["-v=1"]
    assert parse_root_flags(["-h"]).help and parse_root_flags(["--help"]).help
    assert parse_root_flags(["--kubelet-root-dir="]).explicit == {"kubelet-root-dir": ""}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nope"], "flag provided but not defined: -nope"),
        (["--config"], "flag needs an argument: -config"),
        (["-v=x"], 'invalid value "x" for flag -v: parse error'),
        (["--expose-pcie-roots=maybe"], 'invalid boolean value "maybe" for -expose-pcie-roots'),
        (
            ["--cpu-device-mode=big"],
            'invalid value "big" for flag -cpu-device-mode: invalid value: "big", must be '
            "grouped or individual",
        ),
        (
            ["--group-by", "rack"],
            'invalid value "rack" for flag -group-by: invalid value: "rack", must be socket, '
            "numanode or machine",
        ),
        (["---v"], "bad flag syntax: ---v"),
    ],
)
def test_flag_errors(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError) as info:
        parse_root_flags(argv)
    assert str(info.value).startswith(message)


def test_usage_marks_exactly_five_deprecated_flags() -> None:
    text = " ".join(usage_text().split())  # the help is wrapped
    assert text.count("(DEPRECATED: prefer driverConfig field") == 5
    assert (
        '(DEPRECATED: prefer driverConfig field "reservedCPUs"; this flag will be removed in a '
        "future release)" in text
    )
    for line in ("dracpu [flags]", "dracpu gatherinfo [flags]", "dracpu introspect metrics"):
        assert line in text
    assert text.index("compatibility paths:") < text.index("dracpu-gatherinfo [flags]")


@settings(max_examples=150)
@given(st.text(max_size=80))
def test_arbitrary_file_content_only_raises_config_error(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_text(text)
    with contextlib.suppress(ConfigError):
        load_config(str(path), {})
