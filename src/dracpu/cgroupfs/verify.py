"""The verification pass: after the runtime says it applied a cpuset, read the cgroup back.

A runtime can call an update a success that it never applied: containerd leaves updates
marked ``ignore_failure`` out of the failed list it returns (docs/how-it-works.md, "Verify,
don't trust"), and a runtime can apply an update while the cgroup ends up elsewhere. So
each ``VerifyCpusets`` is one pass, run by the cgroupfs writer task (``writer.py``): worker
threads read each container's effective cpuset back; every 128 containers that differ,
the writer asks the state owner which of them it still wants (after the read-back, so a
newer set the runtime applied meanwhile is never overwritten with an older one) and
writes those (``dracpu_cgroup_fallback_writes_total{cause="verify-mismatch"}``). A runtime
that dropped the whole update has its first cgroups written after 128 reads, not after
all of them. For a pool change the pass observes ``dracpu_pool_convergence_seconds`` once
every container is verified, whatever the runtime answered.

The updates the runtime reported as failed (``VerifyCpusets.failed``) are part of the same
pass: what still differs of them is written once, counted under
``cause="runtime-reported"`` and logged with the runtime's reason; a missing cgroup of one
of them is an error, not a skip. Pod sandboxes go through the pass too: NRI cannot update
a sandbox, so the pool pusher hands every sandbox over with each pool change, and the NRI
session each sandbox that starts; they are counted under ``cause="sandbox"`` and logged at
debug level, never as drift.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from dracpu.cgroupfs.blocking_writer import Results
from dracpu.messages import ContainerIntent
from dracpu.metrics import DriverMetrics

__all__ = ["PassTally", "account_pass"]

log = logging.getLogger(__name__)

CAUSE = "verify-mismatch"
SANDBOX_CAUSE = "sandbox"
RUNTIME_CAUSE = "runtime-reported"


class PassTally:
    """What the passes wrote, for tests and benchmarks (Trio thread only)."""

    def __init__(self) -> None:
        self.verified = 0
        """Containers and sandboxes read back."""
        self.rewritten = 0
        """Containers written because they differed (pod sandboxes are counted apart)."""
        self.sandboxes_written = 0


def account_pass(
    results: Results,
    failed: Mapping[str, str],
    tally: PassTally,
    metrics: DriverMetrics | None,
) -> list[str]:
    """Count and log one pass's writes; returns the ids of the containers written.

    ``failed`` maps the ids the runtime reported as failed to its reason."""
    written: list[str] = []
    for intent, outcome in results:
        if isinstance(outcome, Exception):
            error = str(outcome)
        else:
            error = "" if outcome.ok else outcome.describe_mismatch()
        reason = failed.get(intent.container_id)
        if metrics is not None:
            metrics.count_fallback_write("error" if error else "success", _cause(intent, reason))
        if reason is not None:
            _log_fallback(intent, reason, error)
            if not error:
                written.append(intent.container_id)
            continue
        if error:
            log.warning(
                "cpuset of %s %s is not what dracpu intends and cannot be written: %s",
                "pod sandbox" if intent.sandbox else "container",
                intent.container_id,
                error,
            )
            continue
        if intent.sandbox:
            tally.sandboxes_written += 1
            # One per pod and pool change: routine, not news.
            log.debug(
                "pod sandbox kept on the shared pool sandbox_id=%s pod_uid=%s cpus=%s",
                intent.container_id,
                intent.pod_uid,
                intent.cpus,
            )
            continue
        written.append(intent.container_id)
        log.info(
            "fallback cpuset write container_id=%s cpus=%s reason=%s",
            intent.container_id,
            intent.cpus,
            "the cgroup differed after the runtime's update",
        )
    tally.rewritten += len(written)
    return written


def _cause(intent: ContainerIntent, reason: str | None) -> str:
    if reason is not None:
        return RUNTIME_CAUSE
    return SANDBOX_CAUSE if intent.sandbox else CAUSE


def _log_fallback(intent: ContainerIntent, reason: str, error: str) -> None:
    if error:
        log.warning(
            "fallback cpuset write failed container_id=%s cpus=%s reason=%s: %s",
            intent.container_id,
            intent.cpus,
            reason,
            error,
        )
    else:
        log.info(
            "fallback cpuset write container_id=%s cpus=%s reason=%s",
            intent.container_id,
            intent.cpus,
            reason,
        )
