"""Object validation the simulator enforces (422 Invalid): object names for every
resource, and the ResourceSlice limits of protocols.md §4.1 and §4.4. Pure.

Values the real server could not even decode (a string where an int belongs, an int
outside int64, a capacity that is no quantity string) are field errors here too, so one
call reports everything a slice gets wrong; dracpu's tests run every slice it builds
through ``validate_resource_slice``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeGuard

from dracpu.allocation.quantity import QuantityError, parse_quantity
from dracpu_sim.apiserver.errors import FieldError

__all__ = [
    "validate_name",
    "validate_resource_slice",
    "validate_resource_slice_update",
]

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
IDENTIFIER_MESSAGE = (
    "a valid C identifier must start with alphabetic character or '_', followed by a string "
    "of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex "
    "used for validation is '[A-Za-z_][A-Za-z0-9_]*')"
)

MAX_DEVICES = 128
MAX_DEVICES_WITH_EXTRAS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_STRING = 64
MAX_LIST_VALUES_PER_DEVICE = 48
MAX_TAINTS = 16
API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_ATTRIBUTE_KINDS = ("int", "bool", "string", "version")
_LIST_ATTRIBUTE_KINDS = ("ints", "bools", "strings", "versions")


def _quote(value: object) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


def _invalid(field: str, value: object, why: str) -> FieldError:
    return FieldError("FieldValueInvalid", field, f"Invalid value: {_quote(value)}: {why}")


def _required(field: str, why: str = "") -> FieldError:
    return FieldError("FieldValueRequired", field, "Required value" + (f": {why}" if why else ""))


def _too_long(field: str, limit: int) -> FieldError:
    return FieldError("FieldValueTooLong", field, f"Too long: may not be more than {limit} bytes")


def _too_many(field: str, count: int, limit: int) -> FieldError:
    return FieldError(
        "FieldValueTooMany", field, f"Too many: {count}: must have at most {limit} items"
    )


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _dns_label(field: str, value: str) -> list[FieldError]:
    errors: list[FieldError] = []
    if len(value) > 63:
        errors.append(_invalid(field, value, "must be no more than 63 characters"))
    if not _DNS1123_LABEL.match(value):
        errors.append(_invalid(field, value, LABEL_MESSAGE))
    return errors


def _dns_subdomain(field: str, value: str, limit: int = 253) -> list[FieldError]:
    errors: list[FieldError] = []
    if len(value) > limit:
        errors.append(_invalid(field, value, f"must be no more than {limit} characters"))
    if not _DNS1123_SUBDOMAIN.match(value):
        errors.append(_invalid(field, value, SUBDOMAIN_MESSAGE))
    return errors


def validate_name(name: str) -> list[FieldError]:
    """``metadata.name`` of any object: a DNS subdomain of at most 253 characters."""
    return _dns_subdomain("metadata.name", name)


def _qualified_name(field: str, name: str) -> list[FieldError]:
    domain, sep, ident = name.rpartition("/")
    errors: list[FieldError] = []
    if sep:
        if not domain:
            errors.append(_required(field, "the domain must not be empty"))
        else:
            errors.extend(_dns_subdomain(field, domain, 63))
    if not ident:
        errors.append(_required(field, "name required"))
    else:
        if len(ident) > 32:
            errors.append(_too_long(field, 32))
        if not _C_IDENTIFIER.match(ident):
            errors.append(_invalid(field, ident, IDENTIFIER_MESSAGE))
    return errors


def _scalar(field: str, kind: str, value: object) -> list[FieldError]:
    """One attribute value of ``kind`` (a list kind checks one element)."""
    if kind in ("int", "ints"):
        if not _is_int(value) or not _INT64_MIN <= value <= _INT64_MAX:
            return [_invalid(field, value, "must be a 64-bit integer")]
    elif kind in ("bool", "bools"):
        if not isinstance(value, bool):
            return [_invalid(field, value, "must be a boolean")]
    elif not isinstance(value, str):
        return [_invalid(field, value, "must be a string")]
    elif len(value) > MAX_ATTRIBUTE_STRING:
        return [_too_long(field, MAX_ATTRIBUTE_STRING)]
    return []


def _attribute(field: str, value: Any) -> list[FieldError]:
    if not isinstance(value, Mapping):
        return [_invalid(field, str(value), "must be an object")]
    kinds = [k for k in (*_ATTRIBUTE_KINDS, *_LIST_ATTRIBUTE_KINDS) if value.get(k) is not None]
    if len(kinds) != 1:
        return [_required(field, "exactly one value must be specified")]
    kind = kinds[0]
    if kind in _ATTRIBUTE_KINDS:
        return _scalar(f"{field}.{kind}", kind, value[kind])
    items = value[kind]
    if not isinstance(items, list):
        return [_invalid(f"{field}.{kind}", str(items), "must be a list")]
    return [e for i, item in enumerate(items) for e in _scalar(f"{field}.{kind}[{i}]", kind, item)]


def _list_values(attributes: Mapping[str, Any]) -> int:
    return sum(
        len(attr[kind])
        for attr in attributes.values()
        if isinstance(attr, Mapping)
        for kind in _LIST_ATTRIBUTE_KINDS
        if isinstance(attr.get(kind), list)
    )


def _capacity_value(field: str, capacity: Any) -> list[FieldError]:
    """A capacity's value: a quantity string, as Kubernetes clients always send it."""
    value = capacity.get("value") if isinstance(capacity, Mapping) else None
    if isinstance(value, str):
        try:
            parse_quantity(value)
        except QuantityError:
            pass
        else:
            return []
    return [_invalid(f"{field}.value", value, "must be a quantity string")]


def _uses_extras(device: Mapping[str, Any]) -> bool:
    """Taints, consumed counters or list attributes lower the device limit to 64."""
    if device.get("taints") or device.get("consumesCounters"):
        return True
    attributes = device.get("attributes") or {}
    return isinstance(attributes, Mapping) and any(
        isinstance(a, Mapping) and any(a.get(k) is not None for k in _LIST_ATTRIBUTE_KINDS)
        for a in attributes.values()
    )


def _device(field: str, device: Any) -> list[FieldError]:
    if not isinstance(device, Mapping):
        return [_invalid(field, str(device), "must be an object")]
    errors: list[FieldError] = []
    name = device.get("name")
    if not name:
        errors.append(_required(f"{field}.name"))
    else:
        errors.extend(_dns_label(f"{field}.name", str(name)))
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    for what, value in (("attributes", attributes), ("capacity", capacity)):
        if not isinstance(value, Mapping):
            errors.append(_invalid(f"{field}.{what}", str(value), "must be an object"))
    if not (isinstance(attributes, Mapping) and isinstance(capacity, Mapping)):
        return errors
    for key, value in attributes.items():
        errors.extend(_qualified_name(f"{field}.attributes", key))
        errors.extend(_attribute(f"{field}.attributes[{key}]", value))
    list_values = _list_values(attributes)
    if list_values > MAX_LIST_VALUES_PER_DEVICE:
        errors.append(
            _invalid(
                f"{field}.attributes",
                list_values,
                "the total number of values in list attributes must not exceed "
                f"{MAX_LIST_VALUES_PER_DEVICE}",
            )
        )
    for key, cap in capacity.items():
        errors.extend(_qualified_name(f"{field}.capacity", key))
        errors.extend(_capacity_value(f"{field}.capacity[{key}]", cap))
    combined = len(attributes) + len(capacity)
    if combined > MAX_ATTRIBUTES_AND_CAPACITIES:
        errors.append(
            _invalid(
                field,
                combined,
                "the total number of attributes and capacities must not exceed "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES}",
            )
        )
    taints = device.get("taints") or []
    if len(taints) > MAX_TAINTS:
        errors.append(_too_many(f"{field}.taints", len(taints), MAX_TAINTS))
    return errors


_NODE_CHOICES = "`nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`"


def _pool_name(name: object) -> list[FieldError]:
    """DNS subdomains joined by '/', at most 253 characters in all."""
    if not name:
        return [_required("spec.pool.name")]
    if not isinstance(name, str):
        return [_invalid("spec.pool.name", name, "must be a string")]
    errors = [_too_long("spec.pool.name", 253)] if len(name) > 253 else []
    for part in name.split("/"):
        errors.extend(_dns_subdomain("spec.pool.name", part))
    return errors


def _pool(pool: Any) -> list[FieldError]:
    if not isinstance(pool, Mapping):
        return [_invalid("spec.pool", str(pool), "must be an object")]
    errors = _pool_name(pool.get("name"))
    count = pool.get("resourceSliceCount")
    if not _is_int(count) or count <= 0:
        errors.append(
            _invalid("spec.pool.resourceSliceCount", count or 0, "must be greater than zero")
        )
    generation = pool.get("generation", 0)
    if not _is_int(generation) or generation < 0:
        errors.append(
            _invalid("spec.pool.generation", generation, "must be greater than or equal to 0")
        )
    return errors


def _spec(spec: Mapping[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    driver = spec.get("driver")
    if not driver:
        errors.append(_required("spec.driver"))
    else:
        errors.extend(_dns_subdomain("spec.driver", str(driver), 63))
    errors.extend(_pool(spec.get("pool") or {}))
    chosen = [
        k
        for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
        if spec.get(k) not in (None, "", False)
    ]
    if not chosen:
        errors.append(_required("spec", f"exactly one of {_NODE_CHOICES} is required"))
    elif len(chosen) > 1:
        errors.append(
            _invalid(
                "spec",
                "{" + ", ".join(f"`{c}`" for c in chosen) + "}",
                f"exactly one of {_NODE_CHOICES} is required, but multiple fields are set",
            )
        )
    node_name = spec.get("nodeName")
    if node_name:
        errors.extend(_dns_subdomain("spec.nodeName", str(node_name)))
    devices = spec.get("devices") or []
    if not isinstance(devices, list):
        return [*errors, _invalid("spec.devices", str(devices), "must be a list")]
    limit = (
        MAX_DEVICES_WITH_EXTRAS
        if any(isinstance(d, Mapping) and _uses_extras(d) for d in devices)
        else MAX_DEVICES
    )
    if len(devices) > limit:
        errors.append(_too_many("spec.devices", len(devices), limit))
    seen: set[str] = set()
    for i, device in enumerate(devices):
        field = f"spec.devices[{i}]"
        errors.extend(_device(field, device))
        name = device.get("name") if isinstance(device, Mapping) else None
        if isinstance(name, str) and name:
            if name in seen:
                errors.append(
                    FieldError(
                        "FieldValueDuplicate", f"{field}.name", f"Duplicate value: {_quote(name)}"
                    )
                )
            seen.add(name)
    return errors


def _header(obj: Mapping[str, Any]) -> list[FieldError]:
    """apiVersion and kind, where the object names them (the store fills them in)."""
    errors: list[FieldError] = []
    for key, want in (("apiVersion", API_VERSION), ("kind", KIND)):
        got = obj.get(key)
        if got not in (None, "", want):
            errors.append(_invalid(key, got, f"must be {_quote(want)}"))
    return errors


def validate_resource_slice(obj: Mapping[str, Any]) -> list[FieldError]:
    """Everything the server would reject in a new ResourceSlice, one error per problem."""
    errors = _header(obj)
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return [*errors, _required("spec")]
    return errors + _spec(spec)


def validate_resource_slice_update(
    new: Mapping[str, Any], old: Mapping[str, Any]
) -> list[FieldError]:
    errors = validate_resource_slice(new)
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    for key in ("driver", "nodeName"):
        if new_spec.get(key) != old_spec.get(key):
            errors.append(_invalid(f"spec.{key}", new_spec.get(key) or "", "field is immutable"))
    return errors
