"""The resource types the simulated API server serves, and what each one allows."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RESOURCES", "ResourceType", "resource_by_path"]

_VERBS_FULL = (
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
)


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str  # "" is the core group
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    has_status: bool
    # Field selector labels beyond metadata.name / metadata.namespace.
    field_labels: tuple[str, ...] = ()
    short_names: tuple[str, ...] = ()
    # The registry sets metadata.generation and bumps it on spec changes.
    has_generation: bool = True
    # DELETE answers with the deleted object (resource.k8s.io, pods) or a Status (nodes),
    # as the real registries do.
    returns_deleted_object: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def verbs(self) -> tuple[str, ...]:
        return _VERBS_FULL

    @property
    def group_prefix(self) -> str:
        """URL prefix of the group version: ``/api/v1`` or ``/apis/<group>/<version>``."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


RESOURCE_SLICES = ResourceType(
    group="resource.k8s.io",
    version="v1",
    plural="resourceslices",
    singular="resourceslice",
    kind="ResourceSlice",
    namespaced=False,
    has_status=False,
    field_labels=("spec.nodeName", "spec.driver", "spec.pool.name"),
)
RESOURCE_CLAIMS = ResourceType(
    group="resource.k8s.io",
    version="v1",
    plural="resourceclaims",
    singular="resourceclaim",
    kind="ResourceClaim",
    namespaced=True,
    has_status=True,
)
RESOURCE_CLAIM_TEMPLATES = ResourceType(
    group="resource.k8s.io",
    version="v1",
    plural="resourceclaimtemplates",
    singular="resourceclaimtemplate",
    kind="ResourceClaimTemplate",
    namespaced=True,
    has_status=False,
)
DEVICE_CLASSES = ResourceType(
    group="resource.k8s.io",
    version="v1",
    plural="deviceclasses",
    singular="deviceclass",
    kind="DeviceClass",
    namespaced=False,
    has_status=False,
)
NODES = ResourceType(
    group="",
    version="v1",
    plural="nodes",
    singular="node",
    kind="Node",
    namespaced=False,
    has_status=True,
    field_labels=("spec.unschedulable",),
    short_names=("no",),
    has_generation=False,
    returns_deleted_object=False,
)
PODS = ResourceType(
    group="",
    version="v1",
    plural="pods",
    singular="pod",
    kind="Pod",
    namespaced=True,
    has_status=True,
    field_labels=(
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    short_names=("po",),
)
# apps/v1 Deployments, stored and validated so ``kubectl apply`` of a manifest holding one
# succeeds whole; no controller turns them into ReplicaSets or pods (the demo stands in).
DEPLOYMENTS = ResourceType(
    group="apps",
    version="v1",
    plural="deployments",
    singular="deployment",
    kind="Deployment",
    namespaced=True,
    has_status=True,
    short_names=("deploy",),
)

RESOURCES: tuple[ResourceType, ...] = (
    RESOURCE_SLICES,
    RESOURCE_CLAIMS,
    RESOURCE_CLAIM_TEMPLATES,
    DEVICE_CLASSES,
    NODES,
    PODS,
    DEPLOYMENTS,
)

_BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}


def resource_by_path(group: str, version: str, plural: str) -> ResourceType | None:
    return _BY_PATH.get((group, version, plural))


def resource_by_plural(plural: str) -> ResourceType:
    """For in-process callers: ``resource_by_plural("resourceslices")``."""
    for r in RESOURCES:
        if r.plural == plural:
            return r
    raise KeyError(plural)
