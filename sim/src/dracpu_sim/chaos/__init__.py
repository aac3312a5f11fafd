"""The chaos run: a seeded workload and fault schedule on the simulated node, then invariants.

The real daemon (``dracpu run``, a child process) serves the simulated node of
:mod:`dracpu_sim.node` while pods with claims (and plain pods) come and go and faults are
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
- every pod bound to the node (its claims allocated) runs; every deleted pod is gone;
- no interrupt of the daemon's fake procfs (``--proc-root``) may run on the CPUs of a
  prepared claim that asked for ``isolateIRQs``, and every mask, the default affinity
  too, is its original minus those CPUs (so none stays banned once the claims are gone).

The schedule is a pure function of the seed (:func:`make_plan`): the same seed gives the
same pods, the same faults at the same offsets, with the same parameters. Which container
a tamper hits, or which slice is deleted, is chosen from what exists when it fires (by the
planned random number), so wall-clock interleavings may differ between two runs.

Modules: :mod:`~dracpu_sim.chaos.plan` (the seeded plan, pure),
:mod:`~dracpu_sim.chaos.invariants` (the checks, pure), :mod:`~dracpu_sim.chaos.observe`
(reading the node), :mod:`~dracpu_sim.chaos.faults` (one injector per fault kind),
:mod:`~dracpu_sim.chaos.run` (the engine) and :mod:`~dracpu_sim.chaos.cli`.

Command line: ``python -m dracpu_sim.chaos --seed 1 --duration 300`` prints, per run,
``faults_injected: N``, each violation on a line of its own, ``invariant_violations: N`` and
``settle_ms: X``; with ``--mode both`` (the default) a grouped and an individual run, then
the totals in the same three lines. Exit code 0 when no invariant was violated.
"""

from __future__ import annotations

from dracpu_sim.chaos.cli import main
from dracpu_sim.chaos.faults import API_409_TARGETS, API_500_TARGETS
from dracpu_sim.chaos.invariants import (
    ContainerView,
    Observation,
    PodView,
    SandboxView,
    Violation,
    check_invariants,
    slice_devices,
)
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
from dracpu_sim.chaos.run import (
    DEFAULT_FIXTURE,
    EVIDENCE,
    ChaosOptions,
    ChaosResult,
    ChaosRun,
    count_evidence,
    describe_crash,
    format_result,
    run_chaos,
)
from dracpu_sim.chaos.run import _desired_slices as _desired_slices  # tests/chaos use it

__all__ = [
    "API_409_TARGETS",
    "API_500_TARGETS",
    "DEFAULT_FIXTURE",
    "EVIDENCE",
    "FAULT_KINDS",
    "NAMESPACE",
    "Action",
    "ChaosOptions",
    "ChaosResult",
    "ChaosRun",
    "ContainerView",
    "Observation",
    "Plan",
    "PodPlan",
    "PodView",
    "SandboxView",
    "Violation",
    "check_invariants",
    "claim_object",
    "count_evidence",
    "describe_crash",
    "desired_slices",
    "format_result",
    "main",
    "make_plan",
    "observe_node",
    "pod_object",
    "pod_views",
    "run_chaos",
    "slice_devices",
]
