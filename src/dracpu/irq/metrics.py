"""The interrupt affinity service's metrics, on the daemon's registry.

Kept beside the service (not in ``dracpu.metrics``) so the feature is one package; the
reference table in docs/metrics.md lists them with dracpu's own metrics.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from dracpu.metrics import MetricDefinition

__all__ = ["IRQ_METRIC_DEFINITIONS", "IRQ_UNMOVED_REASONS", "IRQ_WRITE_RESULTS", "IrqMetrics"]

# Why an interrupt may still be delivered to a banned CPU after a pass.
IRQ_UNMOVED_REASONS = ("refused", "would-empty", "error")
IRQ_WRITE_RESULTS = ("success", "refused", "error")

IRQ_METRIC_DEFINITIONS: tuple[MetricDefinition, ...] = (
    MetricDefinition(
        "dracpu_irq_banned_cpus",
        "gauge",
        "CPUs that device interrupts are kept off now: those of the prepared claims that "
        "asked for it (isolateIRQs), or of every prepared claim when the node config says so.",
    ),
    MetricDefinition(
        "dracpu_irq_unmoved",
        "gauge",
        "Interrupts still allowed on banned CPUs after the last pass: refused (the kernel "
        "does not let user space move it: managed or per-CPU interrupts), would-empty (every "
        "online CPU it may use is banned, so no mask without one was written) or error (its "
        "file could not be read or written).",
        ("reason",),
    ),
    MetricDefinition(
        "dracpu_irq_affinity_writes_total",
        "counter",
        "Writes of /proc/irq/N/smp_affinity_list and /proc/irq/default_smp_affinity: "
        "success, refused (EIO or EPERM: the kernel does not let user space move the "
        "interrupt) or error.",
        ("result",),
    ),
)


def _help(name: str) -> str:
    return next(d.help for d in IRQ_METRIC_DEFINITIONS if d.name == name)


class IrqMetrics:
    """The three collectors, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.banned_cpus = Gauge(
            "dracpu_irq_banned_cpus", _help("dracpu_irq_banned_cpus"), registry=registry
        )
        self.unmoved = Gauge(
            "dracpu_irq_unmoved", _help("dracpu_irq_unmoved"), ("reason",), registry=registry
        )
        self.writes = Counter(
            "dracpu_irq_affinity_writes",
            _help("dracpu_irq_affinity_writes_total"),
            ("result",),
            registry=registry,
        )
        for reason in IRQ_UNMOVED_REASONS:
            self.unmoved.labels(reason=reason)
        for result in IRQ_WRITE_RESULTS:
            self.writes.labels(result=result)

    def count_write(self, result: str) -> None:
        if result not in IRQ_WRITE_RESULTS:
            raise ValueError(f"unknown interrupt affinity write result {result!r}")
        self.writes.labels(result=result).inc()

    def show(self, *, banned: int, refused: int, would_empty: int, error: int) -> None:
        self.banned_cpus.set(banned)
        self.unmoved.labels(reason="refused").set(refused)
        self.unmoved.labels(reason="would-empty").set(would_empty)
        self.unmoved.labels(reason="error").set(error)
