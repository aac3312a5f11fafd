"""The node's allocation state and its one owner: stores, checkpoint file, start-up restore.

Everything that changes which CPUs a claim or a container holds goes through the stores
held here. Trio runs one task at a time, so the kubelet service and the NRI plugin call
their synchronous methods directly; none of them awaits in the middle of a change. The
checkpoint is the only I/O, and it is written atomically (temp file, fsync, rename,
directory fsync) in a worker thread, shielded so a cancellation cannot tear it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import trio

from dracpu import cdi
from dracpu.allocation.checkpoint import (
    CHECKPOINT_VERSION,
    Checkpoint,
    CheckpointError,
    decode_checkpoint,
    encode_checkpoint,
)
from dracpu.allocation.store import AllocationStore, ClaimTracker, ContainerState
from dracpu.cpuset import CPUSet
from dracpu.daemon.recovery import RecoveryPlan, plan_recovery
from dracpu.metrics import DriverMetrics

__all__ = ["CHECKPOINT_FILE", "NodeState", "StateFileError", "read_boot_id"]

log = logging.getLogger("dracpu.state")

CHECKPOINT_FILE = "checkpoint.json"


class StateFileError(Exception):
    """The checkpoint could not be written; the message names the file and the OS error."""


def read_boot_id(proc_root: str = "/proc") -> str:
    """This boot's id, which changes on every reboot (empty when the kernel hides it)."""
    try:
        return Path(proc_root, "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass
class NodeState:
    """The three stores of behavior.md §12 plus the checkpoint that makes them durable."""

    store: AllocationStore
    state_dir: str
    boot_id: str
    config_fingerprint: str
    metrics: DriverMetrics | None = None
    tracker: ClaimTracker = field(default_factory=ClaimTracker)
    containers: ContainerState = field(default_factory=ContainerState)
    checkpoint_writes: int = 0
    last_error: str = ""

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.state_dir, CHECKPOINT_FILE)

    def refresh_gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.show_store(self.store.snapshot())

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(
            version=CHECKPOINT_VERSION,
            boot_id=self.boot_id,
            config_fingerprint=self.config_fingerprint,
            claims=tuple(sorted(self.store.records(), key=lambda r: r.uid)),
        )

    def write_checkpoint(self) -> None:
        """Write the checkpoint now (blocking). Raises StateFileError."""
        data = encode_checkpoint(self.checkpoint())
        path = self.checkpoint_path
        try:
            cdi.atomic_write(str(path), data, dir_mode=0o750)
        except OSError as exc:
            self.last_error = f'failed to write checkpoint "{path}": {exc.strerror or exc}'
            if self.metrics is not None:
                self.metrics.count_checkpoint_write("error")
            raise StateFileError(self.last_error) from exc
        self.checkpoint_writes += 1
        if self.metrics is not None:
            self.metrics.count_checkpoint_write("success")

    async def persist(self) -> None:
        """Write the checkpoint from a worker thread; a cancellation waits for the rename."""
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.write_checkpoint)

    # -- start-up -------------------------------------------------------------------------

    def _read_checkpoint(self) -> tuple[Checkpoint | None, str | None]:
        path = self.checkpoint_path
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return None, f'cannot read "{path}": {exc.strerror or exc}'
        try:
            return decode_checkpoint(data), None
        except CheckpointError as exc:
            # Keep the bad file for a bug report instead of overwriting it on the next write.
            aside = path.with_name(f"{path.name}.corrupt")
            try:
                os.replace(path, aside)
                return None, f"{exc} (moved to {aside})"
            except OSError:
                return None, str(exc)

    def restore(self, cdi_dir: str) -> RecoveryPlan:
        """Rebuild the allocation store from the checkpoint and the CDI specs (blocking)."""
        checkpoint, problem = self._read_checkpoint()
        scan = cdi.read_claim_specs(cdi_dir)
        for line in scan.errors:
            log.warning("ignoring unreadable CDI spec: %s", line)
        plan = plan_recovery(
            checkpoint=checkpoint,
            checkpoint_problem=problem,
            boot_id=self.boot_id,
            config_fingerprint=self.config_fingerprint,
            cdi_claims=scan.claims,
            allocatable=self.store.available,
        )
        for note in plan.notes:
            log.warning("%s", note)
        for record in plan.claims:
            self.store.reserve(record)
        by_uid = {r.uid: r.cpus for r in plan.claims}
        for uid in plan.write_specs:
            cdi.write_claim_spec(cdi_dir, uid, by_uid[uid])
        for uid in plan.remove_specs:
            cdi.remove_claim_spec(cdi_dir, uid)
        log.info(
            "restored allocation state source=%s claims=%d specsWritten=%d specsRemoved=%d",
            plan.source,
            len(plan.claims),
            len(plan.write_specs),
            len(plan.remove_specs),
        )
        self.write_checkpoint()
        self.refresh_gauges()
        return plan

    def claims_by_uid(self) -> dict[str, CPUSet]:
        return {r.uid: r.cpus for r in self.store.records()}
