"""The driver's own Prometheus metrics (behavior.md §2.4 and §15).

The help strings are data: `/metrics` and `dracpu introspect metrics` expose them verbatim.
Collectors live on a registry passed in (never the global one), so tests and the simulated
node can run several drivers in one process.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dracpu.allocation.store import StoreSnapshot

__all__ = [
    "DRACPU_METRIC_DEFINITIONS",
    "METRIC_DEFINITIONS",
    "DriverMetrics",
    "MetricDefinition",
    "describe_metrics_json",
]

RESULT_LABELS = ("success", "error", "unknown")
# Why dracpu wrote a cpuset itself: the runtime said the update failed, the cgroup read back
# after an update the runtime called a success differed, or the drift watcher found it.
FALLBACK_CAUSES = ("runtime-reported", "verify-mismatch", "drift", "sandbox")
# dracpu_claim_status_writes_total (dracpu.k8s.claim_status): what was applied, and how it went.
CLAIM_STATUS_OPERATIONS = ("apply", "remove")
CLAIM_STATUS_RESULTS = ("success", "error", "gone", "refused")
CONVERGENCE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
CPU_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True, slots=True)
class MetricDefinition:
    name: str
    type: str
    help: str
    labels: tuple[str, ...] = ()
    stability: str = "ALPHA"


METRIC_DEFINITIONS: tuple[MetricDefinition, ...] = (
    MetricDefinition(
        "dra_cpu_allocated_cpus",
        "gauge",
        "Number of CPUs currently allocated to prepared resource claims.",
    ),
    MetricDefinition(
        "dra_cpu_available_cpus",
        "gauge",
        "Number of CPUs available for allocation after reserved and active claim CPUs "
        "are excluded.",
    ),
    MetricDefinition(
        "dra_cpu_reserved_cpus",
        "gauge",
        "Number of CPUs reserved and excluded from DRA management.",
    ),
    MetricDefinition(
        "dra_cpu_resource_claims_active",
        "gauge",
        "Number of resource claims currently recorded as active by the allocation store.",
    ),
    MetricDefinition(
        "dra_cpu_prepare_claims_total",
        "counter",
        "Total number of per-claim PrepareResourceClaims results.",
        ("result",),
    ),
    MetricDefinition(
        "dra_cpu_unprepare_claims_total",
        "counter",
        "Total number of per-claim UnprepareResourceClaims results.",
        ("result",),
    ),
    MetricDefinition(
        "dra_cpu_prepare_claim_duration_seconds",
        "histogram",
        "Duration of per-claim prepare operations in seconds.",
    ),
    MetricDefinition(
        "dra_cpu_claim_allocated_cpus",
        "histogram",
        "Number of CPUs allocated for each newly successful claim allocation.",
    ),
)


# dracpu's own metrics, beyond upstream's contract list above (which `introspect metrics`
# reproduces exactly): the cgroupfs fallback and drift watcher, the NRI session and the
# checkpoint have no upstream counterpart.
DRACPU_METRIC_DEFINITIONS: tuple[MetricDefinition, ...] = (
    MetricDefinition(
        "dracpu_cgroup_fallback_writes_total",
        "counter",
        "cpuset writes dracpu made itself because the runtime could not apply an update "
        "(or, for pod sandboxes, cannot update them at all).",
        ("result", "cause"),
    ),
    MetricDefinition(
        "dracpu_pool_convergence_seconds",
        "histogram",
        "Time from a shared pool change to every shared container's cgroup verified on it.",
    ),
    MetricDefinition(
        "dracpu_cpu_hotplug_events_total",
        "counter",
        "Changes of the node's online CPUs that dracpu noticed (a CPU taken offline or back).",
    ),
    MetricDefinition(
        "dracpu_claims_on_offline_cpus",
        "gauge",
        "Prepared claims holding at least one CPU that is offline now (reported UNHEALTHY).",
    ),
    MetricDefinition(
        "dracpu_cgroup_cpuset_hierarchy_found",
        "gauge",
        "1 when dracpu found the cpuset cgroup hierarchy it writes to, 0 when it found none.",
    ),
    MetricDefinition(
        "dracpu_cgroup_drift_repairs_total",
        "counter",
        "Containers whose enforced cpuset differed from the intended one and was rewritten.",
        ("result",),
    ),
    MetricDefinition(
        "dracpu_cgroup_drifted_containers",
        "gauge",
        "Containers whose enforced cpuset differed from the intended one at the last check.",
    ),
    MetricDefinition(
        "dracpu_nri_reconnects_total",
        "counter",
        "NRI sessions started again after the runtime closed or dropped the previous one.",
    ),
    MetricDefinition(
        "dracpu_checkpoint_writes_total",
        "counter",
        "Writes of the allocation checkpoint.",
        ("result",),
    ),
    MetricDefinition(
        "dracpu_claim_status_writes_total",
        "counter",
        "Server-side applies of dracpu's entries in ResourceClaim status.devices: operation "
        "apply (after a prepare) or remove (after an unprepare); result success, error "
        "(retried), gone (the claim was deleted or replaced) or refused (the API server "
        "refused it or dropped the field).",
        ("operation", "result"),
    ),
)


def describe_metrics_json() -> str:
    """The JSON document of `dracpu introspect metrics`: 2-space indent, trailing newline."""
    doc = [
        {
            "name": d.name,
            "type": d.type,
            "stability": d.stability,
            "help": d.help,
            "labels": list(d.labels),
        }
        for d in METRIC_DEFINITIONS
    ]
    return json.dumps(doc, indent=2) + "\n"


def _defn(name: str) -> MetricDefinition:
    return next(d for d in METRIC_DEFINITIONS + DRACPU_METRIC_DEFINITIONS if d.name == name)


class DriverMetrics:
    """The eight contract metrics and dracpu's own, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str) -> Gauge:
            return Gauge(name, _defn(name).help, registry=registry)

        def counter(name: str) -> Counter:
            # prometheus-client appends `_total` itself; give it the bare name.
            labels = _defn(name).labels
            c = Counter(name.removesuffix("_total"), _defn(name).help, labels, registry=registry)
            if labels == ("result",):
                for result in RESULT_LABELS:
                    c.labels(result=result)
            return c

        self.allocated_cpus = gauge("dra_cpu_allocated_cpus")
        self.available_cpus = gauge("dra_cpu_available_cpus")
        self.reserved_cpus = gauge("dra_cpu_reserved_cpus")
        self.claims_active = gauge("dra_cpu_resource_claims_active")
        self.prepare_claims = counter("dra_cpu_prepare_claims_total")
        self.unprepare_claims = counter("dra_cpu_unprepare_claims_total")
        self.prepare_duration = Histogram(
            "dra_cpu_prepare_claim_duration_seconds",
            _defn("dra_cpu_prepare_claim_duration_seconds").help,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.claim_allocated_cpus = Histogram(
            "dra_cpu_claim_allocated_cpus",
            _defn("dra_cpu_claim_allocated_cpus").help,
            buckets=CPU_COUNT_BUCKETS,
            registry=registry,
        )
        fallback = _defn("dracpu_cgroup_fallback_writes_total")
        self.fallback_writes = Counter(
            fallback.name.removesuffix("_total"), fallback.help, fallback.labels, registry=registry
        )
        for cause in FALLBACK_CAUSES:
            for result in RESULT_LABELS:
                self.fallback_writes.labels(result=result, cause=cause)
        self.pool_convergence = Histogram(
            "dracpu_pool_convergence_seconds",
            _defn("dracpu_pool_convergence_seconds").help,
            buckets=CONVERGENCE_BUCKETS,
            registry=registry,
        )
        self.cpuset_hierarchy_found = gauge("dracpu_cgroup_cpuset_hierarchy_found")
        self.hotplug_events = counter("dracpu_cpu_hotplug_events_total")
        self.claims_on_offline_cpus = gauge("dracpu_claims_on_offline_cpus")
        self.cpuset_hierarchy_found.set(1)
        self.drift_repairs = counter("dracpu_cgroup_drift_repairs_total")
        self.drifted_containers = gauge("dracpu_cgroup_drifted_containers")
        self.nri_reconnects = counter("dracpu_nri_reconnects_total")
        self.checkpoint_writes = counter("dracpu_checkpoint_writes_total")
        status = _defn("dracpu_claim_status_writes_total")
        self.claim_status_writes = Counter(
            status.name.removesuffix("_total"), status.help, status.labels, registry=registry
        )
        for operation in CLAIM_STATUS_OPERATIONS:
            for result in CLAIM_STATUS_RESULTS:
                self.claim_status_writes.labels(operation=operation, result=result)

    @staticmethod
    def _count(c: Counter, result: str) -> None:
        c.labels(result=result if result in RESULT_LABELS else "unknown").inc()

    def count_fallback_write(self, result: str, cause: str) -> None:
        result = result if result in RESULT_LABELS else "unknown"
        self.fallback_writes.labels(result=result, cause=cause).inc()

    def count_drift_repair(self, result: str) -> None:
        self._count(self.drift_repairs, result)

    def count_claim_status_write(self, operation: str, result: str) -> None:
        if operation not in CLAIM_STATUS_OPERATIONS or result not in CLAIM_STATUS_RESULTS:
            raise ValueError(f"unknown claim status write {operation}/{result}")
        self.claim_status_writes.labels(operation=operation, result=result).inc()

    def count_checkpoint_write(self, result: str) -> None:
        self._count(self.checkpoint_writes, result)

    def count_prepare(self, result: str) -> None:
        self._count(self.prepare_claims, result)

    def count_unprepare(self, result: str) -> None:
        self._count(self.unprepare_claims, result)

    def show_store(self, snapshot: StoreSnapshot) -> None:
        """The four gauges from the allocation store's snapshot (§15)."""
        self.set_snapshot(
            allocated=snapshot.allocated,
            available=snapshot.available,
            reserved=snapshot.reserved,
            active=snapshot.active,
        )

    def set_snapshot(self, *, allocated: int, available: int, reserved: int, active: int) -> None:
        self.allocated_cpus.set(allocated)
        self.available_cpus.set(available)
        self.reserved_cpus.set(reserved)
        self.claims_active.set(active)
