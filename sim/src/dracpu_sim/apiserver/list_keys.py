"""Which lists of the served kinds merge by key rather than as a whole. Pure.

Strategic merge patch merges these lists item by item on the key (the field's
``patchMergeKey`` in k8s.io/api core/v1 types.go), and server-side apply treats them as
associative lists on the same key (``listType=map`` + ``listMapKey``): a keyed list item
shows in a field path as ``[name="worker"]``. Every other list is replaced whole
(``listType=atomic``), as the real server does for the resource.k8s.io lists the driver
uses. The table goes by field name: each name below means one list in every kind served.
"""

from __future__ import annotations

__all__ = ["MERGE_KEYS", "PRIMITIVE_SETS"]

MERGE_KEYS: dict[str, str] = {
    # PodSpec
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "hostAliases": "ip",
    # Container
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    # PodStatus / DeploymentStatus (both key their conditions on type)
    "conditions": "type",
    # ResourceClaimStatus
    "reservedFor": "uid",
    # ObjectMeta
    "ownerReferences": "uid",
}

# Lists of strings merged as sets (``patchStrategy=merge`` on a primitive list).
PRIMITIVE_SETS: frozenset[str] = frozenset({"finalizers"})
