"""Root flags of `dracpu` with Go `flag` package semantics.

The Go driver parses its command line with the standard `flag` package, and operators'
manifests are written against that: `-x` and `--x` are the same flag; a value flag takes
`-x=v` or the next argument; a bool flag is `-x` or `-x=false` and never takes the next
argument; parsing stops at the first non-flag argument or after `--`. Error texts are Go's,
so a log line reads the same whichever implementation produced it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from dracpu.gofmt import go_quote

__all__ = [
    "COMMANDS",
    "ROOT_FLAGS",
    "FlagError",
    "FlagSpec",
    "ParsedFlags",
    "flag_spec",
    "go_int_literal",
    "parse_bool",
    "parse_flags",
    "parse_int",
    "parse_root_flags",
    "usage_text",
]

FlagKind = Literal["string", "bool", "int", "enum"]

# strconv.ParseBool accepts exactly these spellings.
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})

# strconv.ParseInt(s, 0, 64): Go integer literal syntax, underscores only between digits
# or right after a base prefix.
_GO_INT = re.compile(
    r"[+-]?(?:0[xX](?:_?[0-9a-fA-F])+|0[bB](?:_?[01])+|0[oO](?:_?[0-7])+|0(?:_?[0-7])*"
    r"|[1-9](?:_?[0-9])*)"
)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class FlagError(ValueError):
    """A command-line flag could not be parsed; the message is Go's wording."""


def parse_bool(text: str) -> bool:
    """strconv.ParseBool; ValueError("parse error") like the flag package reports it."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("parse error")


def go_int_literal(text: str) -> int | None:
    """The value of a Go integer literal as strconv.ParseInt(text, 0, _) reads it, or None."""
    if _GO_INT.fullmatch(text) is None:
        return None
    sign = -1 if text[0] == "-" else 1
    digits = text.lstrip("+-").replace("_", "")
    prefix = digits[:2].lower()
    if prefix in ("0x", "0b", "0o"):
        return sign * int(digits[2:], {"0x": 16, "0b": 2, "0o": 8}[prefix])
    if len(digits) > 1 and digits[0] == "0":
        return sign * int(digits[1:], 8)  # Go reads a leading 0 as octal
    return sign * int(digits)


def parse_int(text: str) -> int:
    """strconv.ParseInt(text, 0, 64) with the flag package's two error texts."""
    value = go_int_literal(text)
    if value is None:
        raise ValueError("parse error")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError("value out of range")
    return value


def _either(words: Sequence[str]) -> str:
    """`a, b or c`: how the Go driver's enum flags list their values."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


@dataclass(frozen=True, slots=True)
class FlagSpec:
    """One flag: how it parses, its default, and which config key it feeds (if any)."""

    name: str
    kind: FlagKind
    default: object
    config_key: str | None
    help: str
    deprecated: bool = False
    choices: tuple[str, ...] = ()

    @property
    def help_text(self) -> str:
        if not self.deprecated:
            return self.help
        return (
            f"{self.help} (DEPRECATED: prefer driverConfig field {go_quote(self.config_key or '')}"
            "; this flag will be removed in a future release)"
        )

    def convert(self, value: str) -> object:
        """The flag.Value Set step: text → typed value, or FlagError in Go's wording."""
        if self.kind == "bool":
            try:
                return parse_bool(value)
            except ValueError as err:
                raise FlagError(
                    f"invalid boolean value {go_quote(value)} for -{self.name}: {err}"
                ) from None
        if self.kind == "int":
            try:
                return parse_int(value)
            except ValueError as err:
                raise FlagError(
                    f"invalid value {go_quote(value)} for flag -{self.name}: {err}"
                ) from None
        if self.kind == "enum" and value not in self.choices:
            raise FlagError(
                f"invalid value {go_quote(value)} for flag -{self.name}: invalid value: "
                f"{go_quote(value)}, must be {_either(self.choices)}"
            )
        return value


ROOT_FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec("config", "string", "", None, "path of the YAML driver config file; empty = none"),
    FlagSpec(
        "kubeconfig",
        "string",
        "",
        "kubeconfig",
        "path of a kubeconfig file; empty = the in-cluster service account",
    ),
    FlagSpec(
        "bind-address",
        "string",
        ":8080",
        "bindAddress",
        "listen address of the HTTP server for /healthz, /readyz and /metrics",
    ),
    FlagSpec(
        "debug-address",
        "string",
        "127.0.0.1:8081",
        "debugAddress",
        "listen address of the HTTP server for /debug/state; keep it on loopback",
    ),
    FlagSpec(
        "expose-pcie-roots",
        "bool",
        False,
        "exposePCIeRoots",
        "publish the resource.kubernetes.io/pcieRoot attribute on CPU devices (needs the "
        "DRAListTypeAttributes feature gate in the cluster)",
    ),
    FlagSpec(
        "kubelet-root-dir",
        "string",
        "/var/lib/kubelet",
        "kubeletRootDir",
        "the kubelet's --root-dir; the plugin sockets live in <root>/plugins_registry and "
        "<root>/plugins/dra.cpu",
    ),
    FlagSpec(
        "cpu-device-mode",
        "enum",
        "grouped",
        "cpuDeviceMode",
        "how CPUs become devices: 'grouped' publishes one device per group (see --group-by), "
        "'individual' one device per CPU",
        deprecated=True,
        choices=("grouped", "individual"),
    ),
    FlagSpec(
        "group-by",
        "enum",
        "numanode",
        "groupBy",
        "in grouped mode, what one device covers: 'socket', 'numanode' or 'machine' (machine "
        "needs the claim to carry an opaque cpuset config)",
        deprecated=True,
        choices=("socket", "numanode", "machine"),
    ),
    FlagSpec(
        "reserved-cpus",
        "string",
        "",
        "reservedCPUs",
        "cpuset (Linux list format) kept out of the published devices",
        deprecated=True,
    ),
    FlagSpec(
        "hostname-override",
        "string",
        "",
        "hostnameOverride",
        "name of this node; empty = $NODE_NAME, else the OS hostname",
        deprecated=True,
    ),
    FlagSpec(
        "sysfs-overlay",
        "string",
        "",
        "sysfsOverlay",
        "path of a YAML file of sysfs file contents that replace the real ones",
        deprecated=True,
    ),
    FlagSpec("sysfs-root", "string", "/sys", "sysfsRoot", "where sysfs is mounted"),
    FlagSpec(
        "nri-socket",
        "string",
        "/var/run/nri/nri.sock",
        "nriSocket",
        "the container runtime's NRI socket",
    ),
    FlagSpec("cdi-dir", "string", "/var/run/cdi", "cdiDir", "directory for the CDI spec files"),
    FlagSpec(
        "cgroup-root",
        "string",
        "/sys/fs/cgroup",
        "cgroupRoot",
        "where the cgroup filesystem is mounted",
    ),
    FlagSpec(
        "proc-root",
        "string",
        "/proc",
        "procRoot",
        "where procfs is mounted (the boot id, /proc/irq); /proc means $HOST_ROOT/proc",
    ),
    FlagSpec(
        "state-dir",
        "string",
        "/var/lib/dracpu",
        "stateDir",
        "directory of the allocation checkpoint",
    ),
    FlagSpec(
        "log-format",
        "enum",
        "text",
        "logFormat",
        "log line format: 'text' (klog style) or 'json'",
        choices=("text", "json"),
    ),
    FlagSpec(
        "align-memory",
        "bool",
        False,
        "alignMemory",
        "also set cpuset.mems of claim holders to the NUMA nodes of their CPUs",
    ),
    FlagSpec(
        "publish-isolated-cpus",
        "bool",
        True,
        "publishIsolatedCPUs",
        "publish the CPUs the kernel isolates (isolcpus=) as devices claims can get; "
        "they are never in the shared pool either way",
    ),
    FlagSpec(
        "isolate-irqs",
        "bool",
        False,
        "isolateIRQs",
        "keep device interrupts off the CPUs of every prepared claim (without it, only "
        "claims whose allocation options say isolateIRQs: true)",
    ),
    FlagSpec(
        "claim-status",
        "bool",
        True,
        "claimStatus",
        "write each prepared claim's CPUs into its status.devices (needs the "
        "DRAResourceClaimDeviceStatus feature gate, on by default from Kubernetes 1.33)",
    ),
    FlagSpec(
        "v", "int", 0, None, "log verbosity (0 key events, 2 decisions, 4 allocation, 6 debug)"
    ),
    FlagSpec("vmodule", "string", "", None, "per-file verbosity, e.g. allocation=6,nri=4"),
)
_BY_NAME = {spec.name: spec for spec in ROOT_FLAGS}


def flag_spec(name: str) -> FlagSpec:
    """The root flag called `name`; KeyError when there is none."""
    return _BY_NAME[name]


@dataclass(slots=True)
class ParsedFlags:
    """What a command line set: only flags that were present appear in `explicit`."""

    explicit: dict[str, object] = field(default_factory=dict)
    positionals: list[str] = field(default_factory=list)
    help: bool = False
    version: bool = False

    def config_values(self, specs: Iterable[FlagSpec] = ROOT_FLAGS) -> dict[str, object]:
        """The explicitly set flags that are config fields, keyed by config key."""
        keys = {spec.name: spec.config_key for spec in specs if spec.config_key}
        return {keys[n]: v for n, v in self.explicit.items() if n in keys}


def parse_flags(argv: Sequence[str], specs: Iterable[FlagSpec]) -> ParsedFlags:
    """Parse `argv` like Go's FlagSet.Parse over the flags in `specs`."""
    by_name = {spec.name: spec for spec in specs}
    parsed = ParsedFlags()
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if len(arg) < 2 or arg[0] != "-":
            parsed.positionals = args[i:]
            return parsed
        if arg == "--":
            parsed.positionals = args[i + 1 :]
            return parsed
        body = arg[2:] if arg[1] == "-" else arg[1:]
        if not body or body[0] in "-=":
            raise FlagError(f"bad flag syntax: {arg}")
        name, has_value, value = body.partition("=")
        i += 1
        spec = by_name.get(name)
        if spec is None:
            if name in ("h", "help"):
                parsed.help = True
                return parsed
            if name == "version":
                # Not a Go flag of the upstream driver: what `dracpu version` prints.
                if has_value:
                    raise FlagError(f"flag -version takes no value: {arg}")
                parsed.version = True
                return parsed
            raise FlagError(f"flag provided but not defined: -{name}")
        if spec.kind != "bool" and not has_value:
            if i >= len(args):
                raise FlagError(f"flag needs an argument: -{name}")
            value = args[i]
            i += 1
        elif spec.kind == "bool" and not has_value:
            value = "true"
        # A flag given twice keeps the last value, as in Go.
        parsed.explicit[name] = spec.convert(value)
    return parsed


def parse_root_flags(argv: Sequence[str]) -> ParsedFlags:
    """Parse the root command line of `dracpu` (the daemon's flags)."""
    return parse_flags(argv, ROOT_FLAGS)


# (synopsis, what it does); the daemon comes first, then the subcommands.
COMMANDS: tuple[tuple[str, str], ...] = (
    ("dracpu [flags]", "run the node daemon"),
    ("dracpu run [flags]", "the same, spelled out"),
    ("dracpu gatherinfo [flags]", "write a node-local diagnostic report"),
    ("dracpu introspect metrics", "describe the driver's custom metrics as JSON"),
    ("dracpu introspect topology [flags]", "print the CPU topology read from sysfs"),
    ("dracpu introspect slices [flags]", "print the ResourceSlices this node would publish"),
    ("dracpu introspect allocate [flags]", "show which CPUs the allocator would choose"),
    ("dracpu demo [flags]", "show dracpu at work on this machine"),
    ("dracpu sim apiserver [flags]", "serve a loopback Kubernetes API server"),
    ("dracpu sim runtime [flags]", "run a simulated container runtime speaking NRI"),
    ("dracpu sim fleet [flags]", "measure what many simulated nodes cost one API server"),
    ("dracpu map [flags]", "print this node's CPU map"),
    ("dracpu version", "print the version"),
    ("dracpu --version", "the same"),
)
COMPATIBILITY_PATHS: tuple[tuple[str, str], ...] = (
    ("dracpu-gatherinfo [flags]", "same as dracpu gatherinfo"),
)
USAGE_EXAMPLE = "dracpu --config=/etc/dracpu/config.yaml --kubelet-root-dir=/var/lib/kubelet"


# What a value flag's argument is, as the help shows it (argparse's metavar).
_METAVARS = {
    "config": "FILE",
    "kubeconfig": "FILE",
    "sysfs-overlay": "FILE",
    "bind-address": "ADDRESS",
    "debug-address": "ADDRESS",
    "hostname-override": "NAME",
    "reserved-cpus": "CPUS",
    "nri-socket": "SOCKET",
    "vmodule": "PATTERN=N,...",
    "v": "N",
}
_HELP_WIDTH = 88
_HELP_COLUMN = 26
FLAG_SYNTAX_NOTE = (
    "Flags are parsed as Go's flag package parses them, so manifests written for the Go "
    "driver keep working: -flag and --flag are the same flag; a value is --flag=VALUE or "
    "--flag VALUE; a boolean is --flag or --flag=false (never --flag false); parsing stops "
    "at the first argument that is not a flag."
)


def _metavar(spec: FlagSpec) -> str:
    if spec.kind == "bool":
        return ""
    if spec.kind == "enum":
        return "{" + ",".join(spec.choices) + "}"
    return _METAVARS.get(spec.name, spec.name.rsplit("-", 1)[-1].upper())


def _wrap(text: str, indent: int, first: str = "") -> list[str]:
    """``text`` wrapped to the help width, every line indented by ``indent`` columns."""
    import textwrap

    lines = textwrap.wrap(text, _HELP_WIDTH - indent) or [""]
    pad = " " * indent
    if first:
        head = first.ljust(indent) if len(first) < indent - 1 else None
        if head is None:
            return [first, *(pad + line for line in lines)]
        return [head + lines[0], *(pad + line for line in lines[1:])]
    return [pad + line for line in lines]


def _flag_lines(specs: Iterable[FlagSpec]) -> list[str]:
    """The flag list as argparse lays out its options (sorted by name)."""
    lines = []
    for spec in sorted(specs, key=lambda s: s.name):
        head = f"  --{spec.name}"
        if _metavar(spec):
            head += f" {_metavar(spec)}"
        text = spec.help_text
        if spec.default not in ("", False, 0):
            shown = str(spec.default).lower() if spec.kind == "bool" else str(spec.default)
            text += f" (default {go_quote(shown) if spec.kind == 'string' else shown})"
        lines.extend(_wrap(text, _HELP_COLUMN, head))
    return lines


def _command_lines(rows: Sequence[tuple[str, str]]) -> list[str]:
    # One column width for both tables, so the two sections line up.
    width = max(len(synopsis) for synopsis, _ in (*COMMANDS, *COMPATIBILITY_PATHS)) + 2
    return [f"  {synopsis.ljust(width)}{what}" for synopsis, what in rows]


def usage_text() -> str:
    """Printed on `-h`/`--help`, laid out as the subcommands' argparse
    help is: usage, description, sections, example last."""
    lines = [
        "usage: dracpu [run] [flags]",
        "       dracpu COMMAND [flags]",
        "",
        *_wrap(
            "Run the node daemon (`dracpu run` and `dracpu` with flags only are the same), or "
            "one of the commands below; every command has its own --help.",
            0,
        ),
        "",
        "commands:",
        *_command_lines(COMMANDS),
        "",
        "compatibility paths:",
        *_command_lines(COMPATIBILITY_PATHS),
        "",
        "daemon flags:",
        *_flag_lines(ROOT_FLAGS),
        "",
        *_wrap(FLAG_SYNTAX_NOTE, 0),
        "",
        "example:",
        f"  {USAGE_EXAMPLE}",
    ]
    return "\n".join(lines) + "\n"
