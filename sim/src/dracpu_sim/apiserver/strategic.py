"""Strategic merge patch on plain JSON values. Pure.

What ``kubectl apply`` (client-side) and ``kubectl patch`` send for the kinds kubectl knows
(Pods, Deployments): a merge patch whose keyed lists merge item by item (``list_keys``) and
whose directives say what a merge patch cannot (k8s.io/apimachinery
pkg/util/strategicpatch): ``$patch: replace | delete | merge`` on a map or a list item,
``$setElementOrder/<list>``, ``$deleteFromPrimitiveList/<list>`` and ``$retainKeys``.
Lists that are not keyed are replaced whole, as the real server does for atomic lists.

Malformed directives get the texts of k8s.io/apimachinery pkg/util/mergepatch/errors.go:
400 for the formats the server maps to BadRequest (``interpretStrategicMergePatchError``
in apiserver pkg/endpoints/handlers/patch.go), and 500 without a reason for an unknown
``$patch`` value, which it passes on unwrapped.
"""

from __future__ import annotations

import copy
from typing import Any

from dracpu_sim.apiserver.errors import ApiError, bad_request, go_format, internal
from dracpu_sim.apiserver.list_keys import MERGE_KEYS, PRIMITIVE_SETS

__all__ = ["strategic_merge_patch"]

_PATCH = "$patch"
_RETAIN_KEYS = "$retainKeys"
_SET_ORDER = "$setElementOrder/"
_DELETE_FROM = "$deleteFromPrimitiveList/"


class _Deleted:
    """A map whose patch says ``$patch: delete``: the caller drops its key."""


_DELETED = _Deleted()


def strategic_merge_patch(original: Any, patch: Any) -> Any:
    """``original`` with ``patch`` applied; ``original`` is not changed."""
    if not isinstance(patch, dict):
        raise bad_request("the body of the request was in an unknown format")
    base = copy.deepcopy(original) if isinstance(original, dict) else {}
    merged = _merge_map(base, patch)
    return {} if merged is _DELETED else merged


def _bad_directive(value: Any, where: dict[str, Any]) -> ApiError:
    return internal(f"unknown patch type: {go_format(value)} in map: {go_format(where)}")


_BAD_RETAIN_KEYS = "invalid patch format of retainKeys"
_BAD_ELEMENT_ORDER = "invalid patch format of setElementOrder list"
_BAD_PRIMITIVE_LIST = "invalid patch format of primitive list"


def _merge_map(original: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any] | _Deleted:
    directive = patch.get(_PATCH, "merge")
    if directive == "delete":
        return _DELETED
    if directive == "replace":
        return _plain(patch)  # type: ignore[no-any-return]
    if directive != "merge":
        raise _bad_directive(directive, patch)
    retain = patch.get(_RETAIN_KEYS)
    if retain is not None:
        if not isinstance(retain, list):
            raise bad_request(_BAD_RETAIN_KEYS)
        for key in [k for k in original if k not in retain]:
            del original[key]
    orders: dict[str, Any] = {}
    for key, value in patch.items():
        if key in (_PATCH, _RETAIN_KEYS):
            continue
        if key.startswith(_SET_ORDER):
            orders[key[len(_SET_ORDER) :]] = value
        elif key.startswith(_DELETE_FROM):
            _delete_from(original, key[len(_DELETE_FROM) :], value)
        elif value is None:
            original.pop(key, None)
        elif isinstance(value, dict):
            current = original.get(key)
            merged = _merge_map(current if isinstance(current, dict) else {}, value)
            if merged is _DELETED:
                original.pop(key, None)
            else:
                original[key] = merged
        elif isinstance(value, list):
            original[key] = _merge_list(key, original.get(key), value)
        else:
            original[key] = value
    for key, order in orders.items():
        if isinstance(original.get(key), list):
            original[key] = _ordered(key, original[key], order)
    return original


def _delete_from(original: dict[str, Any], key: str, values: Any) -> None:
    if not isinstance(values, list):
        raise bad_request(_BAD_PRIMITIVE_LIST)
    current = original.get(key)
    if isinstance(current, list):
        original[key] = [v for v in current if v not in values]


def _merge_list(field: str, original: Any, patch: list[Any]) -> list[Any]:
    if any(isinstance(item, dict) and item.get(_PATCH) == "replace" for item in patch):
        return [_plain(i) for i in patch if not (isinstance(i, dict) and _PATCH in i)]
    current = original if isinstance(original, list) else []
    if field in PRIMITIVE_SETS:
        return [*current, *(v for v in patch if v not in current)]
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(i, dict) for i in [*current, *patch]):
        return [_plain(i) for i in patch if not _deletes(i)]
    merged = list(current)
    for item in patch:
        where = next((n for n, old in enumerate(merged) if old.get(key) == item.get(key)), None)
        if _deletes(item):
            if where is not None:
                del merged[where]
        elif where is None:
            merged.append(_plain(item))
        else:
            result = _merge_map(merged[where], item)
            if result is _DELETED:
                del merged[where]
            else:
                merged[where] = result
    return merged


def _deletes(item: Any) -> bool:
    return isinstance(item, dict) and item.get(_PATCH) == "delete"


def _ordered(field: str, items: list[Any], order: Any) -> list[Any]:
    """``$setElementOrder``: the listed items in the listed order, the others after."""
    if not isinstance(order, list):
        raise bad_request(_BAD_ELEMENT_ORDER)
    key = MERGE_KEYS.get(field)

    def ident(item: Any) -> Any:
        return item.get(key) if key is not None and isinstance(item, dict) else item

    wanted = [ident(o) for o in order]
    rank = {json_key: n for n, json_key in enumerate(map(repr, wanted))}
    return sorted(items, key=lambda item: rank.get(repr(ident(item)), len(rank)))


def _plain(value: Any) -> Any:
    """A patch value taken as it is, without directives."""
    if isinstance(value, dict):
        return {
            k: _plain(v)
            for k, v in value.items()
            if k not in (_PATCH, _RETAIN_KEYS)
            and not k.startswith((_SET_ORDER, _DELETE_FROM))
            and v is not None
        }
    if isinstance(value, list):
        return [_plain(v) for v in value if not _deletes(v)]
    return value
