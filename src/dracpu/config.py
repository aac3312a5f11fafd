"""Driver configuration: defaults ← YAML file ← explicitly set flags (behavior.md §3)."""

from __future__ import annotations

import hashlib
import os
import posixpath
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import yaml

from dracpu.cpuset import CPUSet, CPUSetParseError
from dracpu.flags import ROOT_FLAGS, FlagError, flag_spec, parse_root_flags

__all__ = [
    "ConfigError",
    "DriverConfig",
    "KubeletPaths",
    "config_dump_yaml",
    "config_fingerprint",
    "deprecated_flags_set",
    "kubelet_paths",
    "load_config",
    "parse_reserved_cpus",
    "reconstruct_from_cmdline",
    "resolve_node_name",
]


class ConfigError(ValueError):
    """The configuration cannot be used; the message is shown to the user as is."""


class DriverConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The effective configuration. Attribute names are the YAML/JSON keys."""

    kubeconfig: str = ""
    hostnameOverride: str = ""
    bindAddress: str = ":8080"
    reservedCPUs: str = ""
    cpuDeviceMode: str = "grouped"
    groupBy: str = "numanode"
    exposePCIeRoots: bool = False
    sysfsOverlay: str = ""
    kubeletRootDir: str = "/var/lib/kubelet"
    publishNodeAllocatableResourceMapping: bool = False
    # flag-only host paths and daemon settings (not settable in the file)
    sysfsRoot: str = "/sys"
    nriSocket: str = "/var/run/nri/nri.sock"
    cdiDir: str = "/var/run/cdi"
    cgroupRoot: str = "/sys/fs/cgroup"
    stateDir: str = "/var/lib/dracpu"
    debugAddress: str = "127.0.0.1:8081"
    logFormat: str = "text"


UPSTREAM_KEYS = (
    "bindAddress",
    "cpuDeviceMode",
    "exposePCIeRoots",
    "groupBy",
    "hostnameOverride",
    "kubeconfig",
    "kubeletRootDir",
    "publishNodeAllocatableResourceMapping",
    "reservedCPUs",
    "sysfsOverlay",
)
_FIELDS = DriverConfig.__struct_fields__
_EXCLUDED_HINTS = {
    "bindAddress": "use helm chart's healthzPort instead",
    "exposePCIeRoots": "use args.exposePCIeRoots instead",
    "kubeletRootDir": (
        "use the chart's top-level kubeletRootDir value, or --kubelet-root-dir when running "
        "the binary directly"
    ),
}
for _spec in ROOT_FLAGS:
    if _spec.config_key and _spec.config_key not in UPSTREAM_KEYS:
        _EXCLUDED_HINTS[_spec.config_key] = f"use --{_spec.name} instead"
_CANONICAL = (*_FIELDS, "apiVersion")
_FLAG_TO_KEY = {s.name: s.config_key for s in ROOT_FLAGS if s.config_key}
_DEPRECATED = {s.name: s.config_key for s in ROOT_FLAGS if s.deprecated and s.config_key}
_JSON_TYPE = {
    str: "string",
    bool: "bool",
    int: "number",
    float: "number",
    list: "array",
    dict: "object",
    type(None): "null",
}


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys."""


def _mapping_no_duplicates(
    loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False
) -> Any:
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _mapping_no_duplicates,
)


def _yaml_problem(err: yaml.YAMLError) -> str:
    problem = getattr(err, "problem", None)
    mark = getattr(err, "problem_mark", None)
    if problem is None or mark is None:
        return " ".join(str(err).split())
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"


def _read_file_layer(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"reading {path}: {err}") from err
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as err:
        raise ConfigError(f"parsing {path}: {_yaml_problem(err)}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"parsing {path}: the top level must be a mapping")
    return {str(k): v for k, v in data.items()}


def _check_file_keys(data: dict[str, Any]) -> None:
    if "apiVersion" in data:
        version = data.pop("apiVersion")
        if version != "v1alpha1":
            shown = version if isinstance(version, str) else ""
            raise ConfigError(f'unsupported apiVersion "{shown}", want "v1alpha1"')
    problems = []
    for key in sorted(data):
        if key in _CANONICAL:
            continue
        for canonical in _CANONICAL:
            if key.lower() == canonical.lower():
                if canonical in _EXCLUDED_HINTS:
                    problems.append(
                        f'field "{key}" is not configurable via the config file; '
                        f"{_EXCLUDED_HINTS[canonical]}"
                    )
                else:
                    problems.append(
                        f'field "{key}" is spelled differently from the schema; use "{canonical}"'
                    )
    if problems:
        raise ConfigError("; ".join(problems))
    for key in sorted(data):
        if key in _EXCLUDED_HINTS:
            raise ConfigError(
                f'field "{key}" is not configurable via the config file; {_EXCLUDED_HINTS[key]}'
            )


def _apply(base: DriverConfig, layer: Mapping[str, Any]) -> DriverConfig:
    for key in layer:
        if key not in _FIELDS:
            raise ConfigError(f'applying config map: json: unknown field "{key}"')
    current = msgspec.structs.asdict(base)
    for key, value in layer.items():
        want = type(current[key])
        if type(value) is not want:
            got = _JSON_TYPE.get(type(value), type(value).__name__)
            raise ConfigError(
                f"applying config map: json: cannot unmarshal {got} into field {key} "
                f"of type {_JSON_TYPE[want]}"
            )
        current[key] = value
    return DriverConfig(**current)


def _validate(cfg: DriverConfig) -> DriverConfig:
    root = cfg.kubeletRootDir
    cleaned = posixpath.normpath(root) if root else ""
    if cleaned.startswith("//"):
        cleaned = "/" + cleaned.lstrip("/")
    cfg = msgspec.structs.replace(cfg, kubeletRootDir=cleaned)
    if cfg.cpuDeviceMode not in ("grouped", "individual"):
        msg = f'invalid cpuDeviceMode "{cfg.cpuDeviceMode}": must be "grouped" or "individual"'
    elif cfg.cpuDeviceMode == "grouped" and cfg.groupBy not in ("socket", "numanode", "machine"):
        msg = f'invalid groupBy "{cfg.groupBy}": must be "socket", "numanode", or "machine"'
    elif not cleaned:
        msg = "invalid kubeletRootDir: must not be empty"
    elif not cleaned.startswith("/"):
        msg = f'invalid kubeletRootDir "{cleaned}": must be an absolute path'
    else:
        return cfg
    raise ConfigError(f"cannot validate config: {msg}")


def load_config(config_path: str, explicit_flags: Mapping[str, object]) -> DriverConfig:
    """defaults ← file ← explicitly set flags, then cleaning and validation."""
    cfg = DriverConfig()
    if config_path:
        try:
            data = _read_file_layer(config_path)
            _check_file_keys(data)
            cfg = _apply(cfg, data)
        except ConfigError as err:
            raise ConfigError(f"cannot apply {config_path}: {err}") from err
    flag_layer = {_FLAG_TO_KEY[n]: v for n, v in explicit_flags.items() if n in _FLAG_TO_KEY}
    try:
        cfg = _apply(cfg, flag_layer)
    except ConfigError as err:
        raise ConfigError(f"cannot apply flags: {err}") from err
    return _validate(cfg)


def deprecated_flags_set(explicit_flags: Mapping[str, object]) -> list[tuple[str, str]]:
    return [(name, key) for name, key in _DEPRECATED.items() if name in explicit_flags]


def parse_reserved_cpus(cfg: DriverConfig) -> CPUSet:
    try:
        return CPUSet.parse(cfg.reservedCPUs)
    except CPUSetParseError as err:
        raise ConfigError(f"failed to parse reserved CPUs: {err}") from err


def resolve_node_name(
    cfg: DriverConfig,
    *,
    hostname: Callable[[], str] = socket.gethostname,
    env: Mapping[str, str] = os.environ,
) -> str:
    name = cfg.hostnameOverride or env.get("NODE_NAME", "") or hostname()
    name = name.strip().lower()
    if not name:
        raise ConfigError(
            "can not obtain the node name, use the hostname-override flag if you want to set "
            "it to a specific value: empty hostname is invalid"
        )
    return name


@dataclass(frozen=True, slots=True)
class KubeletPaths:
    registrar_dir: str
    plugin_dir: str
    registrar_socket: str
    dra_socket: str


SOCKET_PATH_LIMIT = 107


def kubelet_paths(cfg: DriverConfig) -> KubeletPaths:
    root = cfg.kubeletRootDir
    reg = f"{root}/plugins_registry/dra.cpu-reg.sock"
    size = len(reg.encode())
    if size > SOCKET_PATH_LIMIT:
        budget = SOCKET_PATH_LIMIT - (size - len(root.encode()))
        raise ConfigError(
            f'kubelet registrar socket path "{reg}" is {size} bytes, over the 107-byte limit '
            f"for a Unix socket path: kubeletRootDir has <{budget}> bytes to spend and is "
            f"using <{len(root.encode())}>"
        )
    return KubeletPaths(
        registrar_dir=f"{root}/plugins_registry",
        plugin_dir=f"{root}/plugins/dra.cpu",
        registrar_socket=reg,
        dra_socket=f"{root}/plugins/dra.cpu/dra.sock",
    )


def config_dump_yaml(cfg: DriverConfig) -> str:
    raw = msgspec.structs.asdict(cfg)
    return yaml.safe_dump({k: raw[k] for k in sorted(UPSTREAM_KEYS)}, sort_keys=True)


def config_fingerprint(cfg: DriverConfig) -> str:
    keys = (
        "cpuDeviceMode",
        "groupBy",
        "reservedCPUs",
        "exposePCIeRoots",
        "publishNodeAllocatableResourceMapping",
    )
    raw = msgspec.structs.asdict(cfg)
    return hashlib.sha256(msgspec.json.encode({k: raw[k] for k in keys})).hexdigest()


def _known_flags_only(argv: list[str]) -> list[str]:
    kept: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            break
        if not arg.startswith("-") or len(arg) < 2:
            continue
        name, eq, _ = arg.lstrip("-").partition("=")
        known = name == "config" or name in _FLAG_TO_KEY
        try:
            is_bool = known and flag_spec(name).kind == "bool"
        except KeyError:
            is_bool = False
        takes_next = not eq and not is_bool and i < len(argv) and not argv[i].startswith("-")
        if known:
            kept.append(arg)
            if takes_next:
                kept.append(argv[i])
        if takes_next:
            i += 1
    return kept


def reconstruct_from_cmdline(argv: list[str], resolve_path: Callable[[str], str]) -> DriverConfig:
    """The config a running driver uses, from its command line (behavior.md §2.5 step 3)."""
    try:
        parsed = parse_root_flags(_known_flags_only(argv[1:]))
        explicit = parsed.explicit
    except FlagError:
        explicit = {}
    cfg = DriverConfig()
    config_path = str(explicit.get("config", "") or "")
    if config_path:
        try:
            data = _read_file_layer(resolve_path(config_path))
            _check_file_keys(data)
            cfg = _apply(cfg, data)
        except ConfigError:
            pass
    flag_layer = {_FLAG_TO_KEY[n]: v for n, v in explicit.items() if n in _FLAG_TO_KEY}
    try:
        cfg = _apply(cfg, flag_layer)
        return _validate(cfg)
    except ConfigError as err:
        raise ConfigError(f"failed to resolve driver config: {err}") from err
