"""Layering: defaults ← YAML file ← explicitly set flags, then cleaning and validation
(behavior.md §3.2-§3.3), and the same for a running driver's command line (§2.5).

Each layer is applied like encoding/json decoding into the current struct: only present
keys change, `null` changes nothing, keys are taken in sorted order and the first problem is
the one reported. The wording follows the Go driver, with Go's `%q` quoting; where the Go
text comes from a library rather than the driver, ours says the same thing in its own words
(the tests pin each one):
- type mismatch: `json: cannot unmarshal <json kind> into field <key> of type <string|bool>`
  (Go: `... into Go struct field Config.<key> of type ...`);
- YAML problems: `<what> (line L, column C)`, e.g. `duplicate key 'a' (line 2, column 1)`;
- a file whose top level is not a mapping: `the top level must be a mapping, got <kind>`;
- a file with several YAML documents is refused (go-yaml silently reads the first one).
"""

from __future__ import annotations

import contextlib
import math
import posixpath
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from dracpu.config import goyaml
from dracpu.config.schema import (
    API_VERSION,
    CANONICAL_KEYS,
    EXCLUDED_HINTS,
    FIELD_KIND,
    FLAG_TO_KEY,
    NOT_CONFIG_FLAGS,
    ConfigError,
    DriverConfig,
)
from dracpu.flags import FlagError, flag_spec, parse_root_flags
from dracpu.gofmt import go_quote

__all__ = ["driver_argv", "go_clean_path", "load_config", "reconstruct_from_cmdline"]


# -- reading the file (§3.3 steps 2-3) --------------------------------------------------------


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


def _read_file_layer(path: str) -> dict[str, Any]:
    """The file as a generic map ({} for an empty file)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except IsADirectoryError as err:
        raise ConfigError(f"reading {path}: read {path}: {_os_error_text(err)}") from err
    except OSError as err:
        raise ConfigError(f"reading {path}: open {path}: {_os_error_text(err)}") from err
    try:
        data = goyaml.load(raw)
    except goyaml.GoYamlError as err:
        raise ConfigError(f"parsing {path}: {err}") from err
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
        f"{EXCLUDED_HINTS[canonical]}"
    )


def _check_key_spelling(data: Mapping[str, Any]) -> None:
    """Step 5: every key that matches a field only when case is ignored, in one error."""
    problems = []
    for key in sorted(data):
        if key in CANONICAL_KEYS:
            continue
        want = next((c for c in CANONICAL_KEYS if _equal_fold(key, c)), None)
        if want is None:
            continue  # not a field at all: step 7 reports it as unknown
        if want in EXCLUDED_HINTS:
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
    for key in sorted(EXCLUDED_HINTS):
        if key in data:
            raise ConfigError(_excluded_message(key, key))


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
        if name in NOT_CONFIG_FLAGS:
            continue
        layer[FLAG_TO_KEY.get(name, name)] = value
    return layer


# -- applying a layer like encoding/json (§3.2, §3.3 steps 7-8) ------------------------------


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
    if key not in FIELD_KIND:
        return f"json: unknown field {go_quote(key)}"
    if value is None or _json_kind(value) == FIELD_KIND[key]:
        return None
    return f"json: cannot unmarshal {_json_kind(value)} into field {key} of type {FIELD_KIND[key]}"


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
    elif not cfg.procRoot.startswith("/"):
        problem = f"invalid procRoot {go_quote(cfg.procRoot)}: must be an absolute path"
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


# -- a running driver's config, from its command line (§2.5 step 3) --------------------------


def _known_flag_args(args: list[str]) -> list[str]:
    """Keep the config flags (and --config) with their values; drop everything else,
    taking an unknown flag's following non-dash argument with it when it has no `=`."""
    kept: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            break
        name, has_value, _ = arg.lstrip("-").partition("=")
        is_flag = arg.startswith("-") and arg != "-" and bool(name)
        known = is_flag and (name == "config" or name in FLAG_TO_KEY)
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
