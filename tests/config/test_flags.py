"""Root flags with Go `flag` package semantics (behavior.md §2.2)."""

from __future__ import annotations

import pytest

from dracpu.flags import (
    ROOT_FLAGS,
    FlagError,
    FlagSpec,
    flag_spec,
    parse_bool,
    parse_flags,
    parse_int,
    parse_root_flags,
    usage_text,
)
from dracpu.gofmt import go_quote

DEPRECATION = (
    '(DEPRECATED: prefer driverConfig field "{key}"; this flag will be removed in a future release)'
)


def error_of(argv: list[str]) -> str:
    with pytest.raises(FlagError) as info:
        parse_root_flags(argv)
    return str(info.value)


# -- the flag table ------------------------------------------------------------------------


def test_root_flag_table() -> None:
    table = {s.name: (s.kind, s.default, s.config_key, s.deprecated) for s in ROOT_FLAGS}
    assert table == {
        "config": ("string", "", None, False),
        "kubeconfig": ("string", "", "kubeconfig", False),
        "bind-address": ("string", ":8080", "bindAddress", False),
        "debug-address": ("string", "127.0.0.1:8081", "debugAddress", False),
        "expose-pcie-roots": ("bool", False, "exposePCIeRoots", False),
        "kubelet-root-dir": ("string", "/var/lib/kubelet", "kubeletRootDir", False),
        "cpu-device-mode": ("enum", "grouped", "cpuDeviceMode", True),
        "group-by": ("enum", "numanode", "groupBy", True),
        "reserved-cpus": ("string", "", "reservedCPUs", True),
        "hostname-override": ("string", "", "hostnameOverride", True),
        "sysfs-overlay": ("string", "", "sysfsOverlay", True),
        "sysfs-root": ("string", "/sys", "sysfsRoot", False),
        "nri-socket": ("string", "/var/run/nri/nri.sock", "nriSocket", False),
        "cdi-dir": ("string", "/var/run/cdi", "cdiDir", False),
        "cgroup-root": ("string", "/sys/fs/cgroup", "cgroupRoot", False),
        "proc-root": ("string", "/proc", "procRoot", False),
        "state-dir": ("string", "/var/lib/dracpu", "stateDir", False),
        "log-format": ("enum", "text", "logFormat", False),
        "align-memory": ("bool", False, "alignMemory", False),
        "publish-isolated-cpus": ("bool", True, "publishIsolatedCPUs", False),
        "isolate-irqs": ("bool", False, "isolateIRQs", False),
        "claim-status": ("bool", True, "claimStatus", False),
        "v": ("int", 0, None, False),
        "vmodule": ("string", "", None, False),
    }
    assert flag_spec("group-by").choices == ("socket", "numanode", "machine")
    assert flag_spec("cpu-device-mode").choices == ("grouped", "individual")
    assert flag_spec("log-format").choices == ("text", "json")
    with pytest.raises(KeyError):
        flag_spec("node-name")


def test_exactly_the_five_deprecated_flags_carry_the_suffix() -> None:
    for spec in ROOT_FLAGS:
        suffix = DEPRECATION.format(key=spec.config_key)
        assert spec.help_text.endswith(suffix) is spec.deprecated
        assert spec.help_text == (f"{spec.help} {suffix}" if spec.deprecated else spec.help)


# -- accepted forms --------------------------------------------------------------------------


@pytest.mark.parametrize("dashes", ["-", "--"])
@pytest.mark.parametrize(
    ("form", "value"),
    [
        ("", True),
        ("=true", True),
        ("=false", False),
        ("=1", True),
        ("=0", False),
        ("=t", True),
        ("=f", False),
        ("=T", True),
        ("=F", False),
        ("=TRUE", True),
        ("=FALSE", False),
        ("=True", True),
        ("=False", False),
    ],
)
def test_bool_flag_forms(dashes: str, form: str, value: bool) -> None:
    parsed = parse_root_flags([f"{dashes}expose-pcie-roots{form}", "run"])
    assert parsed.explicit == {"expose-pcie-roots": value}
    assert parsed.positionals == ["run"]


def test_bool_flag_never_takes_the_next_argument() -> None:
    parsed = parse_root_flags(["--expose-pcie-roots", "false", "--v=3"])
    assert parsed.explicit == {"expose-pcie-roots": True}
    assert parsed.positionals == ["false", "--v=3"]


@pytest.mark.parametrize(
    ("argv", "explicit"),
    [
        (["-v=4"], {"v": 4}),
        (["--v", "4"], {"v": 4}),
        (["-v", "-1"], {"v": -1}),
        (["-v=+7"], {"v": 7}),
        (["-v=0x10"], {"v": 16}),
        (["-v=010"], {"v": 8}),
        (["-v=0o10"], {"v": 8}),
        (["-v=0b101"], {"v": 5}),
        (["-v=1_000"], {"v": 1000}),
        (["-v=9223372036854775807"], {"v": 9223372036854775807}),
        (["-vmodule=nri=4,allocation=6"], {"vmodule": "nri=4,allocation=6"}),
        (["--reserved-cpus", "0-3"], {"reserved-cpus": "0-3"}),
        (["--reserved-cpus=a=b"], {"reserved-cpus": "a=b"}),
        (["--hostname-override", "-odd"], {"hostname-override": "-odd"}),
        (["--kubelet-root-dir="], {"kubelet-root-dir": ""}),
        (["--kubelet-root-dir=/x", "--kubelet-root-dir="], {"kubelet-root-dir": ""}),
        (["-group-by=socket", "--group-by", "machine"], {"group-by": "machine"}),
        (["--cpu-device-mode=individual"], {"cpu-device-mode": "individual"}),
        (["--log-format", "json"], {"log-format": "json"}),
        (["--config", "/etc/dracpu/config.yaml"], {"config": "/etc/dracpu/config.yaml"}),
        (
            ["--sysfs-root=/host/sys", "--state-dir", "/tmp/s"],
            {"sysfs-root": "/host/sys", "state-dir": "/tmp/s"},
        ),
    ],
)
def test_value_flag_forms(argv: list[str], explicit: dict[str, object]) -> None:
    parsed = parse_root_flags(argv)
    assert parsed.explicit == explicit
    assert parsed.positionals == []
    assert not parsed.help


@pytest.mark.parametrize(
    ("argv", "explicit", "positionals"),
    [
        (["introspect", "-v=2"], {}, ["introspect", "-v=2"]),
        (["-v=1", "introspect", "metrics", "--v=2"], {"v": 1}, ["introspect", "metrics", "--v=2"]),
        (["--", "-v=1"], {}, ["-v=1"]),
        (["-v=1", "--", "--", "x"], {"v": 1}, ["--", "x"]),
        (["-", "-v=1"], {}, ["-", "-v=1"]),
        (["", "-v=1"], {}, ["", "-v=1"]),
        ([], {}, []),
    ],
)
def test_parsing_stops_at_the_first_positional_or_after_double_dash(
    argv: list[str], explicit: dict[str, object], positionals: list[str]
) -> None:
    parsed = parse_root_flags(argv)
    assert (parsed.explicit, parsed.positionals) == (explicit, positionals)


@pytest.mark.parametrize("argv", [["-h"], ["--help"], ["-help=x"], ["-v=2", "-h", "--nope"]])
def test_help_request(argv: list[str]) -> None:
    parsed = parse_root_flags(argv)
    assert parsed.help
    assert parsed.positionals == []


@pytest.mark.parametrize("argv", [["--version"], ["-version"], ["-v=2", "--version", "--nope"]])
def test_version_request(argv: list[str]) -> None:
    parsed = parse_root_flags(argv)
    assert parsed.version and not parsed.help
    assert parsed.positionals == []


def test_version_takes_no_value() -> None:
    with pytest.raises(FlagError, match=r"^flag -version takes no value: --version=true$"):
        parse_root_flags(["--version=true"])


def test_config_values_keep_only_config_fields() -> None:
    parsed = parse_root_flags(
        ["--config=/c.yaml", "-v=3", "-vmodule=x=1", "--group-by=socket", "--cdi-dir=/cdi"]
    )
    assert parsed.config_values() == {"groupBy": "socket", "cdiDir": "/cdi"}


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nope"], "flag provided but not defined: -nope"),
        (["-node-name=x"], "flag provided but not defined: -node-name"),
        (["--config"], "flag needs an argument: -config"),
        (["-v"], "flag needs an argument: -v"),
        (["--group-by"], "flag needs an argument: -group-by"),
        (["-v=x"], 'invalid value "x" for flag -v: parse error'),
        (["-v", "4.5"], 'invalid value "4.5" for flag -v: parse error'),
        (["-v="], 'invalid value "" for flag -v: parse error'),
        (["-v= 4"], 'invalid value " 4" for flag -v: parse error'),
        (["-v=08"], 'invalid value "08" for flag -v: parse error'),
        (["-v=1__0"], 'invalid value "1__0" for flag -v: parse error'),
        (
            ["-v=9223372036854775808"],
            'invalid value "9223372036854775808" for flag -v: value out of range',
        ),
        (
            ["--expose-pcie-roots=maybe"],
            'invalid boolean value "maybe" for -expose-pcie-roots: parse error',
        ),
        (
            ["--expose-pcie-roots=yes"],
            'invalid boolean value "yes" for -expose-pcie-roots: parse error',
        ),
        (["--expose-pcie-roots="], 'invalid boolean value "" for -expose-pcie-roots: parse error'),
        (
            ["--cpu-device-mode=big"],
            'invalid value "big" for flag -cpu-device-mode: invalid value: "big", must be grouped '
            "or individual",
        ),
        (
            ["--group-by", "rack"],
            'invalid value "rack" for flag -group-by: invalid value: "rack", must be socket, '
            "numanode or machine",
        ),
        (
            ["--group-by", "NUMA\n"],
            'invalid value "NUMA\\n" for flag -group-by: invalid value: "NUMA\\n", must be socket, '
            "numanode or machine",
        ),
        (
            ["--log-format=xml"],
            'invalid value "xml" for flag -log-format: invalid value: "xml", must be text or json',
        ),
        (["---v"], "bad flag syntax: ---v"),
        (["-=v"], "bad flag syntax: -=v"),
        (["--=v"], "bad flag syntax: --=v"),
        (["-v=1", "--nope", "-h"], "flag provided but not defined: -nope"),
    ],
)
def test_flag_errors(argv: list[str], message: str) -> None:
    assert error_of(argv) == message


# -- Go building blocks --------------------------------------------------------------------------


def test_parse_bool_and_int() -> None:
    assert [parse_bool(t) for t in ("1", "t", "T", "TRUE", "true", "True")] == [True] * 6
    assert [parse_bool(t) for t in ("0", "f", "F", "FALSE", "false", "False")] == [False] * 6
    for bad in ("yes", "on", "tRUE", " true", ""):
        with pytest.raises(ValueError, match=r"^parse error$"):
            parse_bool(bad)
    assert parse_int("-9223372036854775808") == -(1 << 63)
    assert parse_int("0X_1f") == 31
    assert parse_int("00") == 0
    for bad in ("_1", "1_", "0x", "0b2", "1e3", "--1", "\u0661"):
        with pytest.raises(ValueError, match=r"^parse error$"):
            parse_int(bad)
    with pytest.raises(ValueError, match=r"^value out of range$"):
        parse_int("-9223372036854775809")


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("plain", '"plain"'),
        ("", '""'),
        ('a"b\\c', '"a\\"b\\\\c"'),
        ("tab\there\r\n", '"tab\\there\\r\\n"'),
        ("\x00\x1f\x7f", '"\\x00\\x1f\\x7f"'),
        ("héllo ☃", '"héllo ☃"'),
        ("\u200b\u2028", '"\\u200b\\u2028"'),
        ("\U000e0001", '"\\U000e0001"'),
        (b"\xff".decode("utf-8", "surrogateescape"), '"\\xff"'),
    ],
)
def test_go_quote(text: str, quoted: str) -> None:
    assert go_quote(text) == quoted


def test_parse_flags_over_another_flag_set() -> None:
    specs = (
        FlagSpec("output-dir", "string", "", None, "where"),
        FlagSpec("stdout", "bool", False, None, "to stdout"),
    )
    parsed = parse_flags(["--stdout", "--output-dir", "/tmp/x", "extra"], specs)
    assert parsed.explicit == {"stdout": True, "output-dir": "/tmp/x"}
    assert parsed.positionals == ["extra"]
    with pytest.raises(FlagError, match=r"^flag provided but not defined: -v$"):
        parse_flags(["-v=1"], specs)


# -- usage ----------------------------------------------------------------------------------------


def test_usage_text_sections_and_commands() -> None:
    # The daemon's help reads like every subcommand's argparse help.
    text = usage_text()
    lines = text.splitlines()
    assert lines[0] == "usage: dracpu [run] [flags]"
    commands = lines.index("commands:")
    usage = lines[commands + 1 : lines.index("", commands)]
    assert [line.split("  ")[1].strip() for line in usage] == [
        "dracpu [flags]",
        "dracpu run [flags]",
        "dracpu gatherinfo [flags]",
        "dracpu introspect metrics",
        "dracpu introspect topology [flags]",
        "dracpu introspect slices [flags]",
        "dracpu introspect allocate [flags]",
        "dracpu demo [flags]",
        "dracpu sim apiserver [flags]",
        "dracpu sim runtime [flags]",
        "dracpu sim fleet [flags]",
        "dracpu map [flags]",
        "dracpu version",
        "dracpu --version",
    ]
    compat = lines.index("compatibility paths:")
    assert lines[compat + 1].startswith("  dracpu-gatherinfo [flags]  ")
    assert lines.index("daemon flags:") > compat
    assert lines.index("example:") > lines.index("daemon flags:")
    assert "-flag and --flag are the same flag" in " ".join(lines)
    assert text.endswith("\n")


def _flag_entries(text: str) -> dict[str, str]:
    """``--name METAVAR`` -> its help, joined over the wrapped lines."""
    lines = text.splitlines()
    body = lines[lines.index("daemon flags:") + 1 :]
    body = body[: body.index("")]
    entries: dict[str, str] = {}
    head = ""
    for line in body:
        if line.startswith("  --"):
            head, _, rest = line[2:].partition("  ")
            entries[head] = rest.strip()
        else:
            entries[head] = f"{entries[head]} {line.strip()}".strip()
    return entries


def test_usage_flag_list_is_sorted_with_defaults() -> None:
    text = usage_text()
    entries = _flag_entries(text)
    heads = list(entries)
    assert heads == sorted(heads)
    assert len(heads) == len(ROOT_FLAGS)
    assert "--expose-pcie-roots" in heads
    assert "--group-by {socket,numanode,machine}" in heads and "--v N" in heads
    assert "--bind-address ADDRESS" in heads
    joined = " ".join(entries.values())
    assert joined.count("(DEPRECATED: prefer driverConfig field") == 5
    for key in ("cpuDeviceMode", "groupBy", "reservedCPUs", "hostnameOverride", "sysfsOverlay"):
        assert DEPRECATION.format(key=key) in joined
    assert entries["--bind-address ADDRESS"].endswith('(default ":8080")')
    assert entries["--group-by {socket,numanode,machine}"].endswith(
        f"{DEPRECATION.format(key='groupBy')} (default numanode)"
    )
    assert entries["--log-format {text,json}"].endswith("(default text)")
    # Zero defaults are not shown, as in Go.
    assert "(default" not in entries["--v N"]
    assert "(default" not in entries["--config FILE"]
    assert "(default" not in entries["--expose-pcie-roots"]
