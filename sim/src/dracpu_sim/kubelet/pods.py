"""What the simulated kubelet knows about pods and prepared claims, and the pure decisions
of a pod start: which ResourceClaims a pod uses, which CDI devices each container gets,
and how long to wait before retrying a failed start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dracpu.allocation.quantity import QuantityError, parse_quantity
from dracpu_sim.kubelet.dra import ClaimRef, PreparedDevice

__all__ = [
    "Backoff",
    "ContainerState",
    "PodStartError",
    "PodState",
    "PreparedClaim",
    "claim_problem",
    "container_device_ids",
    "pod_claim_names",
    "pod_qos_class",
    "spec_env",
]


class PodStartError(Exception):
    """Why a pod could not start this time; recorded on the pod and retried with backoff."""


@dataclass(frozen=True)
class Backoff:
    """Exponential retry delays: ``initial``, doubled per failure, at most ``maximum``."""

    initial: float = 1.0
    maximum: float = 30.0

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return float(min(self.maximum, self.initial * 2 ** (failures - 1)))


@dataclass
class ContainerState:
    name: str
    id: str
    env: list[str]
    running: bool = True


@dataclass
class PodState:
    uid: str
    namespace: str
    name: str
    phase: Literal["Pending", "Running", "Terminating", "Terminated"] = "Pending"
    claims: list[ClaimRef] = field(default_factory=list)
    containers: dict[str, ContainerState] = field(default_factory=dict)
    sandbox: bool = False
    # (trio time, message) of every failed start or teardown step, oldest first.
    errors: list[tuple[float, str]] = field(default_factory=list)
    failures: int = 0  # consecutive, for the backoff
    next_attempt: float = 0.0

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def last_error(self) -> str | None:
        return self.errors[-1][1] if self.errors else None

    def snapshot(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "phase": self.phase,
            "claims": [str(c) for c in self.claims],
            "containers": {
                name: {"id": c.id, "env": list(c.env), "running": c.running}
                for name, c in self.containers.items()
            },
            "errors": [message for _, message in self.errors],
        }


@dataclass
class PreparedClaim:
    """The kubelet's checkpoint entry: a claim prepared by its drivers, and its users."""

    ref: ClaimRef
    devices: dict[str, list[PreparedDevice]]  # by driver
    pods: set[str] = field(default_factory=set)

    def cdi_ids(self, request: str | None) -> list[str]:
        """CDI ids of the devices serving ``request`` (all devices when None)."""
        out: list[str] = []
        for devices in self.devices.values():
            for device in devices:
                if request is None or not device.request_names or request in device.request_names:
                    out.extend(device.cdi_device_ids)
        return out


def pod_claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """Pod claim name -> ResourceClaim name, for every ``spec.resourceClaims`` entry."""
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    out: dict[str, str] = {}
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        pod_claim = str(entry.get("name", ""))
        name = entry.get("resourceClaimName") or generated.get(pod_claim)
        if not name:
            raise PodStartError(f"pod claim {pod_claim!r} has no ResourceClaim (yet)")
        out[pod_claim] = str(name)
    return out


def claim_problem(claim: Mapping[str, Any], pod_uid: str) -> str | None:
    """Why the kubelet may not use this claim for the pod, or None."""
    ref = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
    status = claim.get("status") or {}
    if not status.get("allocation"):
        return f"resourceclaim {ref} is not allocated"
    if not any(r.get("uid") == pod_uid for r in status.get("reservedFor") or []):
        return f"resourceclaim {ref} is not reserved for the pod"
    return None


def claim_drivers(claim: Mapping[str, Any]) -> list[str]:
    """The drivers of a claim's allocation results, in first-seen order."""
    drivers: list[str] = []
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    for result in results.get("results") or []:
        if result.get("driver") not in drivers:
            drivers.append(str(result.get("driver")))
    return drivers


def container_device_ids(
    container: Mapping[str, Any],
    claim_uids: Mapping[str, str],
    prepared: Mapping[str, PreparedClaim],
) -> list[str]:
    """CDI ids a container gets: those of the claims (and requests) it lists in
    ``resources.claims``, in order, without repeats."""
    out: list[str] = []
    for entry in (container.get("resources") or {}).get("claims") or []:
        pod_claim = str(entry.get("name", ""))
        uid = claim_uids.get(pod_claim)
        if uid is None:
            raise PodStartError(
                f"container {container.get('name')!r} uses unknown pod claim {pod_claim!r}"
            )
        request = entry.get("request")
        for cdi_id in prepared[uid].cdi_ids(str(request).split("/")[0] if request else None):
            if cdi_id not in out:
                out.append(cdi_id)
    return out


def spec_env(container: Mapping[str, Any]) -> list[str]:
    """The container's literal ``env`` entries as ``NAME=value`` (``valueFrom`` skipped)."""
    return [
        f"{e['name']}={e.get('value', '')}"
        for e in container.get("env") or []
        if "name" in e and "valueFrom" not in e
    ]


def containers_of(pod: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    containers: Sequence[Mapping[str, Any]] = (pod.get("spec") or {}).get("containers") or []
    return containers


_QOS_RESOURCES = ("cpu", "memory")


def _nonzero(resources: Mapping[str, Any] | None) -> dict[str, Any]:
    """The cpu and memory entries of a requests or limits map that are not zero."""
    out: dict[str, Any] = {}
    for name in _QOS_RESOURCES:
        text = str((resources or {}).get(name, "0"))
        try:
            value: Any = parse_quantity(text)
        except QuantityError:
            value = text  # unparsable: compared as written (the API server refuses it anyway)
        if value != 0:
            out[name] = value
    return out


def pod_qos_class(pod: Mapping[str, Any]) -> str:
    """The pod's QoS class as the API server computes ``status.qosClass``
    (kubernetes ``pkg/apis/core/v1/helper/qos/qos.go`` ``GetPodQOS``, without pod-level
    resources): besteffort when no container (init containers included) requests or limits
    cpu or memory; guaranteed when every container limits both and every request equals its
    limit (a missing request defaults to the limit); burstable otherwise.
    """
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    any_set = False
    guaranteed = bool(containers)
    for container in containers:
        resources = container.get("resources") or {}
        limits = _nonzero(resources.get("limits"))
        requests = {**limits, **_nonzero(resources.get("requests"))}
        any_set = any_set or bool(requests or limits)
        if set(limits) != set(_QOS_RESOURCES) or requests != limits:
            guaranteed = False
    if not any_set:
        return "besteffort"
    return "guaranteed" if guaranteed else "burstable"
