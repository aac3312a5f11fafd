"""Config layering, file processing and validation (behavior.md §3.1-§3.3)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dracpu.config import ConfigError, DriverConfig, go_clean_path, load_config
from dracpu.flags import parse_root_flags

EXAMPLE = """\
apiVersion: v1alpha1
cpuDeviceMode: grouped
groupBy: numanode
reservedCPUs: "0-1"
publishNodeAllocatableResourceMapping: false
"""


@pytest.fixture
def cfg_file(tmp_path: Path) -> Path:
    return tmp_path / "config.yaml"


def load_text(path: Path, text: str, explicit: dict[str, object] | None = None) -> DriverConfig:
    path.write_text(text)
    return load_config(str(path), explicit or {})


def error_of(path: Path, text: str, explicit: dict[str, object] | None = None) -> str:
    """The error for `text`, with the file path written as P."""
    with pytest.raises(ConfigError) as info:
        load_text(path, text, explicit)
    return str(info.value).replace(str(path), "P")


def test_defaults_of_every_field() -> None:
    assert load_config("", {}) == DriverConfig(
        kubeconfig="",
        hostnameOverride="",
        bindAddress=":8080",
        reservedCPUs="",
        cpuDeviceMode="grouped",
        groupBy="numanode",
        exposePCIeRoots=False,
        sysfsOverlay="",
        kubeletRootDir="/var/lib/kubelet",
        publishNodeAllocatableResourceMapping=False,
        sysfsRoot="/sys",
        nriSocket="/var/run/nri/nri.sock",
        cdiDir="/var/run/cdi",
        cgroupRoot="/sys/fs/cgroup",
        stateDir="/var/lib/dracpu",
        debugAddress="127.0.0.1:8081",
        logFormat="text",
    )


def test_example_config_of_the_spec(cfg_file: Path) -> None:
    assert load_text(cfg_file, EXAMPLE) == DriverConfig(reservedCPUs="0-1")


def test_every_file_settable_field(cfg_file: Path) -> None:
    cfg = load_text(
        cfg_file,
        "kubeconfig: /k\nhostnameOverride: node-a\nreservedCPUs: '0'\ncpuDeviceMode: individual\n"
        "groupBy: socket\nsysfsOverlay: /o.yaml\npublishNodeAllocatableResourceMapping: true\n",
    )
    assert cfg == DriverConfig(
        kubeconfig="/k",
        hostnameOverride="node-a",
        reservedCPUs="0",
        cpuDeviceMode="individual",
        groupBy="socket",
        sysfsOverlay="/o.yaml",
        publishNodeAllocatableResourceMapping=True,
    )


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n", "~\n", "null\n"])
def test_empty_file_is_an_empty_layer(cfg_file: Path, text: str) -> None:
    assert load_text(cfg_file, text) == DriverConfig()


def test_null_values_change_nothing(cfg_file: Path) -> None:
    cfg = load_text(
        cfg_file, "reservedCPUs: ~\nkubeconfig:\ngroupBy: null\n", {"group-by": "socket"}
    )
    assert cfg == DriverConfig(groupBy="socket")


# -- precedence (§3.2) ----------------------------------------------------------------------


def test_flag_wins_only_when_set(cfg_file: Path) -> None:
    text = "groupBy: socket\nreservedCPUs: '0'\nhostnameOverride: from-file\n"
    assert load_text(cfg_file, text) == DriverConfig(
        groupBy="socket", reservedCPUs="0", hostnameOverride="from-file"
    )
    parsed = parse_root_flags([f"--config={cfg_file}", "--group-by=machine", "-v=3"])
    cfg = load_config(str(cfg_file), parsed.explicit)
    assert cfg == DriverConfig(groupBy="machine", reservedCPUs="0", hostnameOverride="from-file")


def test_flag_equal_to_the_default_still_wins(cfg_file: Path) -> None:
    cfg = load_text(cfg_file, "groupBy: socket\n", {"group-by": "numanode"})
    assert cfg.groupBy == "numanode"


def test_explicit_accepts_config_keys_and_flag_names(cfg_file: Path) -> None:
    by_key = load_text(cfg_file, "groupBy: socket\n", {"groupBy": "machine", "sysfsRoot": "/h"})
    by_flag = load_config(str(cfg_file), {"group-by": "machine", "sysfs-root": "/h"})
    assert by_key == by_flag == DriverConfig(groupBy="machine", sysfsRoot="/h")


def test_non_config_flags_are_ignored_by_the_flag_layer() -> None:
    assert load_config("", {"config": "", "v": 9, "vmodule": "x=1"}) == DriverConfig()


def test_flag_only_fields_come_from_flags() -> None:
    parsed = parse_root_flags(
        [
            "--sysfs-root=/host/sys",
            "--nri-socket=/run/nri.sock",
            "--cdi-dir=/run/cdi",
            "--cgroup-root=/host/cgroup",
            "--state-dir=/tmp/state",
            "--debug-address=127.0.0.1:0",
            "--log-format=json",
            "--bind-address=:9000",
            "--expose-pcie-roots",
        ]
    )
    assert load_config("", parsed.explicit) == DriverConfig(
        sysfsRoot="/host/sys",
        nriSocket="/run/nri.sock",
        cdiDir="/run/cdi",
        cgroupRoot="/host/cgroup",
        stateDir="/tmp/state",
        debugAddress="127.0.0.1:0",
        logFormat="json",
        bindAddress=":9000",
        exposePCIeRoots=True,
    )


@pytest.mark.parametrize(
    ("explicit", "message"),
    [
        (
            {"exposePCIeRoots": "yes"},
            "cannot apply flags: applying config map: json: cannot unmarshal string into field "
            "exposePCIeRoots of type bool",
        ),
        (
            {"reserved-cpus": 3},
            "cannot apply flags: applying config map: json: cannot unmarshal number into field "
            "reservedCPUs of type string",
        ),
        (
            {"nodeName": "x"},
            'cannot apply flags: applying config map: json: unknown field "nodeName"',
        ),
    ],
)
def test_flag_layer_errors(explicit: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("", explicit)
    assert str(info.value) == message


# -- file errors (§3.3 steps 2-8) -----------------------------------------------------------


def test_missing_file() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("/nonexistent/c.yaml", {})
    assert str(info.value) == (
        "cannot apply /nonexistent/c.yaml: reading /nonexistent/c.yaml: open "
        "/nonexistent/c.yaml: no such file or directory"
    )


def test_directory_as_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path), {})
    assert (
        str(info.value)
        == f"cannot apply {tmp_path}: reading {tmp_path}: read {tmp_path}: is a directory"
    )


def test_invalid_utf8(cfg_file: Path) -> None:
    cfg_file.write_bytes(b"kubeconfig: \xff\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(cfg_file), {})
    assert (
        str(info.value)
        == f"cannot apply {cfg_file}: parsing {cfg_file}: invalid UTF-8 at byte offset 12"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: 1\na: 2\n", "cannot apply P: parsing P: duplicate key 'a' (line 2, column 1)"),
        (
            "groupBy: socket\nreservedCPUs: '0'\ngroupBy: machine\n",
            "cannot apply P: parsing P: duplicate key 'groupBy' (line 3, column 1)",
        ),
        (
            "x:\n  c: 1\n  c: 2\n",
            "cannot apply P: parsing P: duplicate key 'c' (line 3, column 3)",
        ),
        (
            "a: [\n",
            "cannot apply P: parsing P: while parsing a flow node, expected the node content, but "
            "found '<stream end>' (line 2, column 1)",
        ),
        (
            "a: 1\n---\nb: 2\n",
            "cannot apply P: parsing P: expected a single document in the stream, but found "
            "another document (line 2, column 1)",
        ),
        (
            "\x01: 1\n",
            "cannot apply P: parsing P: unacceptable character #x0001: special characters are not "
            "allowed (position 0)",
        ),
        (
            "? [a]\n: 1\n",
            "cannot apply P: parsing P: while constructing a mapping, found unhashable key (line "
            "1, column 3)",
        ),
        (
            "a: !!bool maybe\n",
            "cannot apply P: parsing P: cannot decode 'maybe' as a bool (line 1, column 4)",
        ),
        ("- a\n", "cannot apply P: parsing P: the top level must be a mapping, got array"),
        ("just text\n", "cannot apply P: parsing P: the top level must be a mapping, got string"),
        ("42\n", "cannot apply P: parsing P: the top level must be a mapping, got number"),
    ],
)
def test_parse_errors(cfg_file: Path, text: str, message: str) -> None:
    assert error_of(cfg_file, text) == message


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("apiVersion: v2\n", "v2"),
        ("apiVersion: 3\n", ""),
        ("apiVersion: ~\n", ""),
        ("apiVersion: ''\n", ""),
    ],
)
def test_api_version(cfg_file: Path, text: str, shown: str) -> None:
    assert (
        error_of(cfg_file, text)
        == f'cannot apply P: unsupported apiVersion "{shown}", want "v1alpha1"'
    )


def test_api_version_is_checked_before_key_spelling(cfg_file: Path) -> None:
    assert error_of(cfg_file, "apiVersion: v0\ngroupby: x\n") == (
        'cannot apply P: unsupported apiVersion "v0", want "v1alpha1"'
    )
    assert error_of(cfg_file, "ApiVersion: v1alpha1\n") == (
        'cannot apply P: field "ApiVersion" is spelled differently from the schema; '
        'use "apiVersion"'
    )


def test_case_folded_keys_exact_example(cfg_file: Path) -> None:
    text = "reservedcpus: '1'\ngroupby: socket\ncpudevicemode: grouped\n"
    assert error_of(cfg_file, text) == (
        'cannot apply P: field "cpudevicemode" is spelled differently from the schema; use '
        '"cpuDeviceMode"; field "groupby" is spelled differently from the schema; use "groupBy"; '
        'field "reservedcpus" is spelled differently from the schema; use "reservedCPUs"'
    )


def test_case_folded_excluded_and_unicode_folding(cfg_file: Path) -> None:
    text = "BINDADDRESS: ':1'\n\u212aubeconfig: x\nSysfsRoot: /s\nzzz: 1\n"
    assert error_of(cfg_file, text) == (
        'cannot apply P: field "BINDADDRESS" is not configurable via the config file; use '
        "--bind-address instead (and move the DaemonSet's healthz port with it); "
        'field "SysfsRoot" is not configurable via the config '
        'file; use --sysfs-root instead; field "\u212aubeconfig" is spelled differently from the '
        'schema; use "kubeconfig"'
    )


UPSTREAM_EXCLUDED = [
    (
        "bindAddress: ':1'\n",
        "bindAddress",
        "use --bind-address instead (and move the DaemonSet's healthz port with it)",
    ),
    ("exposePCIeRoots: true\n", "exposePCIeRoots", "use --expose-pcie-roots instead"),
    (
        "kubeletRootDir: /x\n",
        "kubeletRootDir",
        "use --kubelet-root-dir instead",
    ),
]
FLAG_ONLY_EXCLUDED = [
    (f"{key}: x\n", key, f"use --{flag} instead")
    for key, flag in [
        ("sysfsRoot", "sysfs-root"),
        ("nriSocket", "nri-socket"),
        ("cdiDir", "cdi-dir"),
        ("cgroupRoot", "cgroup-root"),
        ("stateDir", "state-dir"),
        ("debugAddress", "debug-address"),
        ("logFormat", "log-format"),
    ]
]


@pytest.mark.parametrize(("text", "key", "hint"), UPSTREAM_EXCLUDED + FLAG_ONLY_EXCLUDED)
def test_excluded_fields(cfg_file: Path, text: str, key: str, hint: str) -> None:
    assert error_of(cfg_file, text) == (
        f'cannot apply P: field "{key}" is not configurable via the config file; {hint}'
    )


def test_first_excluded_field_in_sorted_order_wins(cfg_file: Path) -> None:
    text = "stateDir: /s\nkubeletRootDir: /k\nexposePCIeRoots: true\n"
    assert error_of(cfg_file, text) == (
        'cannot apply P: field "exposePCIeRoots" is not configurable via the config file; use '
        "--expose-pcie-roots instead"
    )


@pytest.mark.parametrize(
    ("text", "inner"),
    [
        ("showMetrics: true\n", 'json: unknown field "showMetrics"'),
        ("nodeName: n\n", 'json: unknown field "nodeName"'),
        ("1: x\n", 'json: unknown field "1"'),
        ("yes: x\n", 'json: unknown field "true"'),
        (
            "reservedCPUs: 0\n",
            "json: cannot unmarshal number into field reservedCPUs of type string",
        ),
        (
            "reservedCPUs: 0x1F\n",
            "json: cannot unmarshal number into field reservedCPUs of type string",
        ),
        (
            "reservedCPUs: 1_000\n",
            "json: cannot unmarshal number into field reservedCPUs of type string",
        ),
        (
            "reservedCPUs: 1.5\n",
            "json: cannot unmarshal number into field reservedCPUs of type string",
        ),
        (
            "reservedCPUs: 1e3\n",
            "json: cannot unmarshal number into field reservedCPUs of type string",
        ),
        (
            "reservedCPUs: [0, 1]\n",
            "json: cannot unmarshal array into field reservedCPUs of type string",
        ),
        (
            "kubeconfig: {a: 1}\n",
            "json: cannot unmarshal object into field kubeconfig of type string",
        ),
        (
            "hostnameOverride: yes\n",
            "json: cannot unmarshal bool into field hostnameOverride of type string",
        ),
        (
            "hostnameOverride: y\n",
            "json: cannot unmarshal bool into field hostnameOverride of type string",
        ),
        (
            "sysfsOverlay: off\n",
            "json: cannot unmarshal bool into field sysfsOverlay of type string",
        ),
        (
            'publishNodeAllocatableResourceMapping: "true"\n',
            "json: cannot unmarshal string into field publishNodeAllocatableResourceMapping "
            "of type bool",
        ),
        (
            "publishNodeAllocatableResourceMapping: 1\n",
            "json: cannot unmarshal number into field publishNodeAllocatableResourceMapping "
            "of type bool",
        ),
        # Sorted key order: the first problem is the one reported.
        (
            "zzz: 1\nreservedCPUs: 0\nalpha: 1\n",
            'json: unknown field "alpha"',
        ),
        (
            "zzz: 1\nreservedCPUs: 0\n",
            "json: cannot unmarshal number into field reservedCPUs of type string",
        ),
    ],
)
def test_decode_errors(cfg_file: Path, text: str, inner: str) -> None:
    assert error_of(cfg_file, text) == f"cannot apply P: applying config map: {inner}"


@pytest.mark.parametrize(("value", "shown"), [(".nan", "NaN"), (".inf", "+Inf"), ("-.INF", "-Inf")])
def test_non_finite_numbers_cannot_be_marshaled(cfg_file: Path, value: str, shown: str) -> None:
    assert error_of(cfg_file, f"zzz: [{value}]\n") == (
        f"cannot apply P: marshaling config map: json: unsupported value: {shown}"
    )


def test_non_finite_number_inside_a_cyclic_value(cfg_file: Path) -> None:
    assert error_of(cfg_file, "zzz: &a [*a, {b: [.NaN]}]\n") == (
        "cannot apply P: marshaling config map: json: unsupported value: NaN"
    )


@pytest.mark.parametrize("depth", [100, 1000])
def test_deeply_nested_document(cfg_file: Path, depth: int) -> None:
    # The limit is the config's own, not the interpreter's recursion limit (which libraries
    # such as cel-python raise).
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)
    try:
        assert error_of(cfg_file, "a: " + "[" * depth + "]" * depth + "\n") == (
            "cannot apply P: parsing P: the document is nested too deeply (more than 100 levels)"
        )
    finally:
        sys.setrecursionlimit(old)


def test_nesting_up_to_the_limit_is_parsed(cfg_file: Path) -> None:
    depth = 99  # plus the top-level mapping: exactly the limit
    assert error_of(cfg_file, "a: " + "[" * depth + "]" * depth + "\n") == (
        'cannot apply P: applying config map: json: unknown field "a"'
    )


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("on", True),
        ("On", True),
        ("ON", True),
        ("yes", True),
        ("Yes", True),
        ("y", True),
        ("Y", True),
        ("true", True),
        ("off", False),
        ("no", False),
        ("NO", False),
        ("n", False),
        ("False", False),
    ],
)
def test_yaml_11_booleans(cfg_file: Path, literal: str, value: bool) -> None:
    cfg = load_text(cfg_file, f"publishNodeAllocatableResourceMapping: {literal}\n")
    assert cfg.publishNodeAllocatableResourceMapping is value


@pytest.mark.parametrize(
    "literal",
    [
        "2001-12-14",
        "1:30",
        "=",
        "0xFFFFFFFFFFFFFFFFFF",
        "1e400",
        "'7'",
        '"on"',
        "!!str 12",
        "tRUE",
        ".x",
    ],
)
def test_scalars_go_yaml_reads_as_strings(cfg_file: Path, literal: str) -> None:
    cfg = load_text(cfg_file, f"kubeconfig: {literal}\n")
    expected = literal.strip("'\"").removeprefix("!!str ")
    assert cfg.kubeconfig == expected


def test_binary_and_merge_keys(cfg_file: Path) -> None:
    cfg = load_text(cfg_file, "kubeconfig: !!binary L2s=\n")
    assert cfg.kubeconfig == "/k"
    cfg = load_text(cfg_file, "<<: {groupBy: socket, reservedCPUs: '1'}\nreservedCPUs: '2'\n")
    assert (cfg.groupBy, cfg.reservedCPUs) == ("socket", "2")


# -- cleaning and validation (§3.3 step 9) ---------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "cleaned"),
    [
        ("/mnt/a/../kubelet//", "/mnt/kubelet"),
        ("//var/lib/kubelet", "/var/lib/kubelet"),
        ("///x/./y/", "/x/y"),
        ("/", "/"),
        ("/..", "/"),
        ("a/../../b", "../b"),
    ],
)
def test_go_clean_path(raw: str, cleaned: str) -> None:
    assert go_clean_path(raw) == cleaned


def test_kubelet_root_dir_is_cleaned() -> None:
    cfg = load_config("", {"kubelet-root-dir": "/mnt/a/../kubelet//"})
    assert cfg.kubeletRootDir == "/mnt/kubelet"


def test_empty_kubelet_root_dir_after_a_non_empty_one() -> None:
    parsed = parse_root_flags(["--kubelet-root-dir=/mnt/kubelet", "--kubelet-root-dir="])
    with pytest.raises(ConfigError) as info:
        load_config("", parsed.explicit)
    assert str(info.value) == "cannot validate config: invalid kubeletRootDir: must not be empty"


@pytest.mark.parametrize(
    ("explicit", "text", "message"),
    [
        (
            {},
            "cpuDeviceMode: fancy\n",
            'invalid cpuDeviceMode "fancy": must be "grouped" or "individual"',
        ),
        ({}, "cpuDeviceMode: ''\n", 'invalid cpuDeviceMode "": must be "grouped" or "individual"'),
        (
            {},
            "groupBy: rack\n",
            'invalid groupBy "rack": must be "socket", "numanode", or "machine"',
        ),
        (
            {},
            "groupBy: NUMANODE\n",
            'invalid groupBy "NUMANODE": must be "socket", "numanode", or "machine"',
        ),
        # mode is checked before groupBy, groupBy before the kubelet root
        (
            {"kubelet-root-dir": ""},
            "cpuDeviceMode: x\ngroupBy: z\n",
            'invalid cpuDeviceMode "x": must be "grouped" or "individual"',
        ),
        (
            {"kubelet-root-dir": ""},
            "groupBy: z\n",
            'invalid groupBy "z": must be "socket", "numanode", or "machine"',
        ),
        (
            {"kubelet-root-dir": "var/lib"},
            "",
            'invalid kubeletRootDir "var/lib": must be an absolute path',
        ),
        (
            {"kubelet-root-dir": "./a/../b/"},
            "",
            'invalid kubeletRootDir "b": must be an absolute path',
        ),
        ({"logFormat": "xml"}, "", 'invalid logFormat "xml": must be "text" or "json"'),
    ],
)
def test_validation(cfg_file: Path, explicit: dict[str, object], text: str, message: str) -> None:
    assert error_of(cfg_file, text, explicit) == f"cannot validate config: {message}"


def test_validation_runs_without_a_file() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("", {"kubeletRootDir": "rel"})
    assert (
        str(info.value)
        == 'cannot validate config: invalid kubeletRootDir "rel": must be an absolute path'
    )


def test_bogus_group_by_is_ignored_in_individual_mode(cfg_file: Path) -> None:
    cfg = load_text(cfg_file, "cpuDeviceMode: individual\ngroupBy: rack\n")
    assert (cfg.cpuDeviceMode, cfg.groupBy) == ("individual", "rack")
