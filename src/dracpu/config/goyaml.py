"""YAML read the way the Go driver reads its config file (go-yaml v2 under sigs.k8s.io/yaml).

Unquoted scalars resolve as go-yaml v2 resolves them (YAML 1.1: `on`/`yes`/`y` are booleans,
`1_000` and `0x1F` are numbers, timestamps stay strings); duplicate keys, several documents
and documents nested deeper than `MAX_YAML_DEPTH` are refused. `load` turns every problem
into one `GoYamlError` whose message names what and where (`duplicate key 'a' (line 2,
column 1)`). `GoYamlDumper` writes YAML that reads back the same here and in Go.
"""

from __future__ import annotations

import math
import re
from collections.abc import Generator
from typing import Any

import yaml
import yaml.constructor

from dracpu.flags import go_int_literal
from dracpu.yamlguard import MAX_YAML_DEPTH, YamlTooDeep, check_nesting

__all__ = ["MAX_YAML_DEPTH", "GoYamlDumper", "GoYamlError", "GoYamlLoader", "load"]


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


class GoYamlError(ValueError):
    """The text is not a YAML document we read; the message says what and where."""


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


class GoYamlLoader(yaml.SafeLoader):
    """SafeLoader reading unquoted scalars as go-yaml v2 does, and refusing duplicate keys."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0]:
            return _plain_tag(value)
        return super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]


class GoYamlDumper(yaml.SafeDumper):
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


def _construct_bool(loader: GoYamlLoader, node: yaml.ScalarNode) -> bool:
    if node.value not in _BOOL_WORDS:
        raise _scalar_error(node, "a bool")
    return _BOOL_WORDS[node.value]


def _construct_number(loader: GoYamlLoader, node: yaml.ScalarNode) -> int | float:
    number = _plain_number(node.value) if node.value else None
    if number is None:
        raise _scalar_error(node, "a number")
    return float(number) if node.tag == _FLOAT else number


def _construct_text(loader: GoYamlLoader, node: yaml.ScalarNode) -> str:
    # go-yaml keeps timestamps as their text when the target is untyped.
    return str(node.value)


def _construct_binary(loader: GoYamlLoader, node: yaml.ScalarNode) -> str:
    raw: bytes = loader.construct_yaml_binary(node)
    return raw.decode("utf-8", "replace")


def _reject_duplicate_keys(loader: GoYamlLoader, node: yaml.MappingNode) -> None:
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
    loader: GoYamlLoader, node: yaml.MappingNode
) -> Generator[dict[Any, Any], None, None]:
    _reject_duplicate_keys(loader, node)
    data: dict[Any, Any] = {}
    yield data  # filled afterwards, so anchors may refer back to this mapping
    data.update(loader.construct_mapping(node))


GoYamlLoader.add_constructor(_BOOL, _construct_bool)
GoYamlLoader.add_constructor(_INT, _construct_number)
GoYamlLoader.add_constructor(_FLOAT, _construct_number)
GoYamlLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_text)
GoYamlLoader.add_constructor("tag:yaml.org,2002:binary", _construct_binary)
GoYamlLoader.add_constructor(_MAP, _construct_map)


def _parse(text: str) -> Any:
    check_nesting(text, GoYamlLoader)
    loader = GoYamlLoader(text)  # the reader already refuses control characters here
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


def load(raw: bytes) -> Any:
    """The one YAML document in `raw` (None when it is empty), or `GoYamlError`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise GoYamlError(f"invalid UTF-8 at byte offset {err.start}") from err
    try:
        return _parse(text)
    except yaml.YAMLError as err:
        raise GoYamlError(_yaml_problem(err)) from err
    except YamlTooDeep as err:
        raise GoYamlError(str(err)) from err
    except RecursionError as err:  # a limit lowered below MAX_YAML_DEPTH's needs
        raise GoYamlError("the document is nested too deeply") from err
