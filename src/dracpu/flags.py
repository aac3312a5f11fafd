"""Root flags of `dracpu` with Go `flag` package semantics (behavior.md §2.2).

`-x` and `--x` both work; `-x=v` or `-x v` for value flags; bool flags are `-x` or
`-x=true|false` and never take the next argument; parsing stops at the first non-flag
argument or after `--`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ROOT_FLAGS", "FlagError", "FlagSpec", "ParsedFlags", "parse_root_flags", "usage_text"]

_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


class FlagError(ValueError):
    """A command-line flag could not be parsed; the message is Go's wording."""


@dataclass(frozen=True, slots=True)
class FlagSpec:
    name: str
    kind: str  # "string", "bool", "int" or "enum"
    default: object
    config_key: str | None
    help: str
    deprecated: bool = False
    choices: tuple[str, ...] = ()
    choices_text: str = ""

    @property
    def help_text(self) -> str:
        if not self.deprecated:
            return self.help
        return (
            f'{self.help} (DEPRECATED: prefer driverConfig field "{self.config_key}"; '
            "this flag will be removed in a future release)"
        )


ROOT_FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec("config", "string", "", None, "path of the YAML driver config file"),
    FlagSpec("kubeconfig", "string", "", "kubeconfig", "kubeconfig file; empty = in-cluster"),
    FlagSpec(
        "bind-address", "string", ":8080", "bindAddress", "HTTP address for /healthz, /metrics"
    ),
    FlagSpec(
        "debug-address", "string", "127.0.0.1:8081", "debugAddress", "HTTP address for /debug/state"
    ),
    FlagSpec(
        "expose-pcie-roots",
        "bool",
        False,
        "exposePCIeRoots",
        "publish resource.kubernetes.io/pcieRoot",
    ),
    FlagSpec(
        "kubelet-root-dir", "string", "/var/lib/kubelet", "kubeletRootDir", "kubelet root directory"
    ),
    FlagSpec(
        "cpu-device-mode",
        "enum",
        "grouped",
        "cpuDeviceMode",
        "device mode: grouped or individual",
        deprecated=True,
        choices=("grouped", "individual"),
        choices_text="grouped or individual",
    ),
    FlagSpec(
        "group-by",
        "enum",
        "numanode",
        "groupBy",
        "grouping in grouped mode",
        deprecated=True,
        choices=("socket", "numanode", "machine"),
        choices_text="socket, numanode or machine",
    ),
    FlagSpec(
        "reserved-cpus", "string", "", "reservedCPUs", "cpuset kept out of DRA", deprecated=True
    ),
    FlagSpec(
        "hostname-override", "string", "", "hostnameOverride", "node name to use", deprecated=True
    ),
    FlagSpec(
        "sysfs-overlay", "string", "", "sysfsOverlay", "sysfs overlay YAML file", deprecated=True
    ),
    FlagSpec("sysfs-root", "string", "/sys", "sysfsRoot", "sysfs directory"),
    FlagSpec(
        "nri-socket", "string", "/var/run/nri/nri.sock", "nriSocket", "NRI socket of the runtime"
    ),
    FlagSpec("cdi-dir", "string", "/var/run/cdi", "cdiDir", "directory of CDI spec files"),
    FlagSpec("cgroup-root", "string", "/sys/fs/cgroup", "cgroupRoot", "cgroupfs mount"),
    FlagSpec("state-dir", "string", "/var/lib/dracpu", "stateDir", "directory of the checkpoint"),
    FlagSpec(
        "log-format",
        "enum",
        "text",
        "logFormat",
        "log format: text or json",
        choices=("text", "json"),
        choices_text="text or json",
    ),
    FlagSpec("v", "int", 0, None, "log verbosity"),
    FlagSpec("vmodule", "string", "", None, "per-file log verbosity"),
)
_BY_NAME = {f.name: f for f in ROOT_FLAGS}


@dataclass(slots=True)
class ParsedFlags:
    explicit: dict[str, object] = field(default_factory=dict)
    positionals: list[str] = field(default_factory=list)
    help: bool = False


def _convert(spec: FlagSpec, value: str) -> object:
    if spec.kind == "bool":
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise FlagError(f'invalid boolean value "{value}" for -{spec.name}: parse error')
    if spec.kind == "int":
        try:
            return int(value, 0)
        except ValueError:
            raise FlagError(f'invalid value "{value}" for flag -{spec.name}: parse error') from None
    if spec.kind == "enum" and value not in spec.choices:
        raise FlagError(
            f'invalid value "{value}" for flag -{spec.name}: '
            f'invalid value: "{value}", must be {spec.choices_text}'
        )
    return value


def parse_root_flags(argv: list[str]) -> ParsedFlags:
    parsed = ParsedFlags()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            parsed.positionals = argv[i + 1 :]
            return parsed
        if len(arg) < 2 or arg[0] != "-":
            parsed.positionals = argv[i:]
            return parsed
        body = arg[2:] if arg.startswith("--") else arg[1:]
        if not body or body[0] in "-=":
            raise FlagError(f"bad flag syntax: {arg}")
        name, eq, value = body.partition("=")
        if name in ("h", "help"):
            parsed.help = True
            return parsed
        spec = _BY_NAME.get(name)
        if spec is None:
            raise FlagError(f"flag provided but not defined: -{name}")
        i += 1
        if spec.kind == "bool":
            parsed.explicit[name] = _convert(spec, value) if eq else True
            continue
        if not eq:
            if i >= len(argv):
                raise FlagError(f"flag needs an argument: -{name}")
            value = argv[i]
            i += 1
        parsed.explicit[name] = _convert(spec, value)
    return parsed


def flag_spec(name: str) -> FlagSpec:
    return _BY_NAME[name]


def usage_text() -> str:
    lines = [
        "Usage:",
        "  dracpu [flags]                      run the node daemon",
        "  dracpu gatherinfo [flags]           collect a support bundle",
        "  dracpu introspect metrics           list the driver's metrics",
        "  dracpu introspect topology|slices|allocate [flags]",
        "  dracpu demo [flags]                 show dracpu on this machine",
        "  dracpu sim apiserver [flags]        run the loopback API server",
        "  dracpu version",
        "",
        "Compatibility paths:",
        "  dracpu-gatherinfo [flags]           same as dracpu gatherinfo",
        "",
        "Example:",
        "  dracpu --config=/etc/dracpu/config.yaml --kubelet-root-dir=/var/lib/kubelet",
        "",
        "Flags:",
    ]
    for spec in ROOT_FLAGS:
        kind = "" if spec.kind == "bool" else f" {spec.kind if spec.kind != 'enum' else 'value'}"
        default = f' (default "{spec.default}")' if spec.default not in ("", False, 0) else ""
        lines.append(f"  -{spec.name}{kind}")
        lines.append(f"        {spec.help_text}{default}")
    return "\n".join(lines) + "\n"
