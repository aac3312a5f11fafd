"""The chaos run: a seeded workload and fault schedule on the simulated node, then invariants.

The real daemon (``dracpu run``, a child process) serves the simulated node of
:mod:`dracpu.sim.node` while pods with claims (and plain pods) come and go and faults are
injected at random: the daemon killed with SIGKILL and started again, runtime restarts and
dropped NRI connections, failing UpdateContainers calls (so the cgroupfs fallback writes),
409/500 answers and dropped connections from the API server, dropped watches, ResourceSlices
deleted behind the driver's back, and container cpusets rewritten behind its back.

Then the injection stops and the node is left to settle: the daemon ready, every deleted pod
gone, every bound pod running, every unbound pod reported unschedulable, and a drift check
done since the last fault. The invariants (:func:`check_invariants`) must then hold:

- no CPU in two claims, no reserved CPU in a claim, the shared pool is everything else;
- every running container's cgroup cpuset is what it should be: its claims' CPUs (from its
  ``DRA_CPUSET_*`` env) for a claim holder, the shared pool for the others; the daemon's
  container table intends the same, and holds no container the runtime removed;
- the claims the daemon holds, its checkpoint and its CDI specs say the same, and the
  kubelet has exactly those claims prepared (no claim leaked, none lost);
- the published ResourceSlices carry exactly the devices built from the same topology;
- every pod bound to the node (its claims allocated) runs; every deleted pod is gone.

The schedule is a pure function of the seed (:func:`make_plan`): the same seed gives the
same pods, the same faults at the same offsets, with the same parameters. Which container
a tamper hits, or which slice is deleted, is chosen from what exists when it fires (by the
planned random number), so wall-clock interleavings may differ between two runs.

Command line: ``python -m dracpu.sim.chaos --seed 1 --duration 300`` prints, per run,
``faults_injected: N``, each violation on a line of its own, ``invariant_violations: N`` and
``settle_ms: X``; with ``--mode both`` (the default) a grouped and an individual run, then
the totals in the same three lines. Exit code 0 when no invariant was violated.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from dracpu import DRIVER_NAME, cdi
from dracpu.allocation.checkpoint import CheckpointError, decode_checkpoint
from dracpu.allocation.env import DRAEnvError, parse_dra_env
from dracpu.cpuset import CPUSet, CPUSetParseError
from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.sim.kubelet.pods import Backoff
from dracpu.sim.node import SimNode, SimNodeError
from dracpu.topology.discover import discover_from_root

__all__ = [
    "FAULT_KINDS",
    "Action",
    "ChaosOptions",
    "ChaosResult",
    "ContainerView",
    "Observation",
    "Plan",
    "PodPlan",
    "PodView",
    "Violation",
    "check_invariants",
    "format_result",
    "main",
    "make_plan",
    "run_chaos",
    "slice_devices",
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
# (verb, resource) the API faults hit: the daemon's slice and claim calls, the scheduler's
# claim status writes, the kubelet's pod calls.
API_409_TARGETS = (
    ("update", "resourceslices"),
    ("update", "resourceclaims/status"),
    ("patch", "pods/status"),
    ("delete", "resourceslices"),
)
API_500_TARGETS = (
    ("get", "resourceclaims"),
    ("list", "resourceslices"),
    ("create", "resourceslices"),
    ("update", "resourceslices"),
    ("watch", "resourceslices"),
    ("list", "pods"),
    ("get", "nodes"),
    ("update", "resourceclaims/status"),
    ("*", "*"),
)
NAMESPACE = "default"
DEFAULT_FIXTURE = str(Path(__file__).parents[3] / "tests" / "fake_sysfs" / "xeon-2s-ht")


# -- the plan (pure) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PodPlan:
    """One pod of the workload: ``claim_cpus`` 0 is a plain pod (shared pool only)."""

    name: str
    claim_cpus: int = 0
    full_cores: bool = False  # fullPCPUsOnly (grouped mode)
    sidecar: bool = False  # a second container that uses no claim

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
    return PodPlan(name, claim_cpus=size, full_cores=full, sidecar=rng.random() < 0.25)


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
    rng = random.Random(f"dracpu-chaos/{seed}/{mode}")
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
    kinds = list(FAULT_KINDS)
    rng.shuffle(kinds)
    weighted = [k for k in FAULT_KINDS for _ in range(_FAULT_WEIGHTS[k])]
    t = rng.uniform(*fault_step)
    while t < duration:
        kind = kinds.pop(0) if kinds else rng.choice(weighted)
        actions.append(Action(round(t, 3), kind, value=rng.randrange(1 << 30)))
        t += rng.uniform(*fault_step)
    actions.sort(key=lambda a: (a.at, a.kind, a.pod))
    return Plan(seed, duration, mode, pods, tuple(actions))


def claim_object(pod: PodPlan, mode: str) -> dict[str, Any]:
    request: dict[str, Any] = {"deviceClassName": DRIVER_NAME}
    if mode == "individual":
        request["count"] = pod.claim_cpus
    else:
        request["capacity"] = {"requests": {"dra.cpu/cpu": str(pod.claim_cpus)}}
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "cpus", "exactly": request}]}}
    if pod.full_cores:
        options = {
            "apiVersion": "dra.cpu/v1alpha1",
            "kind": "AllocationOptions",
            "fullPCPUsOnly": True,
        }
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


# -- the invariants (pure) -----------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"violation: {self.kind}: {self.detail}"


@dataclass(frozen=True)
class ContainerView:
    """A container the kubelet runs: its env and its cpuset as the cgroup file holds it."""

    pod: str  # namespace/name
    name: str
    container_id: str
    env: tuple[str, ...]
    cgroup_cpus: str | None  # None: no cgroup file


@dataclass(frozen=True)
class PodView:
    """A pod as the API server and the kubelet see it."""

    ref: str
    bound: bool
    deleting: bool
    phase: str  # the kubelet's; "" when the kubelet has not seen it
    unschedulable: str = ""  # the scheduler's PodScheduled=False message
    last_error: str = ""  # the kubelet's last error for it


@dataclass
class Observation:
    """Everything the invariants look at, read from a settled node."""

    online: CPUSet
    reserved: CPUSet
    daemon_reserved: CPUSet
    daemon_claims: dict[str, CPUSet]
    shared_pool: CPUSet
    checkpoint_claims: dict[str, CPUSet] | None
    checkpoint_error: str = ""
    cdi_claims: dict[str, CPUSet] = field(default_factory=dict)
    cdi_errors: list[str] = field(default_factory=list)
    kubelet_prepared: set[str] = field(default_factory=set)
    containers: list[ContainerView] = field(default_factory=list)
    pods: list[PodView] = field(default_factory=list)
    published_slices: list[dict[str, Any]] = field(default_factory=list)
    desired_slices: list[dict[str, Any]] = field(default_factory=list)
    # The daemon's container table (``/debug/state`` containers: id -> intended cpus) and
    # the ids of every container the runtime has; None when not looked at.
    daemon_intents: dict[str, str] | None = None
    runtime_containers: set[str] | None = None


def slice_devices(slices: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The devices of a pool's slices, in slice index order (the name's hex prefix)."""

    def index(s: Mapping[str, Any]) -> str:
        meta = s.get("metadata") or {}
        return str(meta.get("name") or meta.get("generateName") or "")

    out: list[Any] = []
    for s in sorted(slices, key=index):
        out.extend((s.get("spec") or {}).get("devices") or [])
    return out


def _claims_diff(a: Mapping[str, CPUSet], b: Mapping[str, CPUSet]) -> str:
    parts = []
    for uid in sorted(set(a) | set(b)):
        if a.get(uid) != b.get(uid):
            left = a[uid].format() if uid in a else "absent"
            right = b[uid].format() if uid in b else "absent"
            parts.append(f"{uid}: {left} vs {right}")
    return "; ".join(parts)


def _check_claims(obs: Observation, out: list[Violation]) -> CPUSet:
    union = CPUSet()
    for uid, cpus in sorted(obs.daemon_claims.items()):
        if not cpus:
            out.append(Violation("empty-claim", f"claim {uid} holds no CPUs"))
        overlap = union & cpus
        if overlap:
            out.append(
                Violation(
                    "cpu-in-two-claims", f"claim {uid} shares CPUs {overlap} with another claim"
                )
            )
        union |= cpus
        in_reserved = cpus & obs.reserved
        if in_reserved:
            out.append(
                Violation("reserved-cpu-in-claim", f"claim {uid} holds reserved CPUs {in_reserved}")
            )
        outside = cpus - obs.online
        if outside:
            out.append(Violation("offline-cpu-in-claim", f"claim {uid} holds CPUs {outside}"))
    if obs.daemon_reserved != obs.reserved:
        out.append(
            Violation(
                "reserved-mismatch",
                f"the daemon reserves {obs.daemon_reserved}, configured {obs.reserved}",
            )
        )
    want_pool = obs.online - obs.reserved - union
    if obs.shared_pool != want_pool:
        out.append(
            Violation(
                "shared-pool-mismatch",
                f"shared pool {obs.shared_pool}, want {want_pool} (online minus reserved minus "
                "claims)",
            )
        )
    return union


def _check_stores(obs: Observation, out: list[Violation]) -> None:
    if obs.checkpoint_claims is None:
        out.append(Violation("checkpoint-unreadable", obs.checkpoint_error or "no checkpoint"))
    elif obs.checkpoint_claims != obs.daemon_claims:
        out.append(
            Violation(
                "checkpoint-mismatch",
                "checkpoint vs daemon: " + _claims_diff(obs.checkpoint_claims, obs.daemon_claims),
            )
        )
    for error in obs.cdi_errors:
        out.append(Violation("cdi-spec-unreadable", error))
    if obs.cdi_claims != obs.daemon_claims:
        out.append(
            Violation(
                "cdi-mismatch",
                "CDI specs vs daemon: " + _claims_diff(obs.cdi_claims, obs.daemon_claims),
            )
        )
    held = set(obs.daemon_claims)
    for uid in sorted(held - obs.kubelet_prepared):
        out.append(
            Violation(
                "claim-leaked",
                f"the daemon holds claim {uid} ({obs.daemon_claims[uid]}), which the kubelet "
                "has not prepared",
            )
        )
    for uid in sorted(obs.kubelet_prepared - held):
        out.append(
            Violation("claim-lost", f"the kubelet has claim {uid} prepared; the daemon does not")
        )


def _check_containers(obs: Observation, out: list[Violation]) -> None:
    for ctr in obs.containers:
        where = f"container {ctr.pod}/{ctr.name} ({ctr.container_id[:12]})"
        try:
            env = parse_dra_env(ctr.env)
        except DRAEnvError as exc:
            out.append(Violation("bad-env", f"{where}: {exc}"))
            continue
        want = CPUSet()
        for uid, cpus in sorted(env.items()):
            held = obs.daemon_claims.get(uid)
            if held != cpus:
                now = held.format() if held is not None else "not prepared"
                out.append(
                    Violation(
                        "env-claim-mismatch",
                        f"{where}: env says claim {uid} is {cpus}, the daemon: {now}",
                    )
                )
            want |= cpus
        if not env:
            want = obs.shared_pool
        if obs.daemon_intents is not None:
            intent = obs.daemon_intents.get(ctr.container_id)
            if intent is None:
                out.append(Violation("intent-missing", f"{where}: the daemon does not know it"))
            elif intent != want.format():
                out.append(
                    Violation(
                        "intent-mismatch", f"{where}: the daemon intends {intent}, want {want}"
                    )
                )
        if ctr.cgroup_cpus is None:
            out.append(Violation("cgroup-missing", f"{where}: no cgroup cpuset file"))
            continue
        try:
            got = CPUSet.parse(ctr.cgroup_cpus)
        except CPUSetParseError as exc:
            out.append(Violation("cgroup-unreadable", f"{where}: {exc}"))
            continue
        if got != want:
            what = "its claims" if env else "the shared pool"
            out.append(
                Violation("cpuset-mismatch", f"{where}: cgroup cpuset {got}, {what} is {want}")
            )


def _check_container_table(obs: Observation, out: list[Violation]) -> None:
    """The daemon forgets containers the runtime removed (else its table only grows)."""
    if obs.daemon_intents is None or obs.runtime_containers is None:
        return
    for cid in sorted(set(obs.daemon_intents) - obs.runtime_containers):
        out.append(
            Violation("intent-stale", f"the daemon still tracks removed container {cid[:12]}")
        )


def _check_pods(obs: Observation, out: list[Violation]) -> None:
    for pod in obs.pods:
        if pod.deleting:
            out.append(
                Violation(
                    "pod-not-deleted",
                    f"pod {pod.ref} was deleted but is still there (kubelet: "
                    f"{pod.phase or 'unseen'}{'; ' + pod.last_error if pod.last_error else ''})",
                )
            )
        elif pod.bound and pod.phase != "Running":
            out.append(
                Violation(
                    "pod-not-running",
                    f"pod {pod.ref} is bound (its claims allocated) but "
                    f"{pod.phase or 'unseen by the kubelet'}"
                    f"{': ' + pod.last_error if pod.last_error else ''}",
                )
            )
        elif not pod.bound and not pod.unschedulable:
            out.append(
                Violation("pod-not-scheduled", f"pod {pod.ref} is neither bound nor unschedulable")
            )


def _check_slices(obs: Observation, out: list[Violation]) -> None:
    published, desired = obs.published_slices, obs.desired_slices
    if len(published) != len(desired):
        out.append(
            Violation(
                "slices-mismatch", f"{len(published)} ResourceSlices published, want {len(desired)}"
            )
        )
    generations = {((s.get("spec") or {}).get("pool") or {}).get("generation") for s in published}
    if len(generations) > 1:
        out.append(
            Violation("slices-mismatch", f"slices of generations {sorted(map(str, generations))}")
        )
    for s in published:
        count = ((s.get("spec") or {}).get("pool") or {}).get("resourceSliceCount")
        if count != len(desired):
            name = (s.get("metadata") or {}).get("name")
            out.append(
                Violation(
                    "slices-mismatch",
                    f"slice {name} says resourceSliceCount {count}, want {len(desired)}",
                )
            )
    got, want = slice_devices(published), slice_devices(desired)
    if got != want:
        got_names = [d.get("name") for d in got]
        want_names = [d.get("name") for d in want]
        if got_names != want_names:
            detail = (
                f"devices {got_names[:6]}... ({len(got)}), want {want_names[:6]}... ({len(want)})"
            )
        else:
            diff = next(g["name"] for g, w in zip(got, want, strict=True) if g != w)
            detail = f"device {diff} differs from the one built from the topology"
        out.append(Violation("slices-mismatch", detail))


def check_invariants(obs: Observation) -> list[Violation]:
    """Every violated invariant of a settled node; empty when all hold."""
    out: list[Violation] = []
    _check_claims(obs, out)
    _check_stores(obs, out)
    _check_containers(obs, out)
    _check_container_table(obs, out)
    _check_pods(obs, out)
    _check_slices(obs, out)
    return out


# -- the engine (Trio, on the simulated node) ----------------------------------------------------


@dataclass
class ChaosOptions:
    seed: int = 1
    duration: float = 30.0
    mode: str = "grouped"
    sysfs_root: str = DEFAULT_FIXTURE
    reserved_cpus: str = "0,40"
    settle_timeout: float = 90.0
    intensity: float = 1.0  # fault rate relative to the default schedule (~0.7 per second)
    workdir: str | None = None
    keep_workdir: bool = False
    verbose: bool = False


@dataclass
class ChaosResult:
    mode: str
    seed: int
    faults: Counter[str] = field(default_factory=Counter)
    pods_created: int = 0
    pods_deleted: int = 0
    waited_for: list[str] = field(default_factory=list)
    # Faults that fired but found nothing to hit (no running container, no slice yet).
    missed: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    settle_ms: int = 0
    settled: bool = False
    workdir: str = ""
    # What the daemon's log shows it did about the faults (evidence the paths ran).
    evidence: Counter[str] = field(default_factory=Counter)

    @property
    def faults_injected(self) -> int:
        return sum(self.faults.values())


# Log lines of the daemon that show a fault was handled by the path meant for it.
EVIDENCE = {
    "daemon_starts": "driver started",
    "fallback_writes": "fallback cpuset write container_id",
    "drift_repairs": "repaired cpuset drift",
    # A crashed service is restarted by the supervisor: not a violation, but worth a look.
    "service_crashes": "service crashed",
    "tracebacks": "Traceback (most recent call last)",
}


def count_evidence(log_text: str) -> Counter[str]:
    """How often each ``EVIDENCE`` line occurs in the daemon's log."""
    counts: Counter[str] = Counter()
    for line in log_text.splitlines():
        for name, needle in EVIDENCE.items():
            if needle in line:
                counts[name] += 1
    return counts


def format_result(result: ChaosResult) -> str:
    """The report: the figures, each violation on a line of its own before their count."""
    lines = [f"faults_injected: {result.faults_injected}"]
    lines += [str(v) for v in result.violations]
    lines.append(f"invariant_violations: {len(result.violations)}")
    lines.append(f"settle_ms: {result.settle_ms}")
    return "\n".join(lines) + "\n"


def _desired_slices(opts: ChaosOptions, node_uid: str, node_name: str) -> list[dict[str, Any]]:
    topo = discover_from_root(opts.sysfs_root)
    settings = DeviceSettings(
        mode=opts.mode,  # type: ignore[arg-type]
        group_by="numanode",
        reserved=CPUSet.parse(opts.reserved_cpus),
        expose_pcie_roots=False,
        publish_node_allocatable=False,
    )
    return build_slices(
        build_inventory(topo, settings),
        node_name=node_name,
        node_uid=node_uid,
        expose_pcie_roots=False,
    )


class ChaosRun:
    """One run: owns the node, executes the plan, settles and observes."""

    def __init__(self, opts: ChaosOptions, plan: Plan, node: SimNode) -> None:
        self.opts = opts
        self.plan = plan
        self.node = node
        self.result = ChaosResult(mode=opts.mode, seed=opts.seed, workdir=node.workdir)
        self.online = discover_from_root(opts.sysfs_root).all_cpus
        self.reserved = CPUSet.parse(opts.reserved_cpus)
        self.desired: list[dict[str, Any]] = []
        self._gc_claims: list[str] = []  # claims whose pods were deleted

    def say(self, text: str) -> None:
        if self.opts.verbose:
            print(f"[{trio.current_time():9.2f}] {text}", file=sys.stderr, flush=True)

    @property
    def extra_args(self) -> list[str]:
        return [
            f"--cpu-device-mode={self.opts.mode}",
            "--group-by=numanode",
            f"--reserved-cpus={self.opts.reserved_cpus}",
        ]

    # -- workload ------------------------------------------------------------------------
    def _create_pod(self, pod: PodPlan) -> None:
        api = self.node.api
        if pod.claim_cpus:
            api.create("resourceclaims", claim_object(pod, self.plan.mode), NAMESPACE)
        api.create("pods", pod_object(pod), NAMESPACE)
        self.result.pods_created += 1
        self.node.poke()

    def _delete_pod(self, pod: PodPlan) -> None:
        try:
            self.node.api.delete("pods", pod.name, NAMESPACE)
        except Exception as exc:  # already gone: nothing to do
            self.say(f"delete {pod.name}: {exc}")
            return
        self.result.pods_deleted += 1
        if pod.claim_cpus:
            self._gc_claims.append(pod.name)
        self.node.poke()

    def _collect_claims(self) -> None:
        """Delete the claims of pods that are gone for good (their claims are unprepared)."""
        live = {p["metadata"]["name"] for p in self.node.api.list("pods", NAMESPACE)}
        keep = []
        for name in self._gc_claims:
            if name in live:
                keep.append(name)
                continue
            try:
                self.node.api.delete("resourceclaims", self.plan.pods[name].claim_name, NAMESPACE)
            except Exception as exc:
                self.say(f"delete claim of {name}: {exc}")
        self._gc_claims = keep

    # -- faults --------------------------------------------------------------------------
    async def _restart_daemon(self, value: int) -> None:
        delay = (value % 1500) / 1000.0
        # Faults run one at a time, so no other fault touches the daemon meanwhile.
        code = await self.node.kill_daemon()
        self.say(f"daemon killed ({code}); restarting in {delay:.2f}s")
        await trio.sleep(delay)
        await self.node.restart_daemon(wait=False)

    def _running_containers(self) -> list[tuple[str, str, str]]:
        out = []
        for ref, st in sorted(self.node.pod_states().items()):
            if st["phase"] != "Running":
                continue
            for name, ctr in sorted(st["containers"].items()):
                out.append((ref, name, str(ctr["id"])))
        return out

    def _tamper(self, value: int) -> str | None:
        """Rewrite a running container's cpuset file; None when there is none to hit."""
        runtime = self.node.runtime
        assert runtime is not None
        running = self._running_containers()
        if not running:
            return None
        ref, name, cid = running[value % len(running)]
        try:
            container = runtime.container(cid)
            directory = runtime.tree.path_of(container.cgroups_path)
            parent = CPUSet.parse((directory.parent / "cpuset.cpus").read_text().strip())
            current = CPUSet.parse(runtime.cpuset_of(cid))
            rng = random.Random(value)
            choices = sorted(parent)
            wrong = current
            while wrong == current:
                wrong = CPUSet(rng.sample(choices, rng.randint(1, min(8, len(choices)))))
            # Straight into the file, as an admin or another agent would: no runtime involved.
            with open(directory / "cpuset.cpus", "r+") as f:
                f.write(wrong.format() + "\n")
                f.truncate()
        except (KeyError, OSError, CPUSetParseError):
            return None  # removed meanwhile
        return f"{ref}/{name} cpuset {current} -> {wrong}"

    async def _inject(self, action: Action) -> str | None:
        """Inject one fault; what it did, or None when it found nothing to hit."""
        node, value = self.node, action.value
        api, runtime = node.api, node.runtime
        assert runtime is not None
        kind = action.kind
        if kind == "daemon-kill9":
            await self._restart_daemon(value)
            return "daemon killed and started again"
        if kind == "runtime-restart":
            downtime = (value % 800) / 1000.0
            await runtime.restart(downtime)
            return f"runtime restarted ({downtime:.2f}s down)"
        if kind == "nri-drop":
            await runtime.drop_connection()
            return "NRI connection dropped"
        if kind == "update-fail":
            n = 1 + value % 3
            how = (value >> 4) % 3
            if how == 0:
                runtime.fail_updates(n)
                return f"next {n} UpdateContainers fail"
            if how == 1:
                runtime.mark_failed_updates(n)
                return f"next {n} UpdateContainers list every update failed"
            runtime.drop_updates(n)
            return f"next {n} UpdateContainers unanswered"
        if kind in ("api-409", "api-500", "api-drop"):
            targets = API_409_TARGETS if kind == "api-409" else API_500_TARGETS
            verb, resource = targets[value % len(targets)]
            count = 1 + (value >> 8) % 3
            if kind == "api-drop":
                api.faults.inject(verb, resource, count, drop_connection=True)
            else:
                status = 409 if kind == "api-409" else 500
                api.faults.inject(verb, resource, count, status=status, message="chaos")
            return f"{kind} on {verb} {resource} x{count}"
        if kind == "watch-drop":
            return f"{api.end_watches(drop=True)} watches dropped"
        if kind == "slice-delete":
            slices = sorted(
                (s["metadata"]["name"] for s in api.list("resourceslices")),
            )
            if not slices:
                return None
            victim = slices[value % len(slices)]
            try:
                api.delete("resourceslices", victim)
            except Exception:  # the reconciler replaced it meanwhile
                return None
            return f"slice {victim} deleted"
        if kind == "cpuset-tamper":
            return self._tamper(value)
        raise ValueError(f"unknown fault kind {kind!r}")

    # -- phases --------------------------------------------------------------------------
    async def _run_workload(self, start: float) -> None:
        for action in self.plan.actions:
            if action.kind not in ("create-pod", "delete-pod"):
                continue
            await trio.sleep_until(start + action.at)
            pod = self.plan.pods[action.pod]
            if action.kind == "create-pod":
                self._create_pod(pod)
            else:
                self._delete_pod(pod)
            self._collect_claims()

    async def _run_faults(self, start: float) -> None:
        for action in self.plan.actions:
            if action.kind not in FAULT_KINDS:
                continue
            await trio.sleep_until(start + action.at)
            what = await self._inject(action)
            self.result.faults[action.kind] += 1
            if what is None:
                self.result.missed[action.kind] += 1
            self.say(f"fault {action.kind}: {what or 'nothing to hit'}")

    def _quiesce(self) -> None:
        runtime = self.node.runtime
        assert runtime is not None
        self.node.api.faults.clear()
        runtime.fail_updates(0)
        runtime.mark_failed_updates(0)
        runtime.drop_updates(0)

    async def _settle_reasons(self, drift_baseline: tuple[int, int]) -> list[str]:
        """Why the node is not settled yet (empty: settled)."""
        node = self.node
        reasons: list[str] = []
        daemon = node.daemon
        if daemon is None or not daemon.running():
            return ["the daemon is not running"]
        ready, why = await node.readiness()
        if not ready:
            return [f"the daemon is not ready: {' '.join(why.split())[:300]}"]
        try:
            state = await node.debug_state()
        except (OSError, SimNodeError, ValueError) as exc:
            return [f"/debug/state: {exc}"]
        pid, checks = drift_baseline
        drift_checks = int((state.get("drift") or {}).get("checks") or 0)
        if daemon.process.pid == pid and drift_checks <= checks:
            reasons.append("no drift check since the faults stopped")
        elif drift_checks < 1:
            reasons.append("no drift check yet")
        for pod in self._pod_views():
            if pod.deleting:
                reasons.append(f"pod {pod.ref} still terminating")
            elif pod.bound and pod.phase != "Running":
                reasons.append(f"pod {pod.ref} not running yet")
            elif not pod.bound and not pod.unschedulable:
                reasons.append(f"pod {pod.ref} not scheduled yet")
        if self._gc_claims:
            self._collect_claims()
        return reasons

    def _pod_views(self) -> list[PodView]:
        states = self.node.pod_states()
        by_uid = {st["uid"]: st for st in states.values()}
        views = []
        for pod in self.node.api.list("pods", NAMESPACE):
            meta = pod["metadata"]
            ref = f"{meta['namespace']}/{meta['name']}"
            st = by_uid.get(meta["uid"])
            unschedulable = ""
            for cond in (pod.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    unschedulable = str(cond.get("message") or "unschedulable")
            views.append(
                PodView(
                    ref=ref,
                    bound=bool((pod.get("spec") or {}).get("nodeName")),
                    deleting=bool(meta.get("deletionTimestamp")),
                    phase=str(st["phase"]) if st else "",
                    unschedulable=unschedulable,
                    last_error=str(st["errors"][-1]) if st and st["errors"] else "",
                )
            )
        return views

    async def observe(self) -> Observation:
        node = self.node
        state = await node.debug_state()
        daemon_claims = {c["uid"]: CPUSet.parse(c["cpus"]) for c in state.get("claims") or []}
        checkpoint_claims: dict[str, CPUSet] | None = None
        checkpoint_error = ""
        try:
            data = Path(node.state_dir, "checkpoint.json").read_bytes()
            checkpoint_claims = {r.uid: r.cpus for r in decode_checkpoint(data).claims}
        except (OSError, CheckpointError) as exc:
            checkpoint_error = str(exc)
        scan = cdi.read_claim_specs(node.cdi_dir)
        snapshot = node.kubelet.snapshot() if node.kubelet is not None else {}
        prepared = {str(c["uid"]) for c in (snapshot.get("prepared_claims") or {}).values()}
        containers = []
        for ref, st in sorted(node.pod_states().items()):
            if st["phase"] != "Running":
                continue
            for name, ctr in sorted(st["containers"].items()):
                try:
                    cpus: str | None = node.cpuset_of(ctr["id"])
                except (KeyError, OSError):
                    cpus = None
                containers.append(ContainerView(ref, name, ctr["id"], tuple(ctr["env"]), cpus))
        published = [
            s
            for s in node.api.list("resourceslices")
            if (s.get("spec") or {}).get("driver") == DRIVER_NAME
            and (s.get("spec") or {}).get("nodeName") == node.node_name
        ]
        return Observation(
            online=self.online,
            reserved=self.reserved,
            daemon_reserved=CPUSet.parse(state.get("reserved") or ""),
            daemon_claims=daemon_claims,
            shared_pool=CPUSet.parse(state.get("sharedPool") or ""),
            checkpoint_claims=checkpoint_claims,
            checkpoint_error=checkpoint_error,
            cdi_claims=dict(scan.claims),
            cdi_errors=list(scan.errors),
            kubelet_prepared=prepared,
            containers=containers,
            pods=self._pod_views(),
            published_slices=published,
            desired_slices=self.desired,
            daemon_intents={str(c["id"]): str(c["cpus"]) for c in state.get("containers") or []},
            runtime_containers={c.id for c in node.runtime.containers} if node.runtime else None,
        )

    async def _settle(self) -> None:
        node = self.node
        stopped = trio.current_time()
        deadline = stopped + self.opts.settle_timeout
        daemon = node.daemon
        baseline = (-1, 0)
        if daemon is not None and daemon.running():
            try:
                state = await node.debug_state()
                baseline = (daemon.process.pid, int((state.get("drift") or {}).get("checks") or 0))
            except (OSError, SimNodeError, ValueError):
                pass
        last_reasons: list[str] = []
        last_violations: list[Violation] | None = None
        while trio.current_time() < deadline:
            last_violations = None
            last_reasons = await self._settle_reasons(baseline)
            if not last_reasons:
                try:
                    last_violations = check_invariants(await self.observe())
                except (OSError, SimNodeError, ValueError) as exc:
                    last_reasons = [f"observing the node: {exc}"]
                else:
                    if not last_violations:
                        self.result.settled = True
                        break
            # What the settling last waited for: a hint when settle_ms is long.
            self.result.waited_for = last_reasons[:3] or [str(v) for v in last_violations or []][:3]
            await trio.sleep(0.25)
        self.result.settle_ms = round((trio.current_time() - stopped) * 1000)
        if self.result.settled:
            return
        self.result.violations.extend(last_violations or [])
        self.result.violations.extend(
            Violation("not-settled", reason) for reason in last_reasons[:20]
        )

    async def run(self) -> ChaosResult:
        node = self.node
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            node_uid = node.api.get("nodes", node.node_name)["metadata"]["uid"]
            self.desired = _desired_slices(self.opts, node_uid, node.node_name)
            await node.start_daemon(sysfs_root=self.opts.sysfs_root, extra_args=self.extra_args)
            self.say(f"daemon ready; chaos for {self.plan.duration:.0f}s")
            start = trio.current_time()
            async with trio.open_nursery() as chaos:
                chaos.start_soon(self._run_workload, start)
                chaos.start_soon(self._run_faults, start)
            self._quiesce()
            self.say(f"faults stopped ({self.result.faults_injected}); settling")
            await self._settle()
            nursery.cancel_scope.cancel()
        return self.result


def describe_crash(exc: BaseException) -> str:
    """The innermost error of a crash (through exception groups) and where it was raised."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/dracpu/" in f.filename] or frames
    where = f" at {ours[-1].filename.rsplit('/src/', 1)[-1]}:{ours[-1].lineno}" if ours else ""
    return f"{type(exc).__name__}: {exc}{where}"


async def run_chaos(opts: ChaosOptions) -> ChaosResult:
    """One seeded chaos run on a fresh simulated node; the work directory is removed after
    unless ``keep_workdir`` (or a violation, which keeps it for the post-mortem)."""
    if opts.intensity <= 0:
        raise ValueError(f"chaos intensity must be positive, got {opts.intensity}")
    step = (0.5 / opts.intensity, 2.2 / opts.intensity)
    plan = make_plan(opts.seed, opts.duration, mode=opts.mode, fault_step=step)
    topo = discover_from_root(opts.sysfs_root)
    workdir = opts.workdir or tempfile.mkdtemp(prefix="drc", dir="/tmp")
    mems = CPUSet(sorted(topo.by_numa)).format() or "0"
    node = SimNode(
        workdir=workdir,
        node_cpus=topo.online.format(),
        node_mems=mems,
        # Shorter than the kubelet's default so a pod that failed during the chaos is retried
        # soon after it ends; the retry logic itself is the same.
        kubelet_backoff=Backoff(initial=0.5, maximum=4.0),
    )
    chaos = ChaosRun(opts, plan, node)
    try:
        try:
            result = await chaos.run()
        except Exception as exc:
            # A part of the simulated node crashed (or the engine did): the run is void,
            # and says where instead of ending in a traceback.
            result = chaos.result
            result.violations.append(Violation("run-aborted", describe_crash(exc)))
        try:
            log_text = Path(node.path("dracpu.log")).read_text(errors="replace")
        except OSError:
            log_text = ""
        result.evidence = count_evidence(log_text)
    finally:
        failed = bool(chaos.result.violations) or not chaos.result.settled
        if not (opts.keep_workdir or failed or opts.workdir):
            shutil.rmtree(workdir, ignore_errors=True)
    return result


# -- command line --------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dracpu.sim.chaos",
        description="Seeded chaos run of the real daemon on the simulated node.",
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the workload and faults")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of chaos per run")
    p.add_argument(
        "--mode",
        choices=("grouped", "individual", "both"),
        default="both",
        help="cpuDeviceMode of the daemon; 'both' runs one of each, one after the other",
    )
    p.add_argument("--sysfs-root", default=DEFAULT_FIXTURE, help="fake sysfs of the node")
    p.add_argument("--reserved-cpus", default="0,40", help="the daemon's --reserved-cpus")
    p.add_argument("--settle-timeout", type=float, default=90.0)
    p.add_argument(
        "--intensity", type=float, default=1.0, help="fault rate relative to the default (~0.7/s)"
    )
    p.add_argument("--keep-workdir", action="store_true", help="keep the node's files")
    p.add_argument("--json", action="store_true", help="also print a JSON summary line")
    p.add_argument("-v", "--verbose", action="store_true", help="log faults on stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.verbose:
        # The simulated kubelet and runtime warn about every failure the faults cause.
        # Process-wide, so undone on the way out (tests call main() in-process).
        logging.disable(logging.WARNING)
    try:
        return _main(args)
    finally:
        logging.disable(logging.NOTSET)


def _main(args: argparse.Namespace) -> int:
    if args.duration <= 0:
        print(f"chaos: --duration must be positive, got {args.duration}", file=sys.stderr)
        return 2
    if args.intensity <= 0:
        print(f"chaos: --intensity must be positive, got {args.intensity}", file=sys.stderr)
        return 2
    modes = ("grouped", "individual") if args.mode == "both" else (args.mode,)
    results = []
    for mode in modes:
        opts = ChaosOptions(
            seed=args.seed,
            duration=args.duration,
            mode=mode,
            sysfs_root=args.sysfs_root,
            reserved_cpus=args.reserved_cpus,
            settle_timeout=args.settle_timeout,
            intensity=args.intensity,
            keep_workdir=args.keep_workdir,
            verbose=args.verbose,
        )
        started = time.monotonic()
        result = trio.run(run_chaos, opts)
        results.append(result)
        kinds = ", ".join(f"{k}={result.faults[k]}" for k in FAULT_KINDS)
        seen = ", ".join(f"{k}={result.evidence[k]}" for k in EVIDENCE)
        print(
            f"== mode {mode}, seed {args.seed}: {result.pods_created} pods created, "
            f"{result.pods_deleted} deleted, {time.monotonic() - started:.0f}s\n"
            f"   faults: {kinds}\n   missed (nothing to hit): {dict(result.missed)}\n"
            f"   daemon log: {seen}\n"
            f"   settling last waited for: {'; '.join(result.waited_for) or 'nothing'}"
        )
        if result.violations:
            print(f"   node files kept in {result.workdir}")
        sys.stdout.write(format_result(result))
        sys.stdout.flush()
    if len(results) > 1:
        total = ChaosResult(mode=args.mode, seed=args.seed)
        for r in results:
            total.faults.update(r.faults)
            total.violations.extend(r.violations)
        total.settle_ms = max(r.settle_ms for r in results)
        print(f"== total ({len(results)} runs; settle_ms is the longest)")
        sys.stdout.write(format_result(total))
    if args.json:
        print(
            json.dumps(
                {
                    r.mode: {
                        "faults": dict(r.faults),
                        "violations": [str(v) for v in r.violations],
                        "settle_ms": r.settle_ms,
                    }
                    for r in results
                }
            )
        )
    return 1 if any(r.violations for r in results) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
