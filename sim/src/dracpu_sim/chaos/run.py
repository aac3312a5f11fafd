"""The chaos engine (Trio, on the simulated node): run a plan, stop, settle, observe.

:func:`run_chaos` starts a fresh :class:`~dracpu_sim.node.SimNode` with the real daemon,
plays the plan's workload and faults side by side, then stops injecting and waits for the
node to settle (daemon ready, every pod where it should be, a drift check since the last
fault) and for the invariants to hold, up to ``settle_timeout``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from dracpu.cpuset import CPUSet
from dracpu.topology.discover import discover_from_root
from dracpu_sim.chaos.faults import inject_fault
from dracpu_sim.chaos.invariants import Observation, Violation, check_invariants
from dracpu_sim.chaos.observe import desired_slices, observe_node, pod_views
from dracpu_sim.chaos.plan import (
    FAULT_KINDS,
    NAMESPACE,
    Action,
    Plan,
    PodPlan,
    claim_object,
    make_plan,
    pod_object,
)
from dracpu_sim.kubelet.pods import Backoff
from dracpu_sim.node import SimNode, SimNodeError

__all__ = [
    "DEFAULT_FIXTURE",
    "EVIDENCE",
    "ChaosOptions",
    "ChaosResult",
    "ChaosRun",
    "count_evidence",
    "describe_crash",
    "format_result",
    "run_chaos",
]

DEFAULT_FIXTURE = str(Path(__file__).parents[4] / "tests" / "fake_sysfs" / "xeon-2s-ht")


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
    # The simulated node's cgroup hierarchy and driver (v2 + systemd, as most nodes run).
    cgroup_version: int = 2
    cgroup_driver: str = "systemd"


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
    return desired_slices(
        opts.sysfs_root,
        mode=opts.mode,
        reserved_cpus=opts.reserved_cpus,
        node_name=node_name,
        node_uid=node_uid,
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
    async def _inject(self, action: Action) -> str | None:
        """Inject one fault; what it did, or None when it found nothing to hit."""
        return await inject_fault(self.node, action, self.say)

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
        runtime.set_update_mode("apply")

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
        for pod in pod_views(self.node):
            if pod.deleting:
                reasons.append(f"pod {pod.ref} still terminating")
            elif pod.bound and pod.phase != "Running":
                reasons.append(f"pod {pod.ref} not running yet")
            elif not pod.bound and not pod.unschedulable:
                reasons.append(f"pod {pod.ref} not scheduled yet")
        if self._gc_claims:
            self._collect_claims()
        return reasons

    async def observe(self) -> Observation:
        return await observe_node(
            self.node,
            online=self.online,
            reserved=self.reserved,
            desired=self.desired,
            # The node's fake procfs: interrupts kept off the claims that ask (isolateIRQs).
            irqs=self.node.irqs,
        )

    async def _drift_baseline(self) -> tuple[int, int]:
        """(daemon pid, drift checks done) when the faults stopped; (-1, 0) if unknown."""
        node = self.node
        daemon = node.daemon
        if daemon is not None and daemon.running():
            try:
                state = await node.debug_state()
                return (daemon.process.pid, int((state.get("drift") or {}).get("checks") or 0))
            except (OSError, SimNodeError, ValueError):
                pass
        return (-1, 0)

    async def _settle(self) -> None:
        stopped = trio.current_time()
        deadline = stopped + self.opts.settle_timeout
        baseline = await self._drift_baseline()
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
        cgroup_version=opts.cgroup_version,
        cgroup_driver=opts.cgroup_driver,
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
