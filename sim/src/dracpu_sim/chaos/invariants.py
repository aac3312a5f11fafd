"""The invariants of a settled node (pure): what must hold after the faults stop.

:class:`Observation` is everything the checks look at, read from the node by
:mod:`dracpu_sim.chaos.observe`; :func:`check_invariants` lists each violated invariant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dracpu.cdi.env import DRAEnvError, parse_dra_env
from dracpu.cpuset import CPUSet, CPUSetParseError

__all__ = [
    "ContainerView",
    "Observation",
    "PodView",
    "SandboxView",
    "Violation",
    "check_invariants",
    "slice_devices",
]


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
class SandboxView:
    """A pod sandbox the runtime has: the CPUs its cgroup lets it use (effective set)."""

    pod: str  # namespace/name
    sandbox_id: str
    cgroup_cpus: str | None  # None: no cgroup


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
    sandboxes: list[SandboxView] = field(default_factory=list)
    # Interrupts of the daemon's fake procfs: each one's mask before the run and now, the
    # default affinity likewise, and the CPUs of the prepared claims that asked for
    # isolateIRQs (from the API's claims and the daemon's); None: not looked at.
    irq_originals: dict[int, CPUSet] | None = None
    irq_affinities: dict[int, CPUSet] = field(default_factory=dict)
    irq_default_original: CPUSet = field(default_factory=CPUSet)
    irq_default: CPUSet | None = None
    irq_banned: CPUSet = field(default_factory=CPUSet)


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
    # Reserved CPUs are never claimed but stay in the shared pool, as its floor (the CPU
    # Manager keeps its reservation in its shared pool; allocation/floor.py).
    want_pool = obs.online - union
    if obs.shared_pool != want_pool:
        out.append(
            Violation(
                "shared-pool-mismatch",
                f"shared pool {obs.shared_pool}, want {want_pool} (online minus claims)",
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


def _claims_cpus(
    obs: Observation, where: str, env: Mapping[str, CPUSet], out: list[Violation]
) -> CPUSet:
    """The CPUs of a container's claims, as its env names them; each must be the daemon's."""
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
    return want


def _check_intent(
    obs: Observation, ctr: ContainerView, where: str, want: CPUSet, out: list[Violation]
) -> None:
    """The daemon's container table intends what the container should have."""
    if obs.daemon_intents is None:
        return
    intent = obs.daemon_intents.get(ctr.container_id)
    if intent is None:
        out.append(Violation("intent-missing", f"{where}: the daemon does not know it"))
    elif intent != want.format():
        out.append(
            Violation("intent-mismatch", f"{where}: the daemon intends {intent}, want {want}")
        )


def _check_cgroup(
    ctr: ContainerView, where: str, want: CPUSet, holder: bool, out: list[Violation]
) -> None:
    """The cgroup file holds what the container should have."""
    if ctr.cgroup_cpus is None:
        out.append(Violation("cgroup-missing", f"{where}: no cgroup cpuset file"))
        return
    try:
        got = CPUSet.parse(ctr.cgroup_cpus)
    except CPUSetParseError as exc:
        out.append(Violation("cgroup-unreadable", f"{where}: {exc}"))
        return
    if got != want:
        what = "its claims" if holder else "the shared pool"
        out.append(Violation("cpuset-mismatch", f"{where}: cgroup cpuset {got}, {what} is {want}"))


def _check_containers(obs: Observation, out: list[Violation]) -> None:
    """Claim holders run on their claims' CPUs, the others on the shared pool."""
    for ctr in obs.containers:
        where = f"container {ctr.pod}/{ctr.name} ({ctr.container_id[:12]})"
        try:
            env = parse_dra_env(ctr.env)
        except DRAEnvError as exc:
            out.append(Violation("bad-env", f"{where}: {exc}"))
            continue
        want = _claims_cpus(obs, where, env, out) if env else obs.shared_pool
        _check_intent(obs, ctr, where, want, out)
        _check_cgroup(ctr, where, want, bool(env), out)


def _claimed_overlap(cgroup_cpus: str | None, claimed: CPUSet) -> CPUSet:
    """The claimed CPUs a cgroup's effective set includes (none when it cannot be read:
    the other checks report that)."""
    if cgroup_cpus is None:
        return CPUSet()
    try:
        return CPUSet.parse(cgroup_cpus) & claimed
    except CPUSetParseError:
        return CPUSet()


def _check_claimed_cpus(obs: Observation, out: list[Violation]) -> None:
    """No shared container and no pod sandbox may run on a prepared claim's CPU (read from
    the cgroup tree: each cgroup's effective set)."""
    claimed = CPUSet()
    for cpus in obs.daemon_claims.values():
        claimed |= cpus
    if not claimed:
        return
    for ctr in obs.containers:
        try:
            if parse_dra_env(ctr.env):
                continue  # a claim holder: _check_containers compares it with its claims
        except DRAEnvError:
            continue  # reported as bad-env
        overlap = _claimed_overlap(ctr.cgroup_cpus, claimed)
        if overlap:
            out.append(
                Violation(
                    "shared-on-claimed-cpu",
                    f"container {ctr.pod}/{ctr.name} ({ctr.container_id[:12]}) holds no claim "
                    f"but its cgroup allows claimed CPUs {overlap}",
                )
            )
    for sandbox in obs.sandboxes:
        overlap = _claimed_overlap(sandbox.cgroup_cpus, claimed)
        if overlap:
            out.append(
                Violation(
                    "sandbox-on-claimed-cpu",
                    f"pod sandbox of {sandbox.pod} ({sandbox.sandbox_id[:12]}): its cgroup "
                    f"allows claimed CPUs {overlap}",
                )
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


def _irq_wanted(original: CPUSet, banned: CPUSet) -> CPUSet:
    # An interrupt whose every CPU is banned keeps its original (dracpu never empties one).
    return (original - banned) or original


def _check_irqs(obs: Observation, out: list[Violation]) -> None:
    """While a claim asking for isolateIRQs is prepared no interrupt that can move (every
    one of the fake tree) may run on its CPUs, and every mask is its original minus the
    banned CPUs: nothing banned is left over once those claims are gone."""
    if obs.irq_originals is None:
        return
    banned = obs.irq_banned
    masks = [
        (f"interrupt {irq}", original, obs.irq_affinities.get(irq))
        for irq, original in sorted(obs.irq_originals.items())
    ]
    masks.append(("default_smp_affinity", obs.irq_default_original, obs.irq_default))
    for what, original, now in masks:
        if now is None:
            out.append(Violation("irq-unreadable", f"{what}: its mask could not be read"))
            continue
        wanted = _irq_wanted(original, banned)
        on_banned = now & banned
        if on_banned and not (wanted & banned):
            out.append(
                Violation(
                    "irq-on-isolated-cpu",
                    f"{what} may run on {on_banned}, CPUs of prepared claims that asked for "
                    "isolateIRQs",
                )
            )
        elif now != wanted:
            out.append(
                Violation(
                    "irq-mask-wrong",
                    f"{what} has {now}, want {wanted} (its original {original} minus the "
                    f"banned {banned or 'nothing'})",
                )
            )


def check_invariants(obs: Observation) -> list[Violation]:
    """Every violated invariant of a settled node; empty when all hold."""
    out: list[Violation] = []
    _check_claims(obs, out)
    _check_stores(obs, out)
    _check_containers(obs, out)
    _check_claimed_cpus(obs, out)
    _check_container_table(obs, out)
    _check_pods(obs, out)
    _check_slices(obs, out)
    _check_irqs(obs, out)
    return out
