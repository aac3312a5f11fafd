"""What a fleet run measured, and the arithmetic over the server's request log. Pure.

Every figure comes from the simulated API server's log of the requests it received
(``RequestRecord``: time, verb, resource, User-Agent, status) or from the nodes' own
counters of the requests they tried (refused connections included, which the server
never sees). ``FleetResult.lines()`` renders them as ``name: value`` lines.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from dracpu_sim.apiserver.faults import RequestRecord

__all__ = [
    "IDLE_VERBS",
    "FleetResult",
    "PhaseCounts",
    "peak_rate",
    "percentile",
    "phase_counts",
]

# Always reported at rest, even when none was seen.
IDLE_VERBS = ("list", "watch", "get", "create", "update", "patch", "delete")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by the nearest-rank method; NaN when empty."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def peak_rate(times: Iterable[float], *, width: float = 1.0) -> float:
    """The most requests in any window of ``width`` seconds, per second (a sliding
    window over the request times, not fixed bins that would split a burst in two)."""
    ordered = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(ordered):
        while t - ordered[start] >= width:
            start += 1
        best = max(best, end - start + 1)
    return best / width


@dataclass(frozen=True)
class PhaseCounts:
    """The requests of one phase, as the server saw them."""

    total: int
    by_verb: dict[str, int]
    ok_by_verb: dict[str, int]  # answered 2xx
    by_agent: dict[str, int]
    throttled: int  # answered 429
    writes: int
    peak_rps: float
    response_bytes: int  # bodies of the answers (not the events of watches)

    @property
    def max_per_agent(self) -> int:
        return max(self.by_agent.values(), default=0)


def phase_counts(records: Sequence[RequestRecord]) -> PhaseCounts:
    by_verb = Counter(r.verb for r in records)
    return PhaseCounts(
        total=len(records),
        by_verb=dict(sorted(by_verb.items())),
        ok_by_verb=dict(sorted(Counter(r.verb for r in records if 200 <= r.status < 300).items())),
        by_agent=dict(Counter(r.user_agent for r in records)),
        throttled=sum(1 for r in records if r.status == 429),
        writes=sum(n for verb, n in by_verb.items() if verb in WRITE_VERBS),
        peak_rps=peak_rate(r.time for r in records),
        response_bytes=sum(r.size for r in records),
    )


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


@dataclass
class FleetResult:
    """One fleet run. Counts are exact; times are wall-clock seconds on the simulating
    machine, where the API server and every node share one Python process, so they are
    upper bounds of what the reconcilers themselves need."""

    nodes: int
    mode: str
    cpus_per_node: int
    shapes: dict[str, int]  # fake sysfs machine -> nodes of that shape
    slices_per_node: float = 0.0
    objects_total: int = 0
    objects_bytes: int = 0
    startup_s: float = math.nan
    startup_requests: int = 0
    watches_open: int = 0
    idle_window_s: float = 0.0
    idle_per_node_hour: dict[str, float] = field(default_factory=dict)  # by verb
    idle_resyncs_from_cache: int = 0
    watch_timeout_mean_s: float = math.nan
    topology_changes: int = 0
    topology_change_s: list[float] = field(default_factory=list)
    topology: PhaseCounts | None = None
    topology_changes_unapplied: int = 0
    watch_drop: PhaseCounts | None = None
    watch_drop_recovered_s: float = math.nan
    restart_downtime_s: float = 0.0
    restart_deleted_slices: int = 0
    restart: PhaseCounts | None = None
    restart_max_node_attempts: int = 0
    restart_converged_s: float = math.nan
    restart_unconverged_nodes: int = 0
    rollout_window_s: float = 0.0
    rollout: PhaseCounts | None = None
    rollout_converged_s: float = math.nan
    rollout_unconverged_nodes: int = 0
    throttled_total: int = 0
    wall_s: float = 0.0

    @property
    def requests_per_node_hour_idle(self) -> float:
        return sum(self.idle_per_node_hour.values())

    @property
    def topology_change_p99_s(self) -> float:
        return percentile(self.topology_change_s, 99)

    def lines(self) -> list[str]:
        out: list[tuple[str, object]] = [
            ("nodes", self.nodes),
            ("mode", self.mode),
            ("cpus_per_node", self.cpus_per_node),
            ("shapes", ", ".join(f"{k}={v}" for k, v in sorted(self.shapes.items()))),
            ("slices_per_node", self.slices_per_node),
            ("objects_total", self.objects_total),
            ("objects_bytes", self.objects_bytes),
            ("startup_s", self.startup_s),
            ("startup_requests", self.startup_requests),
            ("watches_open", self.watches_open),
            ("idle_window_s", self.idle_window_s),
            ("requests_per_node_hour_idle", self.requests_per_node_hour_idle),
        ]
        out += [
            (f"requests_per_node_hour_idle_{verb}", rate)
            for verb, rate in sorted(self.idle_per_node_hour.items())
        ]
        out += [
            ("idle_resyncs_from_cache", self.idle_resyncs_from_cache),
            ("watch_timeout_mean_s", self.watch_timeout_mean_s),
            ("topology_changes", self.topology_changes),
            ("topology_change_p50_s", percentile(self.topology_change_s, 50)),
            ("topology_change_p99_s", self.topology_change_p99_s),
            (
                "topology_change_requests_per_change",
                self.topology.total / self.topology_changes
                if self.topology is not None and self.topology_changes
                else math.nan,
            ),
            ("topology_changes_unapplied", self.topology_changes_unapplied),
        ]
        if self.watch_drop is not None:
            out += [
                ("watch_drop_requests", self.watch_drop.total),
                ("watch_drop_relists", self.watch_drop.by_verb.get("list", 0)),
                ("watch_drop_max_node_requests", self.watch_drop.max_per_agent),
                ("watch_drop_peak_rps", self.watch_drop.peak_rps),
                ("watch_drop_recovered_s", self.watch_drop_recovered_s),
            ]
        if self.restart is not None:
            out += [
                ("restart_downtime_s", self.restart_downtime_s),
                ("restart_deleted_slices", self.restart_deleted_slices),
                ("restart_burst_requests", self.restart.total),
                ("restart_burst_lists", self.restart.by_verb.get("list", 0)),
                ("restart_peak_rps", self.restart.peak_rps),
                ("restart_response_bytes", self.restart.response_bytes),
                ("restart_throttled", self.restart.throttled),
                ("restart_max_node_requests", self.restart.max_per_agent),
                ("restart_max_node_attempts", self.restart_max_node_attempts),
                ("restart_converged_s", self.restart_converged_s),
                ("restart_unconverged_nodes", self.restart_unconverged_nodes),
            ]
        if self.rollout is not None:
            out += [
                ("rollout_window_s", self.rollout_window_s),
                ("rollout_requests", self.rollout.total),
                ("rollout_writes", self.rollout.writes),
                ("rollout_throttled", self.rollout.throttled),
                ("rollout_peak_rps", self.rollout.peak_rps),
                ("rollout_response_bytes", self.rollout.response_bytes),
                ("rollout_converged_s", self.rollout_converged_s),
                ("rollout_unconverged_nodes", self.rollout_unconverged_nodes),
            ]
        out += [("throttled_total", self.throttled_total), ("wall_s", self.wall_s)]
        return [f"{name}: {_fmt(value)}" for name, value in out]
