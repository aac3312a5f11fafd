"""OpenAPI v3 discovery and documents for the groups the simulated API server serves. Pure.

kubectl downloads these before it writes anything: ``kubectl create -f`` and ``kubectl
apply -f`` (with the default ``--validate=strict``) read ``/openapi/v3`` and then the
document of the object's group version, and ask whether that document's PATCH operation
for the kind takes the ``fieldValidation`` query parameter. When it does, kubectl leaves
validation to the server and sends ``fieldValidation=Strict``; without any OpenAPI it
stops with "failed to download openapi". ``kubectl explain`` walks the same documents'
schemas (``x-kubernetes-group-version-kind`` marks a kind's root schema; fields point to
their types with ``allOf: [{$ref}]``, as the real server writes them).

The shapes follow the real server:

- ``GET /openapi/v3``: ``{"paths": {"api/v1": {"serverRelativeURL":
  "/openapi/v3/api/v1?hash=<hash>"}, "apis/<group>/<version>": {...}}}``;
- ``GET /openapi/v3/api/v1`` (any ``hash``): an OpenAPI 3.0 document with the group
  version's ``paths`` (one per collection and per object, with ``x-kubernetes-action`` and
  ``x-kubernetes-group-version-kind`` on each operation) and ``components.schemas`` named
  ``io.k8s.api.<group>.<version>.<Kind>`` (``io.k8s.apimachinery.pkg.apis.meta.v1.*`` for
  object metadata).

The schemas are made from the ``kubernetes`` client's models (its field names, types and
descriptions come from the upstream OpenAPI), so they need no second copy of the API in
this repository. ``unknown_fields`` is what ``fieldValidation=Strict`` (kubectl's
default) checks on every write: the body of a create or an update (``check_strict``), the
patched object of a patch (``store.patch``); server-side apply checks it always
(``apply.py``). Every field of the object must be in its kind's schema, so a misspelt key
is refused instead of dropped.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from dracpu_sim.apiserver.list_keys import MERGE_KEYS
from dracpu_sim.apiserver.resources import RESOURCES, ResourceType

__all__ = [
    "UnknownField",
    "check_strict",
    "document",
    "is_openapi_path",
    "root_document",
    "strict_decoding_error",
    "strict_problems",
    "unknown_fields",
]

_PREFIX = "/openapi/v3"
_META = "io.k8s.apimachinery.pkg.apis.meta.v1"
_META_MODELS = {
    "V1ObjectMeta": "ObjectMeta",
    "V1ListMeta": "ListMeta",
    "V1OwnerReference": "OwnerReference",
    "V1ManagedFieldsEntry": "ManagedFieldsEntry",
    "V1Status": "Status",
    "V1StatusDetails": "StatusDetails",
    "V1StatusCause": "StatusCause",
    "V1DeleteOptions": "DeleteOptions",
    "V1Preconditions": "Preconditions",
    "V1LabelSelector": "LabelSelector",
    "V1LabelSelectorRequirement": "LabelSelectorRequirement",
}
# The client's model of each served kind (where the name alone would be ambiguous the
# client prefixes the group).
_KIND_MODELS = {
    ("resource.k8s.io", "ResourceSlice"): "V1ResourceSlice",
    ("resource.k8s.io", "ResourceClaim"): "ResourceV1ResourceClaim",
    ("resource.k8s.io", "ResourceClaimTemplate"): "V1ResourceClaimTemplate",
    ("resource.k8s.io", "DeviceClass"): "V1DeviceClass",
    ("", "Node"): "V1Node",
    ("", "Pod"): "V1Pod",
    ("apps", "Deployment"): "V1Deployment",
}
# Core types reached from a kind of another group (a Deployment's pod template).
_CORE_ROOTS = ("V1Pod", "V1Node", "V1PodTemplateSpec")
_WRITE_PARAMS = ("dryRun", "fieldManager", "fieldValidation")


def is_openapi_path(path: str) -> bool:
    return path == _PREFIX or path.startswith(_PREFIX + "/")


def _group_versions() -> list[tuple[str, str]]:
    return list(dict.fromkeys((r.group, r.version) for r in RESOURCES))


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def root_document() -> dict[str, Any]:
    """``GET /openapi/v3``: where each group version's document is."""
    paths = {}
    for group, version in _group_versions():
        gv = _gv_path(group, version)
        paths[gv] = {"serverRelativeURL": f"{_PREFIX}/{gv}?hash={_hash(group, version)}"}
    return {"paths": paths}


def document(path: str) -> dict[str, Any] | None:
    """The document served at ``path`` (``/openapi/v3`` or a group version's), or None."""
    path = path.rstrip("/")
    if path == _PREFIX:
        return root_document()
    for group, version in _group_versions():
        if path == f"{_PREFIX}/{_gv_path(group, version)}":
            return json.loads(_document_json(group, version))  # type: ignore[no-any-return]
    return None


def _hash(group: str, version: str) -> str:
    return hashlib.sha512(_document_json(group, version).encode()).hexdigest()[:128].upper()


@functools.cache
def _parsed(group: str, version: str) -> dict[str, Any]:
    """The document as objects, for the strict check (read only: shared between calls)."""
    return json.loads(_document_json(group, version))  # type: ignore[no-any-return]


@functools.cache
def _document_json(group: str, version: str) -> str:
    schemas = _Schemas(core=_core_models())
    paths: dict[str, Any] = {}
    for resource in RESOURCES:
        if (resource.group, resource.version) != (group, version):
            continue
        root = schemas.kind_schema(resource)
        paths.update(_paths(resource, root))
    doc = {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.34.0"},
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.schemas.items()))},
    }
    return json.dumps(doc, sort_keys=False)


@dataclass(frozen=True, slots=True)
class UnknownField:
    """A field the kind's schema does not have, named two ways: ``path`` as the strict JSON
    decoder writes it (``spec.containers[0].imagee``), ``apply_path`` as server-side
    apply's schema check does (``.spec.containers[name="worker"].imagee``)."""

    path: str
    apply_path: str


def unknown_fields(resource: ResourceType, obj: Any) -> list[UnknownField]:
    """Every field of ``obj`` its kind's schema does not know, in document order."""
    if (resource.group, resource.version) not in _group_versions() or not isinstance(obj, dict):
        return []
    schemas = _parsed(resource.group, resource.version)["components"]["schemas"]
    gvk = {"group": resource.group, "version": resource.version, "kind": resource.kind}
    root = next(
        (n for n, s in schemas.items() if gvk in s.get("x-kubernetes-group-version-kind", [])),
        None,
    )
    if root is None:
        return []
    unknown: list[UnknownField] = []
    _walk(schemas, schemas[root], obj, UnknownField("", ""), unknown)
    return unknown


def strict_decoding_error(unknown: list[UnknownField]) -> str:
    """``runtime.NewStrictDecodingError``'s text (apimachinery pkg/runtime/error.go)."""
    return "strict decoding error: " + ", ".join(f'unknown field "{u.path}"' for u in unknown)


def strict_problems(resource: ResourceType, obj: Any) -> str | None:
    """The real server's message when ``obj`` has fields its kind does not know, or None
    (``transformDecodeError`` in apiserver pkg/endpoints/handlers/rest.go)."""
    unknown = unknown_fields(resource, obj)
    if not unknown:
        return None
    return (
        f'{resource.kind} in version "{resource.version}" cannot be handled as a '
        f"{resource.kind}: {strict_decoding_error(unknown)}"
    )


def check_strict(resource: ResourceType, obj: Any) -> None:
    """``fieldValidation=Strict`` on a create or an update (PUT): an ``ApiError`` (400)
    when ``obj`` has unknown fields."""
    from dracpu_sim.apiserver import errors

    problem = strict_problems(resource, obj)
    if problem is not None:
        raise errors.bad_request(problem)


def _resolve(schemas: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema["allOf"][0]["$ref"] if "allOf" in schema else schema.get("$ref")
    if ref:
        resolved: dict[str, Any] = schemas[ref.rsplit("/", 1)[1]]
        return resolved
    return schema


def _item_key(field: str, index: int, item: Any) -> str:
    """A list item in an apply path: ``[name="worker"]`` in a keyed list, else ``[0]``."""
    key = MERGE_KEYS.get(field)
    if key is not None and isinstance(item, dict) and key in item:
        return f"[{key}={json.dumps(item[key])}]"
    return f"[{index}]"


def _walk(
    schemas: dict[str, Any],
    schema: dict[str, Any],
    value: Any,
    at: UnknownField,
    unknown: list[UnknownField],
) -> None:
    schema = _resolve(schemas, schema)
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            where = UnknownField(
                f"{at.path}.{key}" if at.path else str(key), f"{at.apply_path}.{key}"
            )
            prop = schema["properties"].get(key)
            if prop is None:
                unknown.append(where)
            else:
                _walk(schemas, prop, item, where, unknown)
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, item in value.items():
            where = UnknownField(f"{at.path}.{key}", f"{at.apply_path}.{key}")
            _walk(schemas, schema["additionalProperties"], item, where, unknown)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        field = at.apply_path.rsplit(".", 1)[-1]
        for index, item in enumerate(value):
            where = UnknownField(
                f"{at.path}[{index}]", at.apply_path + _item_key(field, index, item)
            )
            _walk(schemas, schema["items"], item, where, unknown)


# -- schemas from the client's models ------------------------------------------------------


def _model(name: str) -> type[Any]:
    import kubernetes.client

    model: type[Any] = getattr(kubernetes.client, name)
    return model


def _is_model(value: object) -> bool:
    return isinstance(value, type) and hasattr(value, "model_fields")


@functools.cache
def _core_models() -> frozenset[str]:
    """Every model a core v1 kind reaches: those are ``io.k8s.api.core.v1`` types."""
    return _reachable(*_CORE_ROOTS)


@functools.cache
def _apps_models() -> frozenset[str]:
    """The models only a Deployment reaches: ``io.k8s.api.apps.v1`` types."""
    return _reachable(_KIND_MODELS[("apps", "Deployment")]) - _core_models()


def _reachable(*roots: str) -> frozenset[str]:
    seen: set[str] = set()
    todo = [_model(name) for name in roots]
    while todo:
        model = todo.pop()
        if model.__name__ in seen:
            continue
        seen.add(model.__name__)
        for field in model.model_fields.values():
            todo.extend(m for m in _models_in(field.annotation) if m.__name__ not in seen)
    return frozenset(seen)


def _models_in(annotation: Any) -> list[type[Any]]:
    if _is_model(annotation):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _short_name(model_name: str) -> str:
    for prefix in ("ResourceV1", "CoreV1", "V1"):
        if model_name.startswith(prefix):
            return model_name[len(prefix) :]
    return model_name


class _Schemas:
    """Collects ``components.schemas`` while walking from the served kinds."""

    def __init__(self, core: frozenset[str]) -> None:
        self.core = core
        self.schemas: dict[str, Any] = {}

    def schema_name(self, model: type[Any]) -> str:
        name = model.__name__
        if name in _META_MODELS:
            return f"{_META}.{_META_MODELS[name]}"
        if name in self.core or name.startswith("CoreV1"):
            return f"io.k8s.api.core.v1.{_short_name(name)}"
        if name in _apps_models():
            return f"io.k8s.api.apps.v1.{_short_name(name)}"
        return f"io.k8s.api.resource.v1.{_short_name(name)}"

    def kind_schema(self, resource: ResourceType) -> str:
        model = _model(_KIND_MODELS[(resource.group, resource.kind)])
        name = self.add(model)
        gvk = {"group": resource.group, "version": resource.version, "kind": resource.kind}
        self.schemas[name]["x-kubernetes-group-version-kind"] = [gvk]
        return name

    def add(self, model: type[Any]) -> str:
        name = self.schema_name(model)
        if name in self.schemas:
            return name
        schema: dict[str, Any] = {"type": "object", "properties": {}}
        self.schemas[name] = schema  # before the fields: models refer to themselves
        description = _model_description(model)
        if description:
            schema["description"] = description
        required = []
        for attr, field in model.model_fields.items():
            wire = model.attribute_map.get(attr, attr)
            prop = self.type_schema(field.annotation)
            # The client keeps no description for a field of a model type; the type's
            # own first sentence says what it holds.
            described = field.description or _first_sentence(field.annotation)
            if described:
                prop["description"] = described
            schema["properties"][wire] = prop
            if field.is_required():
                required.append(wire)
        if required:
            schema["required"] = required
        return name

    def type_schema(self, annotation: Any) -> dict[str, Any]:
        origin = typing.get_origin(annotation)
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if origin is typing.Annotated:
            return self.type_schema(args[0])
        if origin in (typing.Union, types.UnionType):
            if len(args) == 1:
                return self.type_schema(args[0])
            # int | str: an IntOrString such as a container port name or number.
            return {"type": "string", "format": "int-or-string", "x-kubernetes-int-or-string": True}
        if origin in (list, typing.List):  # noqa: UP006
            return {"type": "array", "items": self.type_schema(args[0])}
        if origin in (dict, typing.Dict):  # noqa: UP006
            return {"type": "object", "additionalProperties": self.type_schema(args[1])}
        if _is_model(annotation):
            name = self.add(annotation)
            return {"allOf": [{"$ref": f"#/components/schemas/{name}"}]}
        simple = {
            str: {"type": "string"},
            bool: {"type": "boolean"},
            int: {"type": "integer", "format": "int64"},
            float: {"type": "number", "format": "double"},
            datetime.datetime: {"type": "string", "format": "date-time"},
            datetime.date: {"type": "string", "format": "date"},
        }.get(annotation)
        if simple is not None:
            return dict(simple)
        # object / Any: free-form JSON (opaque parameters, raw extensions).
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _first_sentence(annotation: Any) -> str:
    models = _models_in(annotation)
    if len(models) != 1:
        return ""
    text = _model_description(models[0])
    return text.split(". ", 1)[0].rstrip(".") + "." if text else ""


def _model_description(model: type[Any]) -> str:
    """The model's first docstring paragraphs (the generator appends an Attributes list)."""
    text = (model.__doc__ or "").strip()
    text = text.split("\n\n    Attributes:", 1)[0].split("\nAttributes:", 1)[0]
    return "\n".join(line.strip() for line in text.splitlines()).strip()


# -- paths ---------------------------------------------------------------------------------


def _param(name: str, where: str = "query") -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "schema": {"type": "string", "uniqueItems": True},
    }


def _ref(schema: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{schema}"}


def _operation(
    resource: ResourceType, action: str, verb: str, schema: str, *, body: bool, writes: bool
) -> dict[str, Any]:
    gvk = {"group": resource.group, "version": resource.version, "kind": resource.kind}
    op: dict[str, Any] = {
        "operationId": f"{verb}{resource.kind}",
        "parameters": [_param(p) for p in _WRITE_PARAMS] if writes else [],
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": _ref(schema)}}}
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk,
    }
    if body:
        media = (
            [
                "application/apply-patch+yaml",
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
            ]
            if action == "patch"
            else ["application/json"]
        )
        content_schema = {"type": "object"} if action == "patch" else _ref(schema)
        op["requestBody"] = {
            "content": {m: {"schema": content_schema} for m in media},
            "required": True,
        }
    return op


def _paths(resource: ResourceType, schema: str) -> dict[str, Any]:
    base = resource.group_prefix
    scope = f"{base}/namespaces/{{namespace}}" if resource.namespaced else base
    path_params = [_param("namespace", "path")] if resource.namespaced else []
    collection = f"{scope}/{resource.plural}"
    item = f"{collection}/{{name}}"
    paths: dict[str, Any] = {
        collection: {
            "get": _operation(resource, "list", "list", schema, body=False, writes=False),
            "post": _operation(resource, "post", "create", schema, body=True, writes=True),
            "parameters": path_params,
        },
        item: {
            "get": _operation(resource, "get", "read", schema, body=False, writes=False),
            "put": _operation(resource, "put", "replace", schema, body=True, writes=True),
            "patch": _operation(resource, "patch", "patch", schema, body=True, writes=True),
            "delete": _operation(resource, "delete", "delete", schema, body=False, writes=False),
            "parameters": [*path_params, _param("name", "path")],
        },
    }
    if resource.has_status:
        paths[f"{item}/status"] = {
            "get": _operation(resource, "get", "read", schema, body=False, writes=False),
            "put": _operation(resource, "put", "replace", schema, body=True, writes=True),
            "patch": _operation(resource, "patch", "patch", schema, body=True, writes=True),
            "parameters": [*path_params, _param("name", "path")],
        }
    return paths
