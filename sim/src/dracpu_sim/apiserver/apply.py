"""Server-side apply: ``PATCH`` with ``Content-Type: application/apply-patch+yaml``, as
``kubectl apply --server-side`` sends it. Pure.

The body is the caller's whole intent for the object (an "applied configuration"). Its
checks follow the real server (kubernetes/kubernetes v1.34):

- a body that is not a YAML or JSON object: 400 ``error decoding YAML: ...``
  (apiserver pkg/endpoints/handlers/patch.go ``applyPatcher``);
- an apiVersion or kind other than the URL's: 400 ``invalid object type: <gvk>``
  (apimachinery pkg/util/managedfields/internal/versioncheck.go);
- ``metadata.managedFields`` set: 400 ``metadata.managedFields must be nil``
  (internal/structuredmerge.go);
- a field the kind's schema does not know: ``failed to create typed patch object (...):
  .spec.x: field not declared in schema`` (structuredmerge.go and structured-merge-diff's
  typed validation). The real server returns that error unwrapped, so it is a 500 with no
  reason, and apply refuses unknown fields whatever ``fieldValidation`` says.

Merging: maps merge key by key, keyed lists (``list_keys``) item by item, other lists
and scalars are replaced; a field this field manager applied before and leaves out now is
removed. A list keyed on several fields is named by its path (``PATH_KEYS``):
``ResourceClaim.status.devices`` is ``listType=map`` on driver, device, pool and shareID,
so each driver's entries merge apart and a driver that applies again without an entry it
applied before removes it, leaving other drivers' entries alone. Simplified against the
real field manager: the simulator keeps each manager's last applied configuration instead
of ``metadata.managedFields`` (which it does not serve), and it does not detect conflicts
between managers (``force`` changes nothing).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import yaml

from dracpu.yamlguard import YamlTooDeep, check_nesting
from dracpu_sim.apiserver import errors, openapi
from dracpu_sim.apiserver.list_keys import MERGE_KEYS, PRIMITIVE_SETS
from dracpu_sim.apiserver.resources import ResourceType

__all__ = [
    "APPLY_PATCH",
    "PATH_KEYS",
    "applied_configuration",
    "decode_apply_body",
    "merge_applied",
]

APPLY_PATCH = "application/apply-patch+yaml"

Obj = dict[str, Any]

# Associative lists keyed on more than one field, by their path from the object's root
# (k8s.io/api resource/v1 types.go: ResourceClaimStatus.Devices, +listMapKey each).
PATH_KEYS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("status", "devices"): ("driver", "device", "pool", "shareID"),
}


class _Loader(yaml.SafeLoader):
    """YAML as sigs.k8s.io/yaml reads it for an object: timestamps stay strings."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "bool", int: "number", float: "number"}.get(
        type(value), "value"
    )


def decode_apply_body(body: bytes) -> Obj:
    """The applied configuration in a request body (JSON is YAML too)."""
    try:
        text = body.decode("utf-8")
        try:
            value = json.loads(text)
        except ValueError:
            check_nesting(text, _Loader)
            value = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except (UnicodeDecodeError, yaml.YAMLError, YamlTooDeep, RecursionError) as exc:
        raise errors.bad_request(f"error decoding YAML: {exc}") from None
    if not isinstance(value, dict):
        raise errors.bad_request(
            "error decoding YAML: error unmarshaling JSON: while decoding JSON: json: cannot "
            f"unmarshal {_json_kind(value)} into Go value of type map[string]interface {{}}"
        )
    return value


def _gvk(api_version: Any, kind: Any) -> str:
    """A GroupVersionKind as Go prints it: ``resource.k8s.io/v1, Kind=ResourceClaim``,
    ``/v1, Kind=Pod``."""
    group, _, version = str(api_version or "").rpartition("/")
    return f"{group}/{version}, Kind={kind or ''}"


def applied_configuration(resource: ResourceType, config: Obj) -> Obj:
    """``config`` checked as the real field manager checks it before merging."""
    api_version, kind = config.get("apiVersion"), config.get("kind")
    if api_version != resource.api_version or kind != resource.kind:
        raise errors.bad_request(f"invalid object type: {_gvk(api_version, kind)}")
    meta = config.get("metadata")
    if isinstance(meta, dict) and meta.get("managedFields") is not None:
        raise errors.bad_request("metadata.managedFields must be nil")
    unknown = openapi.unknown_fields(resource, config)
    if unknown:
        meta = meta if isinstance(meta, dict) else {}
        where = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
        paths = [f"{u.apply_path}: field not declared in schema" for u in unknown]
        problems = paths[0] if len(paths) == 1 else "\n  ".join(["errors:", *paths])
        raise errors.internal(
            f"failed to create typed patch object ({where}; {_gvk(api_version, kind)}): {problems}"
        )
    return config


def merge_applied(
    live: Any, applied: Any, previous: Any, field: str = "", path: tuple[str, ...] = ()
) -> Any:
    """``live`` with ``applied`` merged in, less what ``previous`` (the same manager's last
    applied configuration) had and ``applied`` no longer has. ``path`` is where ``live``
    sits from the object's root (``()`` below keyed list items)."""
    keys = PATH_KEYS.get(path)
    if keys is not None and isinstance(live, list | None) and isinstance(applied, list):
        items = [*(live or []), *applied, *(previous or [])]
        if all(isinstance(i, dict) for i in items):
            return _merge_keyed(live or [], applied, previous, _fields_key(keys), field)
    if keys is not None and isinstance(live, list) and applied is None:
        # The manager no longer applies the list at all: only its own entries go.
        items = [*live, *(previous or [])]
        if all(isinstance(i, dict) for i in items):
            return _merge_keyed(live, [], previous, _fields_key(keys), field)
    if isinstance(live, dict) and isinstance(applied, dict):
        before = previous if isinstance(previous, dict) else {}
        merged = dict(live)
        for key in before:
            if key not in applied:
                merged.pop(key, None)
                # A map or multi-key list the manager no longer applies: only what it
                # applied goes (others' fields and entries stay).
                old_value, kept = live.get(key), None
                if isinstance(old_value, dict) and isinstance(before[key], dict):
                    kept = merge_applied(old_value, {}, before[key], key, (*path, key))
                elif (*path, key) in PATH_KEYS and isinstance(old_value, list):
                    kept = merge_applied(old_value, None, before[key], key, (*path, key))
                if kept:
                    merged[key] = kept
        for key, value in applied.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = merge_applied(
                    live.get(key), value, before.get(key), key, (*path, key)
                )
        return merged
    if isinstance(live, list) and isinstance(applied, list):
        if field in PRIMITIVE_SETS:
            dropped = [v for v in previous or [] if v not in applied]
            kept = [v for v in live if v not in dropped]
            return [*kept, *(v for v in applied if v not in kept)]
        key = MERGE_KEYS.get(field)
        if key is not None and all(isinstance(i, dict) for i in [*live, *applied]):
            return _merge_keyed(live, applied, previous, _field_key(key), field)
    return copy.deepcopy(applied)


def _field_key(name: str) -> Callable[[Obj], Any]:
    return lambda item: item.get(name)


def _fields_key(names: tuple[str, ...]) -> Callable[[Obj], Any]:
    # An unset key field and an empty one are the same key (the API omits both).
    return lambda item: tuple(item.get(n) or "" for n in names)


def _merge_keyed(
    live: list[Obj], applied: list[Obj], previous: Any, key: Callable[[Obj], Any], field: str
) -> Any:
    wanted = {key(item) for item in applied}
    before = {key(i): i for i in previous or [] if isinstance(i, dict)}
    merged = [i for i in live if key(i) in wanted or key(i) not in before]
    for item in applied:
        where = next((n for n, old in enumerate(merged) if key(old) == key(item)), None)
        if where is None:
            merged.append(copy.deepcopy(item))
        else:
            merged[where] = merge_applied(merged[where], item, before.get(key(item)), field)
    return merged
