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
removed. Simplified against the real field manager: the simulator keeps each manager's
last applied configuration instead of ``metadata.managedFields`` (which it does not
serve), and it does not detect conflicts between managers (``force`` changes nothing).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml

from dracpu.yamlguard import YamlTooDeep, check_nesting
from dracpu_sim.apiserver import errors, openapi
from dracpu_sim.apiserver.list_keys import MERGE_KEYS, PRIMITIVE_SETS
from dracpu_sim.apiserver.resources import ResourceType

__all__ = ["APPLY_PATCH", "applied_configuration", "decode_apply_body", "merge_applied"]

APPLY_PATCH = "application/apply-patch+yaml"

Obj = dict[str, Any]


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


def merge_applied(live: Any, applied: Any, previous: Any, field: str = "") -> Any:
    """``live`` with ``applied`` merged in, less what ``previous`` (the same manager's last
    applied configuration) had and ``applied`` no longer has."""
    if isinstance(live, dict) and isinstance(applied, dict):
        before = previous if isinstance(previous, dict) else {}
        merged = dict(live)
        for key in before:
            if key not in applied:
                merged.pop(key, None)
        for key, value in applied.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = merge_applied(live.get(key), value, before.get(key), key)
        return merged
    if isinstance(live, list) and isinstance(applied, list):
        if field in PRIMITIVE_SETS:
            dropped = [v for v in previous or [] if v not in applied]
            kept = [v for v in live if v not in dropped]
            return [*kept, *(v for v in applied if v not in kept)]
        key = MERGE_KEYS.get(field)
        if key is not None and all(isinstance(i, dict) for i in [*live, *applied]):
            return _merge_keyed(live, applied, previous, key, field)
    return copy.deepcopy(applied)


def _merge_keyed(live: list[Obj], applied: list[Obj], previous: Any, key: str, field: str) -> Any:
    wanted = {item.get(key) for item in applied}
    before = {i.get(key): i for i in previous or [] if isinstance(i, dict)}
    merged = [i for i in live if i.get(key) in wanted or i.get(key) not in before]
    for item in applied:
        where = next((n for n, old in enumerate(merged) if old.get(key) == item.get(key)), None)
        if where is None:
            merged.append(copy.deepcopy(item))
        else:
            merged[where] = merge_applied(merged[where], item, before.get(item.get(key)), field)
    return merged
