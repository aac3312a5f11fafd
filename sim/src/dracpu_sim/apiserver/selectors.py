"""Label and field selectors: parse the query string forms, match objects. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dracpu_sim.apiserver.errors import ApiError, bad_request

__all__ = [
    "FieldSelector",
    "LabelSelector",
    "field_value",
    "parse_field_selector",
    "parse_label_selector",
]

_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        # "!=" and "notin" match objects without the label, as the real server does.
        return not present or labels[self.key] not in self.values


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(r.matches(labels) for r in self.requirements)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``( )``."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _check_key(key: str, raw: str) -> str:
    if not key or len(key) > 317 or not _LABEL_KEY.match(key):
        raise bad_request(f"unable to parse requirement: invalid label key {key!r} in {raw!r}")
    return key


def _check_value(value: str, raw: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise bad_request(f"unable to parse requirement: invalid label value {value!r} in {raw!r}")
    return value


_SET_FORM = re.compile(r"^\s*(\S+?)\s+(in|notin)\s*\((.*)\)\s*$")


def _parse_requirement(raw: str) -> Requirement:
    text = raw.strip()
    set_form = _SET_FORM.match(text)
    if set_form:
        key, op, values = set_form.groups()
        vals = frozenset(_check_value(v.strip(), raw) for v in values.split(","))
        return Requirement(_check_key(key, raw), op, vals)
    for op_text, op in (("!=", "!="), ("==", "="), ("=", "=")):
        if op_text in text:
            key, _, value = text.partition(op_text)
            key, value = key.strip(), value.strip()
            return Requirement(_check_key(key, raw), op, frozenset({_check_value(value, raw)}))
    if text.startswith("!"):
        return Requirement(_check_key(text[1:].strip(), raw), "!")
    return Requirement(_check_key(text, raw), "exists")


def parse_label_selector(text: str) -> LabelSelector:
    """``a=b,c!=d,e in (x,y),f notin (z),g,!h``; empty selects everything."""
    if not text.strip():
        return LabelSelector()
    return LabelSelector(tuple(_parse_requirement(p) for p in _split_top_level(text)))


def field_value(obj: Mapping[str, Any], label: str) -> str:
    """The string a field selector compares against (missing fields are ``""``)."""
    node: Any = obj
    for part in label.split("."):
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


@dataclass(frozen=True, slots=True)
class FieldTerm:
    label: str
    equal: bool
    value: str


@dataclass(frozen=True, slots=True)
class FieldSelector:
    terms: tuple[FieldTerm, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, t.label) == t.value) == t.equal for t in self.terms)


def _unescape(value: str) -> str:
    # Field selector values escape "\", "," and "=" with a backslash.
    return re.sub(r"\\(.)", r"\1", value)


def _split_field_term(raw: str, text: str) -> tuple[str, bool, str]:
    for op_text, equal in (("!=", False), ("==", True), ("=", True)):
        if op_text in raw:
            label, _, value = raw.partition(op_text)
            return label.strip(), equal, value
    raise bad_request(f"invalid selector: '{text}'; can't understand '{raw}'")


def parse_field_selector(text: str, allowed: tuple[str, ...]) -> FieldSelector:
    """``a=b,c!=d``; labels outside ``allowed`` (plus metadata.name/namespace) are a 400."""
    if not text.strip():
        return FieldSelector()
    terms: list[FieldTerm] = []
    for raw in re.split(r"(?<!\\),", text):
        label, equal, value = _split_field_term(raw, text)
        if label not in ("metadata.name", "metadata.namespace", *allowed):
            raise ApiError(400, "BadRequest", f"field label not supported: {label}")
        terms.append(FieldTerm(label, equal, _unescape(value)))
    return FieldSelector(tuple(terms))
