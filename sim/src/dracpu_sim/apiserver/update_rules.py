"""What an update may change, per kind, with the real server's 422 texts. Pure.

Every write that replaces a stored object (PUT, every kind of PATCH, server-side apply)
runs these on (new, old). Sources, kubernetes/kubernetes at v1.34:

- Pods: ``ValidatePodUpdate`` and ``ValidateContainerUpdates`` in
  pkg/apis/core/validation/validation.go. A pod's spec is fixed once created except the
  containers' and init containers' images, ``activeDeadlineSeconds`` (set, or lowered),
  added tolerations, removed scheduling gates, and ``terminationGracePeriodSeconds`` from a
  negative value to 1. Anything else (``resourceClaims``, a container's resources or
  command, ``nodeName`` outside ``pods/binding``) is ``spec: Forbidden: pod updates may
  not change fields other than ...`` followed by a diff of the spec.
- ResourceClaims and ResourceClaimTemplates: ``ValidateResourceClaimUpdate`` and
  ``ValidateResourceClaimTemplateUpdate`` in pkg/apis/resource/validation/validation.go:
  ``spec: Invalid value: <the new spec>: field is immutable`` (``ValidateImmutableField``
  in apimachinery pkg/api/validation/generic.go).

Bad values print as a v1.34 server prints them (``errors.bad_value``). The pod diff is a
simplified rendering of Go's ``cmp.Diff`` of the internal PodSpec: one ``-``/``+`` pair
per changed field, values as JSON.
"""

from __future__ import annotations

import json
from typing import Any

from dracpu_sim.apiserver.errors import FieldError, bad_value

__all__ = ["immutable_spec", "validate_pod_update"]

Obj = dict[str, Any]

# updatablePodSpecFields, joined with "," as ValidatePodUpdate joins them.
_UPDATABLE_POD_SPEC_FIELDS = ",".join(
    (
        "`spec.containers[*].image`",
        "`spec.initContainers[*].image`",
        "`spec.activeDeadlineSeconds`",
        "`spec.tolerations` (only additions to existing tolerations)",
        "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously "
        "negative)",
    )
)
FIELD_IMMUTABLE = "field is immutable"  # apimachinery validation.FieldImmutableErrorMsg
_MAX_INT32 = (1 << 31) - 1
# JSON names whose Go field names are not the name with its first letter capitalised.
_GO_NAMES = {"dnsPolicy": "DNSPolicy", "dnsConfig": "DNSConfig", "os": "OS"}


def _forbidden(field: str, detail: str) -> FieldError:
    return FieldError("FieldValueForbidden", field, f"Forbidden: {detail}")


def _invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueInvalid", field, f"Invalid value: {bad_value(value)}: {detail}")


def _semantic(value: Any) -> Any:
    """``apiequality.Semantic``: null, an empty list and an empty map equal a missing field."""
    if isinstance(value, dict):
        return {k: _semantic(v) for k, v in value.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [_semantic(v) for v in value]
    return value


def immutable_spec(new: Obj, old: Obj) -> list[FieldError]:
    """ResourceClaim and ResourceClaimTemplate: the whole spec is fixed at creation."""
    new_spec, old_spec = new.get("spec"), old.get("spec")
    if _semantic(new_spec) == _semantic(old_spec):
        return []
    return [_invalid("spec", new_spec if new_spec is not None else {}, FIELD_IMMUTABLE)]


def validate_pod_update(new: Obj, old: Obj) -> list[FieldError]:
    new_spec = _semantic(_mapping(new.get("spec")))
    old_spec = _semantic(_mapping(old.get("spec")))
    errors: list[FieldError] = []
    for field in ("containers", "initContainers"):
        found, stop = _container_updates(new_spec.get(field), old_spec.get(field), field)
        errors += found
        if stop:
            return errors
    deadline = _deadline(new_spec.get("activeDeadlineSeconds"), old_spec)
    if deadline is not None:
        return [*errors, deadline]
    if new_spec.get("activeDeadlineSeconds") is None and "activeDeadlineSeconds" in old_spec:
        errors.append(
            _invalid(
                "spec.activeDeadlineSeconds",
                None,
                "must not update from a positive integer to nil value",
            )
        )
    errors += _only_added_tolerations(new_spec.get("tolerations"), old_spec.get("tolerations"))
    errors += _only_deleted_gates(new_spec.get("schedulingGates"), old_spec.get("schedulingGates"))
    if new_spec == old_spec:
        return errors
    munged = _munged(new_spec, old_spec)
    if munged != old_spec:
        errors.append(
            _forbidden(
                "spec",
                f"pod updates may not change fields other than {_UPDATABLE_POD_SPEC_FIELDS}\n"
                + _spec_diff(old_spec, munged),
            )
        )
    return errors


def _mapping(value: Any) -> Obj:
    return value if isinstance(value, dict) else {}


def _container_updates(new: Any, old: Any, field: str) -> tuple[list[FieldError], bool]:
    new_list = new if isinstance(new, list) else []
    old_list = old if isinstance(old, list) else []
    if len(new_list) != len(old_list):
        return [_forbidden(f"spec.{field}", "pod updates may not add or remove containers")], True
    errors: list[FieldError] = []
    for i, container in enumerate(new_list):
        image = container.get("image", "") if isinstance(container, dict) else ""
        if not image:
            errors.append(
                FieldError("FieldValueRequired", f"spec.{field}[{i}].image", "Required value")
            )
        elif isinstance(image, str) and image.strip() != image:
            errors.append(
                _invalid(
                    f"spec.{field}[{i}].image",
                    image,
                    "must not have leading or trailing whitespace",
                )
            )
    return errors, False


def _deadline(new: Any, old_spec: Obj) -> FieldError | None:
    """Two changes are allowed: from unset to a positive value, and to a lesser one."""
    if new is None:
        return None
    field = "spec.activeDeadlineSeconds"
    if not isinstance(new, int) or not 0 <= new <= _MAX_INT32:
        return _invalid(field, new, f"must be between 0 and {_MAX_INT32}, inclusive")
    old = old_spec.get("activeDeadlineSeconds")
    if isinstance(old, int) and old < new:
        return _invalid(field, new, "must be less than or equal to previous value")
    return None


def _only_added_tolerations(new: Any, old: Any) -> list[FieldError]:
    """validateOnlyAddedTolerations: each old toleration is still there, give or take its
    tolerationSeconds."""
    new_list = [t for t in new or [] if isinstance(t, dict)]
    for existing in old or []:
        if not isinstance(existing, dict):
            continue
        if not any(
            {**existing, "tolerationSeconds": t.get("tolerationSeconds")}
            == {**t, "tolerationSeconds": t.get("tolerationSeconds")}
            for t in new_list
        ):
            return [
                _forbidden(
                    "spec.tolerations",
                    "existing toleration can not be modified except its tolerationSeconds",
                )
            ]
    return []


def _only_deleted_gates(new: Any, old: Any) -> list[FieldError]:
    before = {g.get("name") for g in old or [] if isinstance(g, dict)}
    return [
        _forbidden(
            f"spec.schedulingGates[{i}].name",
            f"only deletion is allowed, but found new scheduling gate '{gate.get('name')}'",
        )
        for i, gate in enumerate(new or [])
        if isinstance(gate, dict) and gate.get("name") not in before
    ]


def _munged(new_spec: Obj, old_spec: Obj) -> Obj:
    """The new spec with the fields an update may change taken from the old one."""
    munged = dict(new_spec)
    for field in ("containers", "initContainers"):
        if field in munged:
            munged[field] = [
                _with(c, "image", _mapping(o).get("image")) if isinstance(c, dict) else c
                for c, o in zip(munged[field], old_spec.get(field) or [], strict=False)
            ]
    for field in ("activeDeadlineSeconds", "schedulingGates", "tolerations"):
        _copy_field(munged, old_spec, field)
    old_grace = old_spec.get("terminationGracePeriodSeconds")
    if (
        isinstance(old_grace, int)
        and old_grace < 0
        and munged.get("terminationGracePeriodSeconds") == 1
    ):
        munged["terminationGracePeriodSeconds"] = old_grace
    return munged


def _with(obj: Obj, key: str, value: Any) -> Obj:
    """``obj`` with ``key`` set to ``value`` (in place of the old one), or without it."""
    out = dict(obj)
    if value is None:
        out.pop(key, None)
    else:
        out[key] = value
    return out


def _copy_field(target: Obj, source: Obj, key: str) -> None:
    if key in source:
        target[key] = source[key]
    else:
        target.pop(key, None)


def _spec_diff(old: Obj, new: Obj) -> str:
    lines = ["  core.PodSpec{"]
    for key in dict.fromkeys([*old, *new]):
        if old.get(key) == new.get(key):
            continue
        name = _GO_NAMES.get(key, key[:1].upper() + key[1:])
        if key in old:
            lines.append(f"- \t{name}: {_json(old[key])},")
        if key in new:
            lines.append(f"+ \t{name}: {_json(new[key])},")
    lines.append("  }")
    return "\n".join(lines) + "\n"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
