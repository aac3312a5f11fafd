"""The plan of a chaos run (pure): the workload's pods, the faults and when each happens.

:func:`make_plan` is a pure function of its arguments, so a seed names one run: the same
pods, the same faults at the same offsets, with the same parameters.
"""

from __future__ import annotations

import random
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dracpu import DRIVER_NAME

__all__ = [
    "FAULT_KINDS",
    "NAMESPACE",
    "Action",
    "Plan",
    "PodPlan",
    "claim_object",
    "make_plan",
    "pod_object",
]

FAULT_KINDS = (
    "daemon-kill9",
    "runtime-restart",
    "nri-drop",
    "update-fail",
    "api-409",
    "api-500",
    "api-drop",
    "watch-drop",
    "slice-delete",
    "cpuset-tamper",
)
# Restarting the daemon costs seconds of a loaded CI machine; the cheap faults come oftener.
_FAULT_WEIGHTS = {
    "daemon-kill9": 1,
    "runtime-restart": 1,
    "nri-drop": 1,
    "update-fail": 2,
    "api-409": 2,
    "api-500": 2,
    "api-drop": 1,
    "watch-drop": 1,
    "slice-delete": 1,
    "cpuset-tamper": 2,
}
NAMESPACE = "default"


@dataclass(frozen=True)
class PodPlan:
    """One pod of the workload: ``claim_cpus`` 0 is a plain pod (shared pool only)."""

    name: str
    claim_cpus: int = 0
    full_cores: bool = False  # fullPCPUsOnly (grouped mode)
    sidecar: bool = False  # a second container that uses no claim
    # isolateIRQs in the claim's options. Drawn from the name, not the seeded generator,
    # so every seed's plan is the one it was before the option existed.
    isolate_irqs: bool = False

    @property
    def claim_name(self) -> str:
        return f"{self.name}-cpus" if self.claim_cpus else ""


@dataclass(frozen=True)
class Action:
    """Something done at ``at`` seconds into the run: a workload step or a fault.

    ``kind`` is ``create-pod``, ``delete-pod`` or one of ``FAULT_KINDS``; ``pod`` names the
    pod of a workload step; ``value`` is the planned random number a fault draws its
    parameters from.
    """

    at: float
    kind: str
    pod: str = ""
    value: int = 0


@dataclass(frozen=True)
class Plan:
    seed: int
    duration: float
    mode: str
    pods: Mapping[str, PodPlan]
    actions: tuple[Action, ...]

    def fault_counts(self) -> Counter[str]:
        return Counter(a.kind for a in self.actions if a.kind in FAULT_KINDS)


def _pod_plan(rng: random.Random, name: str, mode: str) -> PodPlan:
    if rng.random() < 0.3:
        return PodPlan(name, sidecar=rng.random() < 0.25)
    # Mostly small claims; now and then a big one, so that pods wait for CPUs to free.
    size = rng.choice((1, 1, 2, 2, 2, 3, 4, 4, 6, 8))
    if rng.random() < 0.06:
        size = rng.choice((16, 24))
    full = mode == "grouped" and size % 2 == 0 and rng.random() < 0.25
    return PodPlan(
        name,
        claim_cpus=size,
        full_cores=full,
        sidecar=rng.random() < 0.25,
        isolate_irqs=zlib.crc32(name.encode()) % 3 == 0,
    )


def _plan_workload(
    rng: random.Random,
    duration: float,
    mode: str,
    max_live_pods: int,
    workload_step: tuple[float, float],
    lifetime: tuple[float, float],
) -> tuple[dict[str, PodPlan], list[Action]]:
    """Pods created at random steps, never more than ``max_live_pods`` alive at once."""
    pods: dict[str, PodPlan] = {}
    actions: list[Action] = []
    ends: list[float] = []  # planned deletion times of the live pods
    t = 0.2
    index = 0
    while t < duration:
        ends = [e for e in ends if e > t]
        if len(ends) < max_live_pods:
            name = f"p{index:04d}"
            index += 1
            pods[name] = _pod_plan(rng, name, mode)
            actions.append(Action(round(t, 3), "create-pod", pod=name))
            end = t + rng.uniform(*lifetime)
            if end < duration:
                actions.append(Action(round(end, 3), "delete-pod", pod=name))
                ends.append(end)
            else:
                ends.append(float("inf"))  # stays to the end: checked after settling
        t += rng.uniform(*workload_step)
    return pods, actions


def _plan_faults(
    rng: random.Random, duration: float, fault_step: tuple[float, float]
) -> list[Action]:
    """Every kind once in a shuffled order, then kinds drawn by weight."""
    kinds = list(FAULT_KINDS)
    rng.shuffle(kinds)
    weighted = [k for k in FAULT_KINDS for _ in range(_FAULT_WEIGHTS[k])]
    actions: list[Action] = []
    t = rng.uniform(*fault_step)
    while t < duration:
        kind = kinds.pop(0) if kinds else rng.choice(weighted)
        actions.append(Action(round(t, 3), kind, value=rng.randrange(1 << 30)))
        t += rng.uniform(*fault_step)
    return actions


def make_plan(
    seed: int,
    duration: float,
    *,
    mode: str = "grouped",
    max_live_pods: int = 12,
    workload_step: tuple[float, float] = (0.15, 0.9),
    lifetime: tuple[float, float] = (1.5, 12.0),
    fault_step: tuple[float, float] = (0.5, 2.2),
) -> Plan:
    """The workload and the fault schedule of one run; a pure function of its arguments.

    The first faults are every kind once, in a seeded order, so that a run long enough for
    ``len(FAULT_KINDS)`` faults injects each kind; later ones are drawn by weight.
    """
    if duration <= 0:
        raise ValueError(f"chaos duration must be positive, got {duration}")
    if mode not in ("grouped", "individual"):
        raise ValueError(f"chaos mode must be 'grouped' or 'individual', got {mode!r}")
    # One generator for both halves, workload first: the order is part of what a seed means.
    rng = random.Random(f"dracpu-chaos/{seed}/{mode}")
    pods, actions = _plan_workload(rng, duration, mode, max_live_pods, workload_step, lifetime)
    actions += _plan_faults(rng, duration, fault_step)
    actions.sort(key=lambda a: (a.at, a.kind, a.pod))
    return Plan(seed, duration, mode, pods, tuple(actions))


def claim_object(pod: PodPlan, mode: str) -> dict[str, Any]:
    """The ResourceClaim of a pod's CPUs: a count of CPUs (individual) or a capacity."""
    request: dict[str, Any] = {"deviceClassName": DRIVER_NAME}
    if mode == "individual":
        request["count"] = pod.claim_cpus
    else:
        request["capacity"] = {"requests": {"dra.cpu/cpu": str(pod.claim_cpus)}}
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "cpus", "exactly": request}]}}
    if pod.full_cores or pod.isolate_irqs:
        options: dict[str, Any] = {"apiVersion": "dra.cpu/v1alpha1", "kind": "AllocationOptions"}
        if pod.full_cores:
            options["fullPCPUsOnly"] = True
        if pod.isolate_irqs:
            options["isolateIRQs"] = True
        spec["devices"]["config"] = [
            {"requests": ["cpus"], "opaque": {"driver": DRIVER_NAME, "parameters": options}}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": pod.claim_name, "namespace": NAMESPACE},
        "spec": spec,
    }


def pod_object(pod: PodPlan) -> dict[str, Any]:
    """The Pod: an ``app`` container (holding the claim, if any) and maybe a sidecar."""
    app: dict[str, Any] = {"name": "app", "image": "busybox:1.36"}
    containers = [app]
    spec: dict[str, Any] = {"containers": containers}
    if pod.claim_cpus:
        spec["resourceClaims"] = [{"name": "cpus", "resourceClaimName": pod.claim_name}]
        app["resources"] = {"claims": [{"name": "cpus"}]}
    if pod.sidecar:
        containers.append({"name": "sidecar", "image": "busybox:1.36"})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": NAMESPACE},
        "spec": spec,
    }
