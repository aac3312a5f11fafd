"""Driver configuration: defaults ← YAML file ← explicitly set flags (behavior.md §3).

Pure apart from reading the one config file. Every failure is a `ConfigError` whose message
is what the user sees; the wording follows the Go driver, with Go's `%q` quoting.

The file is read the way the Go driver's sigs.k8s.io/yaml reads it (YAML 1.1 scalars as
go-yaml v2 resolves them: `on`/`yes`/`y` are booleans, `1_000` and `0x1F` are numbers,
timestamps stay strings), and each layer is applied like encoding/json decoding into the
current struct: only present keys change, `null` changes nothing, keys are taken in sorted
order and the first problem is the one reported.

Where the Go text comes from a library rather than the driver, ours says the same thing in
its own words (the tests pin each one):
- type mismatch: `json: cannot unmarshal <json kind> into field <key> of type <string|bool>`
  (Go: `... into Go struct field Config.<key> of type ...`);
- YAML problems: `<what> (line L, column C)`, e.g. `duplicate key 'a' (line 2, column 1)`;
- a file whose top level is not a mapping: `the top level must be a mapping, got <kind>`;
- a file with several YAML documents is refused (go-yaml silently reads the first one).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import posixpath
import re
import socket
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import yaml
import yaml.constructor

from dracpu.cpuset import CPUSet, CPUSetParseError
from dracpu.flags import (
    ROOT_FLAGS,
    FlagError,
    flag_spec,
    go_int_literal,
    go_quote,
    parse_root_flags,
)

__all__ = [
    "API_VERSION",
    "SOCKET_PATH_LIMIT",
    "UPSTREAM_KEYS",
    "ConfigError",
    "DriverConfig",
    "KubeletPaths",
    "config_dump_yaml",
    "config_fingerprint",
    "deprecated_flag_warnings",
    "deprecated_flags_set",
    "go_clean_path",
    "kubelet_paths",
    "load_config",
    "parse_reserved_cpus",
    "reconstruct_from_cmdline",
    "resolve_node_name",
]

API_VERSION = "v1alpha1"
DRIVER_NAME = "dra.cpu"
SOCKET_PATH_LIMIT = 107  # sun_path is 108 bytes including the terminating NUL


class ConfigError(ValueError):
    """The configuration cannot be used; the message is shown to the user as is."""


class DriverConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The effective configuration. Attribute names are the YAML/JSON keys (§3.1)."""

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
    # Host paths and daemon settings beyond upstream: flags only, refused in the file, so a
    # ConfigMap can never point the daemon at another node's paths.
    sysfsRoot: str = "/sys"
    nriSocket: str = "/var/run/nri/nri.sock"
    cdiDir: str = "/var/run/cdi"
    cgroupRoot: str = "/sys/fs/cgroup"
    stateDir: str = "/var/lib/dracpu"
    debugAddress: str = "127.0.0.1:8081"
    logFormat: str = "text"
    # Beyond upstream, allowed in the file too: not a host path.
    alignMemory: bool = False


# The keys of the Go driver's Config, in the order §3.1 lists them.
UPSTREAM_KEYS = (
    "kubeconfig",
    "hostnameOverride",
    "bindAddress",
    "reservedCPUs",
    "cpuDeviceMode",
    "groupBy",
    "exposePCIeRoots",
    "sysfsOverlay",
    "kubeletRootDir",
    "publishNodeAllocatableResourceMapping",
)
_FIELDS: tuple[str, ...] = DriverConfig.__struct_fields__
_DEFAULTS: dict[str, Any] = msgspec.structs.asdict(DriverConfig())
_FIELD_KIND = {name: "bool" if type(v) is bool else "string" for name, v in _DEFAULTS.items()}
_CANONICAL = tuple(sorted((*_FIELDS, "apiVersion")))

# Fields a config file may not set, and what to use instead (§3.3 step 6).
_EXCLUDED_HINTS: dict[str, str] = {
    "bindAddress": "use helm chart's healthzPort instead",
    "exposePCIeRoots": "use args.exposePCIeRoots instead",
    "kubeletRootDir": (
        "use the chart's top-level kubeletRootDir value, or --kubelet-root-dir when running "
        "the binary directly"
    ),
}
# dracpu's own settings that a config file may set (the other dracpu-only keys are host
# paths and daemon plumbing: flags only).
FILE_KEYS_BEYOND_UPSTREAM = ("alignMemory",)
for _spec in ROOT_FLAGS:
    if (
        _spec.config_key
        and _spec.config_key not in UPSTREAM_KEYS
        and _spec.config_key not in FILE_KEYS_BEYOND_UPSTREAM
    ):
        _EXCLUDED_HINTS[_spec.config_key] = f"use --{_spec.name} instead"

_FLAG_TO_KEY = {spec.name: spec.config_key for spec in ROOT_FLAGS if spec.config_key}
_NOT_CONFIG_FLAGS = frozenset(spec.name for spec in ROOT_FLAGS if not spec.config_key)
_DEPRECATED = {spec.name: spec.config_key for spec in ROOT_FLAGS if spec.deprecated}


# -- reading the file: YAML as go-yaml v2 / sigs.k8s.io/yaml read it --------------------------

_STR = "tag:yaml.org,2002:str"
_NULL = "tag:yaml.org,2002:null"
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_MERGE = "tag:yaml.org,2002:merge"
_MAP = "tag:yaml.org,2002:map"

_NULL_WORDS = frozenset({"", "~", "null", "Null", "NULL"})
_BOOL_WORDS = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE"), True),
    **dict.fromkeys(("on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE"), False),
    **dict.fromkeys(("off", "Off", "OFF"), False),
}
_FLOAT_WORDS = {
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
_YAML_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
_DOT_FLOAT = re.compile(r"\.[0-9]+(?:[eE][-+]?[0-9]+)?")
_UINT64_MAX = (1 << 64) - 1


def _plain_number(text: str) -> int | float | None:
    """The number go-yaml v2 reads from an unquoted scalar, or None when it is a string."""
    if text in _FLOAT_WORDS:
        return _FLOAT_WORDS[text]
    if text[:1] == ".":
        return float(text) if _DOT_FLOAT.fullmatch(text) else None
    if text[:1] not in ("+", "-", *"0123456789"):
        return None
    plain = text.replace("_", "")
    value = go_int_literal(plain)
    if value is not None:
        # ParseInt, then ParseUint (which takes no sign).
        if -(1 << 63) <= value < (1 << 63):
            return value
        if plain[0] not in "+-" and value <= _UINT64_MAX:
            return value
    if _YAML_FLOAT.fullmatch(plain):
        number = float(plain)
        return number if math.isfinite(number) else None  # ParseFloat range error: a string
    return None


def _plain_tag(text: str) -> str:
    if text in _NULL_WORDS:
        return _NULL
    if text in _BOOL_WORDS:
        return _BOOL
    if text == "<<":
        return _MERGE
    number = _plain_number(text)
    if number is None:
        return _STR
    return _INT if isinstance(number, int) else _FLOAT


class _GoYamlLoader(yaml.SafeLoader):
    """SafeLoader reading unquoted scalars as go-yaml v2 does, and refusing duplicate keys."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0]:
            return _plain_tag(value)
        return super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]


class _GoYamlDumper(yaml.SafeDumper):
    """SafeDumper that quotes every string go-yaml v2 would read as something else (`y`,
    `0E0`), so what we write reads back the same in the Go driver's tools and in ours."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0]:
            return _plain_tag(value)
        return super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]


def _scalar_error(node: yaml.Node, what: str) -> yaml.constructor.ConstructorError:
    return yaml.constructor.ConstructorError(
        None, None, f"cannot decode {node.value!r} as {what}", node.start_mark
    )


def _construct_bool(loader: _GoYamlLoader, node: yaml.ScalarNode) -> bool:
    if node.value not in _BOOL_WORDS:
        raise _scalar_error(node, "a bool")
    return _BOOL_WORDS[node.value]


def _construct_number(loader: _GoYamlLoader, node: yaml.ScalarNode) -> int | float:
    number = _plain_number(node.value) if node.value else None
    if number is None:
        raise _scalar_error(node, "a number")
    return float(number) if node.tag == _FLOAT else number


def _construct_text(loader: _GoYamlLoader, node: yaml.ScalarNode) -> str:
    # go-yaml keeps timestamps as their text when the target is untyped.
    return str(node.value)


def _construct_binary(loader: _GoYamlLoader, node: yaml.ScalarNode) -> str:
    raw: bytes = loader.construct_yaml_binary(node)
    return raw.decode("utf-8", "replace")


def _reject_duplicate_keys(loader: _GoYamlLoader, node: yaml.MappingNode) -> None:
    seen: set[object] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE:
            continue
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                "found unhashable key",
                key_node.start_mark,
            ) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)


def _construct_map(
    loader: _GoYamlLoader, node: yaml.MappingNode
) -> Generator[dict[Any, Any], None, None]:
    _reject_duplicate_keys(loader, node)
    data: dict[Any, Any] = {}
    yield data  # filled afterwards, so anchors may refer back to this mapping
    data.update(loader.construct_mapping(node))


_GoYamlLoader.add_constructor(_BOOL, _construct_bool)
_GoYamlLoader.add_constructor(_INT, _construct_number)
_GoYamlLoader.add_constructor(_FLOAT, _construct_number)
_GoYamlLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_text)
_GoYamlLoader.add_constructor("tag:yaml.org,2002:binary", _construct_binary)
_GoYamlLoader.add_constructor(_MAP, _construct_map)


# Deeper than any real config; checked before composing, whose recursion depth would
# otherwise depend on the interpreter's recursion limit (which libraries change).
MAX_YAML_DEPTH = 100


class _TooDeep(Exception):
    pass


def _check_depth(text: str) -> None:
    depth = 0
    # The event parser is a state machine: it does not recurse however deep the document.
    for event in yaml.parse(text, Loader=_GoYamlLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise _TooDeep
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _parse_yaml(text: str) -> Any:
    _check_depth(text)
    loader = _GoYamlLoader(text)  # the reader already refuses control characters here
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _yaml_problem(err: yaml.YAMLError) -> str:
    if isinstance(err, yaml.reader.ReaderError):
        return (
            f"unacceptable character #x{err.character:04x}: {err.reason} (position {err.position})"
        )
    problem = getattr(err, "problem", None)
    mark = getattr(err, "problem_mark", None)
    if problem is None or mark is None:
        return " ".join(str(err).split())
    context = getattr(err, "context", None)
    text = f"{context}, {problem}" if context else problem
    return f"{text} (line {mark.line + 1}, column {mark.column + 1})"


def _os_error_text(err: OSError) -> str:
    # Go's syscall errors are lower-case ("no such file or directory").
    text = err.strerror or str(err)
    return text[:1].lower() + text[1:]


def _json_key(key: object) -> str:
    # sigs.k8s.io/yaml turns every mapping key into a JSON object key.
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _read_file_layer(path: str) -> dict[str, Any]:
    """§3.3 steps 2-3: the file as a generic map ({} for an empty file)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except IsADirectoryError as err:
        raise ConfigError(f"reading {path}: read {path}: {_os_error_text(err)}") from err
    except OSError as err:
        raise ConfigError(f"reading {path}: open {path}: {_os_error_text(err)}") from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"parsing {path}: invalid UTF-8 at byte offset {err.start}") from err
    try:
        data = _parse_yaml(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"parsing {path}: {_yaml_problem(err)}") from err
    except (RecursionError, _TooDeep) as err:
        raise ConfigError(f"parsing {path}: the document is nested too deeply") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"parsing {path}: the top level must be a mapping, got {_json_kind(data)}"
        )
    return {_json_key(k): v for k, v in data.items()}


# -- checking the file's keys (§3.3 steps 4-6) ------------------------------------------------


def _check_api_version(data: dict[str, Any]) -> None:
    """Step 4: `apiVersion`, when present, must be the string v1alpha1; then it is removed."""
    if "apiVersion" not in data:
        return
    version = data.pop("apiVersion")
    shown = version if isinstance(version, str) else ""
    if shown != API_VERSION:
        raise ConfigError(f"unsupported apiVersion {go_quote(shown)}, want {go_quote(API_VERSION)}")


def _equal_fold(a: str, b: str) -> bool:
    """strings.EqualFold for our ASCII canonical names (so 'K', the Kelvin sign, folds to k)."""
    return len(a) == len(b) and all(
        x == y or x.casefold() == y.casefold() for x, y in zip(a, b, strict=True)
    )


def _excluded_message(key: str, canonical: str) -> str:
    return (
        f"field {go_quote(key)} is not configurable via the config file; "
        f"{_EXCLUDED_HINTS[canonical]}"
    )


def _check_key_spelling(data: Mapping[str, Any]) -> None:
    """Step 5: every key that matches a field only when case is ignored, in one error."""
    problems = []
    for key in sorted(data):
        if key in _CANONICAL:
            continue
        want = next((c for c in _CANONICAL if _equal_fold(key, c)), None)
        if want is None:
            continue  # not a field at all: step 7 reports it as unknown
        if want in _EXCLUDED_HINTS:
            problems.append(_excluded_message(key, want))
        else:
            problems.append(
                f"field {go_quote(key)} is spelled differently from the schema; "
                f"use {go_quote(want)}"
            )
    if problems:
        raise ConfigError("; ".join(problems))


def _check_excluded(data: Mapping[str, Any]) -> None:
    """Step 6: the first excluded field (in sorted order) present in the file."""
    for key in sorted(_EXCLUDED_HINTS):
        if key in data:
            raise ConfigError(_excluded_message(key, key))


# -- applying a layer like encoding/json (§3.2, §3.3 steps 7-8) ------------------------------


def _json_kind(value: object) -> str:
    """The JSON kind Go names in its UnmarshalTypeError."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if value is None:
        return "null"
    return "object"


def _non_finite(value: object) -> float | None:
    """A NaN or infinity anywhere in `value`: json.Marshal refuses those. Iterative, and
    each container visited once, since YAML anchors can make the data cyclic."""
    pending, seen = [value], set()
    while pending:
        item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return item
        if isinstance(item, (dict, list, tuple, set)) and id(item) not in seen:
            seen.add(id(item))
            pending.extend([*item.keys(), *item.values()] if isinstance(item, dict) else item)
    return None


def _go_float(value: float) -> str:
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def _decode_problem(key: str, value: object) -> str | None:
    if key not in _FIELD_KIND:
        return f"json: unknown field {go_quote(key)}"
    if value is None or _json_kind(value) == _FIELD_KIND[key]:
        return None
    return f"json: cannot unmarshal {_json_kind(value)} into field {key} of type {_FIELD_KIND[key]}"


def _apply(base: DriverConfig, layer: Mapping[str, Any], *, lenient: bool = False) -> DriverConfig:
    """Decode `layer` over `base`. Strict: the first problem in key order is an error.
    Lenient (gatherinfo): bad keys are skipped and the rest still applies, as Go's decoder
    does before it returns its first saved error."""
    bad = _non_finite(dict(layer))
    if bad is not None:  # Go fails before decoding anything, lenient or not
        raise ConfigError(f"marshaling config map: json: unsupported value: {_go_float(bad)}")
    changes: dict[str, Any] = {}
    for key in sorted(layer):
        value = layer[key]
        problem = _decode_problem(key, value)
        if problem is not None:
            if lenient:
                continue
            raise ConfigError(f"applying config map: {problem}")
        if value is not None:  # JSON null leaves a Go value as it was
            changes[key] = value
    return msgspec.structs.replace(base, **changes)


def _file_layer(path: str) -> dict[str, Any]:
    data = _read_file_layer(path)
    _check_api_version(data)
    _check_key_spelling(data)
    _check_excluded(data)
    return data


def _flag_layer(explicit: Mapping[str, object]) -> dict[str, object]:
    """Explicit settings keyed by config key. Flag names are translated; flags that are not
    config fields (--config, -v, -vmodule) are dropped; anything else is taken as a key."""
    layer: dict[str, object] = {}
    for name, value in explicit.items():
        if name in _NOT_CONFIG_FLAGS:
            continue
        layer[_FLAG_TO_KEY.get(name, name)] = value
    return layer


# -- cleaning and validation (§3.3 step 9) ---------------------------------------------------


def go_clean_path(path: str) -> str:
    """Go's path.Clean: like posixpath.normpath, but a leading `//` is folded to `/`."""
    cleaned = posixpath.normpath(path)
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


def _validate(cfg: DriverConfig) -> DriverConfig:
    root = go_clean_path(cfg.kubeletRootDir) if cfg.kubeletRootDir else ""
    cfg = msgspec.structs.replace(cfg, kubeletRootDir=root)
    problem = None
    if cfg.cpuDeviceMode not in ("grouped", "individual"):
        problem = (
            f"invalid cpuDeviceMode {go_quote(cfg.cpuDeviceMode)}: "
            'must be "grouped" or "individual"'
        )
    elif cfg.cpuDeviceMode == "grouped" and cfg.groupBy not in ("socket", "numanode", "machine"):
        # In individual mode groupBy means nothing, so a bogus value is ignored.
        problem = (
            f'invalid groupBy {go_quote(cfg.groupBy)}: must be "socket", "numanode", or "machine"'
        )
    elif not root:
        problem = "invalid kubeletRootDir: must not be empty"
    elif not root.startswith("/"):
        problem = f"invalid kubeletRootDir {go_quote(root)}: must be an absolute path"
    elif cfg.logFormat not in ("text", "json"):
        problem = f'invalid logFormat {go_quote(cfg.logFormat)}: must be "text" or "json"'
    if problem is not None:
        raise ConfigError(f"cannot validate config: {problem}")
    return cfg


# -- loading ---------------------------------------------------------------------------------


def load_config(config_path: str, explicit: Mapping[str, object]) -> DriverConfig:
    """defaults ← file ← explicitly set flags, then cleaning and validation (§3.2-§3.3).

    `explicit` holds only what was present on the command line, keyed by config key or by
    flag name (as `ParsedFlags.explicit` has it); an unset flag never resets a file value.
    """
    cfg = DriverConfig()
    if config_path:
        try:
            cfg = _apply(cfg, _file_layer(config_path))
        except ConfigError as err:
            raise ConfigError(f"cannot apply {config_path}: {err}") from err
    try:
        cfg = _apply(cfg, _flag_layer(explicit))
    except ConfigError as err:
        raise ConfigError(f"cannot apply flags: {err}") from err
    return _validate(cfg)


def _known_flag_args(args: list[str]) -> list[str]:
    """§2.5 step 3: keep the config flags (and --config) with their values; drop everything
    else, taking an unknown flag's following non-dash argument with it when it has no `=`."""
    kept: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            break
        name, has_value, _ = arg.lstrip("-").partition("=")
        is_flag = arg.startswith("-") and arg != "-" and bool(name)
        known = is_flag and (name == "config" or name in _FLAG_TO_KEY)
        if not known:
            if not (is_flag and has_value) and i < len(args) and not args[i].startswith("-"):
                i += 1
            continue
        kept.append(arg)
        # A value flag spelled `-x v` keeps its value whatever it looks like, as Go would
        # read it; a bool flag never takes one.
        if not has_value and flag_spec(name).kind != "bool" and i < len(args):
            kept.append(args[i])
            i += 1
    return kept


def driver_argv(argv: Sequence[str]) -> list[str]:
    """The driver's command line as if it were a binary called ``dracpu``.

    A Python entry point runs as ``python3.11 /usr/local/bin/dracpu run ...`` (its `comm` is
    still ``dracpu``) or ``python -m dracpu run ...``: the interpreter words are dropped.
    Any other command line is returned unchanged.
    """
    words = list(argv)
    if words and posixpath.basename(words[0]).startswith("python"):
        if len(words) > 1 and posixpath.basename(words[1]) == "dracpu":
            return words[1:]
        if words[1:3] == ["-m", "dracpu"]:
            return ["dracpu", *words[3:]]
    return words


def reconstruct_from_cmdline(argv: list[str], resolve_path: Callable[[str], str]) -> DriverConfig:
    """The config a running driver uses, from its command line (behavior.md §2.5 step 3).

    `argv` includes argv[0]; `resolve_path` maps a path as the driver sees it to one this
    process can open (inside /proc/<pid>/root or /proc/<pid>/cwd).
    """
    cfg = DriverConfig()
    argv = driver_argv(argv)
    if not argv or posixpath.basename(argv[0]) != "dracpu":
        return cfg
    try:
        explicit = parse_root_flags(_known_flag_args(argv[1:])).explicit
    except FlagError:
        return cfg  # lenient: an unreadable command line reports the defaults
    config_path = explicit.get("config", "")
    if isinstance(config_path, str) and config_path:
        with contextlib.suppress(ConfigError):  # the file layer is best effort here
            cfg = _apply(cfg, _file_layer(resolve_path(config_path)), lenient=True)
    try:
        return _validate(_apply(cfg, _flag_layer(explicit)))
    except ConfigError as err:
        raise ConfigError(f"failed to resolve driver config: {err}") from err


# -- values derived at start (§3.4) ----------------------------------------------------------


def parse_reserved_cpus(cfg: DriverConfig) -> CPUSet:
    """`reservedCPUs` as a cpuset; not checked against the online CPUs."""
    try:
        return CPUSet.parse(cfg.reservedCPUs)
    except CPUSetParseError as err:
        raise ConfigError(f"failed to parse reserved CPUs: {err}") from err


def _node_name(cfg: DriverConfig, hostname_fn: Callable[[], str], env: Mapping[str, str]) -> str:
    name = cfg.hostnameOverride or env.get("NODE_NAME", "")
    if not name:
        try:
            name = hostname_fn()
        except OSError as err:
            raise ConfigError(f"couldn't determine hostname: {err}") from err
    name = name.strip()
    if not name:
        raise ConfigError("empty hostname is invalid")
    return name.lower()


def resolve_node_name(
    cfg: DriverConfig,
    hostname_fn: Callable[[], str] = socket.gethostname,
    env: Mapping[str, str] = os.environ,
    *,
    hostname: Callable[[], str] | None = None,
) -> str:
    """hostnameOverride, else $NODE_NAME, else the OS hostname; trimmed and lower-cased.
    (`hostname` is an older spelling of `hostname_fn`.)"""
    try:
        return _node_name(cfg, hostname or hostname_fn, env)
    except ConfigError as err:
        raise ConfigError(
            "can not obtain the node name, use the hostname-override flag if you want to set "
            f"it to a specific value: {err}"
        ) from err


@dataclass(frozen=True, slots=True)
class KubeletPaths:
    """Where the plugin's sockets live under the kubelet root (§3.4, §7)."""

    registrar_dir: str
    plugin_dir: str
    registrar_socket: str
    dra_socket: str


def _byte_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def kubelet_paths(cfg: DriverConfig) -> KubeletPaths:
    """The kubelet plugin paths; a registrar socket path over 107 bytes is an error."""
    root = cfg.kubeletRootDir
    registrar_dir = go_clean_path(f"{root}/plugins_registry")
    plugin_dir = go_clean_path(f"{root}/plugins/{DRIVER_NAME}")
    registrar_socket = f"{registrar_dir}/{DRIVER_NAME}-reg.sock"
    size = _byte_len(registrar_socket)
    if size > SOCKET_PATH_LIMIT:
        budget = SOCKET_PATH_LIMIT - (size - _byte_len(root))
        raise ConfigError(
            f"kubelet registrar socket path {go_quote(registrar_socket)} is {size} bytes, over "
            f"the {SOCKET_PATH_LIMIT}-byte limit for a Unix socket path: kubeletRootDir has "
            f"{budget} bytes to spend and is using {_byte_len(root)}"
        )
    return KubeletPaths(
        registrar_dir=registrar_dir,
        plugin_dir=plugin_dir,
        registrar_socket=registrar_socket,
        dra_socket=f"{plugin_dir}/dra.sock",
    )


def config_dump_yaml(cfg: DriverConfig) -> str:
    """The `configuration successfully loaded` dump: every key, zero values too, sorted."""
    return yaml.dump(
        msgspec.structs.asdict(cfg),
        Dumper=_GoYamlDumper,
        sort_keys=True,
        default_flow_style=False,
        # Escaped: PyYAML writes U+0085 and friends raw, and they then read back as breaks.
        allow_unicode=False,
    )


def config_fingerprint(cfg: DriverConfig) -> str:
    """A stable sha256 of what changes allocation and the published devices.

    reservedCPUs is compared as a set (`0,1` and `0-1` are the same configuration) and
    groupBy only counts in grouped mode, where it has a meaning.
    """
    try:
        reserved = CPUSet.parse(cfg.reservedCPUs).format()
    except CPUSetParseError:
        reserved = cfg.reservedCPUs
    payload = {
        "v": 1,
        "cpuDeviceMode": cfg.cpuDeviceMode,
        "groupBy": cfg.groupBy if cfg.cpuDeviceMode == "grouped" else "",
        "reservedCPUs": reserved,
        "exposePCIeRoots": cfg.exposePCIeRoots,
        "publishNodeAllocatableResourceMapping": cfg.publishNodeAllocatableResourceMapping,
    }
    return hashlib.sha256(msgspec.json.encode(payload, order="sorted")).hexdigest()


def deprecated_flag_warnings(explicit_flag_names: Iterable[str]) -> list[tuple[str, str]]:
    """(flag, driverConfig field) for each deprecated flag that was set, in name order
    (the order Go's FlagSet.Visit reports them)."""
    names = set(explicit_flag_names)
    return [(flag, key) for flag, key in sorted(_DEPRECATED.items()) if flag in names and key]


def deprecated_flags_set(explicit_flags: Iterable[str]) -> list[tuple[str, str]]:
    """Older name of `deprecated_flag_warnings`."""
    return deprecated_flag_warnings(explicit_flags)
