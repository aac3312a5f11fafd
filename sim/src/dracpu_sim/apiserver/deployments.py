"""apps/v1 Deployment validation, the basic shape the real server checks. Pure.

The simulated API server stores Deployments so that ``kubectl apply -f`` of a manifest
holding one succeeds whole; it runs no deployment controller (nothing turns a Deployment
into ReplicaSets or pods; ``dracpu demo`` stands in for it). What is checked, with the
real texts (kubernetes/kubernetes v1.34, pkg/apis/apps/validation/validation.go
``ValidateDeploymentSpec``, ``ValidatePodTemplateSpecForReplicaSet`` and
pkg/registry/apps/deployment/strategy.go ``ValidateUpdate``):

- ``spec.replicas``, ``spec.minReadySeconds`` and ``spec.revisionHistoryLimit`` are not
  negative; ``spec.selector`` is set, not empty, and matches the template's labels;
- the template has containers with names and images, restarts ``Always`` and sets no
  ``activeDeadlineSeconds``; ``spec.strategy.type`` is ``Recreate`` or ``RollingUpdate``;
- an update keeps ``spec.selector``.

Unknown fields are the strict decoder's business (``openapi``), as for every kind.
"""

from __future__ import annotations

from typing import Any

from dracpu_sim.apiserver.errors import FieldError, bad_value
from dracpu_sim.apiserver.update_rules import FIELD_IMMUTABLE

__all__ = ["validate_deployment", "validate_deployment_update"]

Obj = dict[str, Any]

_NEGATIVE = "must be greater than or equal to 0"  # apimachinery IsNegativeErrorMsg
_STRATEGIES = ("Recreate", "RollingUpdate")


def _invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueInvalid", field, f"Invalid value: {bad_value(value)}: {detail}")


def _required(field: str) -> FieldError:
    return FieldError("FieldValueRequired", field, "Required value")


def _unsupported(field: str, value: Any, supported: tuple[str, ...]) -> FieldError:
    allowed = ", ".join(f'"{s}"' for s in supported)
    return FieldError(
        "FieldValueNotSupported",
        field,
        f"Unsupported value: {bad_value(value)}: supported values: {allowed}",
    )


def validate_deployment(obj: Obj) -> list[FieldError]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [_required("spec.selector"), _required("spec.template.spec.containers")]
    errors: list[FieldError] = []
    for field in ("replicas", "minReadySeconds", "revisionHistoryLimit"):
        value = spec.get(field)
        if isinstance(value, int) and value < 0:
            errors.append(_invalid(f"spec.{field}", value, _NEGATIVE))
    selector = spec.get("selector")
    raw_template = spec.get("template")
    template: Obj = raw_template if isinstance(raw_template, dict) else {}
    if not isinstance(selector, dict):
        errors.append(_required("spec.selector"))
    elif not selector.get("matchLabels") and not selector.get("matchExpressions"):
        errors.append(
            _invalid("spec.selector", selector, "empty selector is invalid for deployment")
        )
    else:
        template_meta = template.get("metadata")
        labels = template_meta.get("labels") if isinstance(template_meta, dict) else None
        if not _matches(selector, labels if isinstance(labels, dict) else {}):
            errors.append(
                _invalid(
                    "spec.template.metadata.labels",
                    labels,
                    "`selector` does not match template `labels`",
                )
            )
    errors += _template_spec(template.get("spec"))
    strategy = spec.get("strategy")
    kind = strategy.get("type") if isinstance(strategy, dict) else None
    if kind is not None and kind not in _STRATEGIES:
        errors.append(_unsupported("spec.strategy.type", kind, _STRATEGIES))
    return errors


def validate_deployment_update(new: Obj, old: Obj) -> list[FieldError]:
    errors = validate_deployment(new)
    new_selector = (new.get("spec") or {}).get("selector")
    if new_selector != (old.get("spec") or {}).get("selector"):
        errors.append(_invalid("spec.selector", new_selector, FIELD_IMMUTABLE))
    return errors


def _template_spec(spec: Any) -> list[FieldError]:
    where = "spec.template.spec"
    if not isinstance(spec, dict):
        return [_required(f"{where}.containers")]
    errors: list[FieldError] = []
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        errors.append(_required(f"{where}.containers"))
    else:
        for i, container in enumerate(containers):
            for field in ("name", "image"):
                if not isinstance(container, dict) or not container.get(field):
                    errors.append(_required(f"{where}.containers[{i}].{field}"))
    policy = spec.get("restartPolicy")
    if policy not in (None, "", "Always"):
        errors.append(_unsupported(f"{where}.restartPolicy", policy, ("Always",)))
    if spec.get("activeDeadlineSeconds") is not None:
        errors.append(
            FieldError(
                "FieldValueForbidden",
                f"{where}.activeDeadlineSeconds",
                "Forbidden: activeDeadlineSeconds in ReplicaSet is not Supported",
            )
        )
    return errors


def _matches(selector: Obj, labels: dict[str, Any]) -> bool:
    """A metav1.LabelSelector against a set of labels."""
    match_labels = selector.get("matchLabels") or {}
    if not isinstance(match_labels, dict) or any(
        labels.get(k) != v for k, v in match_labels.items()
    ):
        return False
    for requirement in selector.get("matchExpressions") or []:
        if not isinstance(requirement, dict):
            return False
        key, op = str(requirement.get("key")), requirement.get("operator")
        values = requirement.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True
