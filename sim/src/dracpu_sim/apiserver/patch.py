"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902) on plain JSON values. Pure.

Strategic merge patch is served as a merge patch: the objects the simulator holds have
no list merge keys that the driver relies on.
"""

from __future__ import annotations

import copy
from typing import Any

from dracpu_sim.apiserver.errors import ApiError, bad_request

__all__ = ["json_patch", "merge_patch"]


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(
            f"the server rejected our request due to an error in our request: "
            f"invalid JSON pointer {path!r}"
        )
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _unprocessable(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


def _walk(doc: Any, parts: list[str], path: str) -> Any:
    """The node at ``parts`` (object keys, array indexes) under ``doc``; 422 when missing."""
    node = doc
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise _unprocessable(f"doc is missing path: {path!r}")
    return node


def _parent(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    return _walk(doc, parts[:-1], path), parts[-1]


def _get(doc: Any, path: str) -> Any:
    return _walk(doc, _pointer(path), path)


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        index = len(parent) if last == "-" else int(last) if last.isdigit() else -1
        if not 0 <= index <= len(parent):
            raise _unprocessable(f"add operation does not apply: index out of range: {path!r}")
        parent.insert(index, value)
    else:
        raise _unprocessable(f"doc is missing path: {path!r}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise _unprocessable("cannot remove the whole document")
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise _unprocessable(f"remove operation does not apply: doc is missing path: {path!r}")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid json patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = (
                _add(_remove(doc, path), path, copy.deepcopy(op.get("value")))
                if path
                else (copy.deepcopy(op.get("value")))
            )
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise _unprocessable(f"testing value {path} failed")
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_get(doc, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, op.get("from", ""))
            doc = _add(doc, path, value)
        else:
            raise bad_request(f"unexpected json patch operation {kind!r}")
    return doc
