"""ResourceClaims from ResourceClaimTemplates, as kube-controller-manager's resourceclaim
controller makes them. Pure: the scheduler's round does the API calls.

For a pod's ``spec.resourceClaims`` entry that names ``resourceClaimTemplateName``, the
controller creates one claim owned by the pod and records its name in the pod's
``status.resourceClaimStatuses``; the scheduler and the kubelet find the claim there. The
generated claim:

- ``metadata.generateName`` is ``<pod>-<pod claim name>-`` (the server appends five
  random characters); when that is longer than 57 characters both parts are cut in
  proportion to their length and joined by one ``-``, so a long pod name does not hide
  the pod claim's name;
- the template's ``spec.metadata`` labels and annotations, plus the annotation
  ``resource.kubernetes.io/pod-claim-name: <pod claim name>``;
- one ``ownerReference`` to the pod with ``controller`` and ``blockOwnerDeletion`` set, so
  the garbage collector deletes it with the pod;
- ``spec`` is the template's ``spec.spec``.

Before creating, the controller looks for a claim the pod already owns with that
annotation (it may have created one and failed before updating the pod's status). A
generated claim that is reserved for nobody is deleted once its pod is gone, replaced (a
new UID) or done.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "POD_CLAIM_NAME_ANNOTATION",
    "claim_from_template",
    "claim_generate_name",
    "find_generated_claim",
    "generated_claim_names",
    "owning_pod",
    "template_entries",
]

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
_MAX_BASE = 57  # 63 minus the hyphen and five random characters

Obj = dict[str, Any]


def claim_generate_name(pod_name: str, pod_claim_name: str) -> str:
    """``metadata.generateName`` of the claim generated for one pod claim."""
    name = f"{pod_name}-{pod_claim_name}-"
    if len(name) <= _MAX_BASE:
        return name
    pod_part = pod_name[: len(pod_name) * _MAX_BASE // len(name)]
    claim_part = pod_claim_name[: len(pod_claim_name) * _MAX_BASE // len(name)]
    return f"{pod_part}-{claim_part}"


def template_entries(pod: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(pod claim name, template name) of every entry that names a template."""
    return [
        (entry["name"], entry["resourceClaimTemplateName"])
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []
        if entry.get("name") and entry.get("resourceClaimTemplateName")
    ]


def generated_claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """Pod claim name -> generated claim name, from ``status.resourceClaimStatuses``."""
    return {
        s["name"]: s["resourceClaimName"]
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if s.get("name") and s.get("resourceClaimName")
    }


def owning_pod(claim: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the pod that controls ``claim``, or None for a claim made by hand."""
    for owner in (claim.get("metadata") or {}).get("ownerReferences") or []:
        if (
            owner.get("controller")
            and owner.get("apiVersion") == "v1"
            and owner.get("kind") == "Pod"
        ):
            return str(owner.get("name", "")), str(owner.get("uid", ""))
    return None


def find_generated_claim(
    claims: Iterable[Mapping[str, Any]], pod: Mapping[str, Any], pod_claim_name: str
) -> Mapping[str, Any] | None:
    """A claim the pod already owns for ``pod_claim_name`` (created, status not yet written)."""
    meta = pod["metadata"]
    for claim in claims:
        claim_meta = claim.get("metadata") or {}
        if claim_meta.get("namespace") != meta.get("namespace"):
            continue
        owner = owning_pod(claim)
        if owner is None or owner[1] != meta.get("uid"):
            continue
        if (claim_meta.get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION) == pod_claim_name:
            return claim
    return None


def claim_from_template(
    pod: Mapping[str, Any], pod_claim_name: str, template: Mapping[str, Any]
) -> Obj:
    """The ResourceClaim to create for one template entry of ``pod``."""
    meta = pod["metadata"]
    template_spec = template.get("spec") or {}
    template_meta = template_spec.get("metadata") or {}
    annotations = dict(template_meta.get("annotations") or {})
    annotations[POD_CLAIM_NAME_ANNOTATION] = pod_claim_name
    claim_meta: Obj = {
        "generateName": claim_generate_name(meta["name"], pod_claim_name),
        "namespace": meta["namespace"],
        "annotations": annotations,
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if template_meta.get("labels"):
        claim_meta["labels"] = dict(template_meta["labels"])
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": claim_meta,
        "spec": copy.deepcopy(template_spec.get("spec") or {}),
    }
