"""What makes the node's state survive a restart: the checkpoint file and its writer task.

The writer reads ``ClaimsChanged`` from the state owner. It takes every message waiting in
its inbox, writes one checkpoint of the claims as they are at that instant (temp file,
fsync, rename, directory fsync, in a worker thread) and answers each message that asked
with a ``CheckpointWritten``: concurrent changes share one fsync. ``restore`` is the
start-up half (behavior.md §18, ``daemon/recovery.py``).

A write must complete: prepares and unprepares answer the kubelet only once it is on
disk, and the waiters of a write that was started are told how it went. So a cancellation
(a stop) does not cut it short, but waits for it ``nursery.threads.STOP_BOUND`` seconds
at most (``run_to_completion``): a hung disk cannot keep the daemon from stopping within
its grace period. A write left to its thread then lands whole or not at all (a rename),
its waiters hear that whether it landed is unknown (so they undo nothing it may hold),
and writes take one worker thread at a time (a limiter of one, held until the thread
really ends), so no later checkpoint can be overtaken by an older one.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
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
from dracpu.atomicfile import atomic_write
from dracpu.cpuset import CPUSet
from dracpu.daemon.recovery import RecoveryPlan, plan_recovery
from dracpu.messages import CheckpointWritten, ClaimsChanged
from dracpu.nursery.threads import STOP_BOUND, run_to_completion
from dracpu.state.owner import NodeState
from dracpu.state.steps import StateFileError

__all__ = ["CHECKPOINT_FILE", "CheckpointFile", "read_boot_id", "recorded_claim_cpus"]

log = logging.getLogger("dracpu.state")

CHECKPOINT_FILE = "checkpoint.json"


def read_boot_id(proc_root: str = "/proc") -> str:
    """This boot's id, which changes on every reboot (empty when the kernel hides it)."""
    try:
        return Path(proc_root, "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


class CheckpointFile:
    """The checkpoint of one node's claims in ``state_dir``; see the module docstring."""

    def __init__(
        self,
        state: NodeState,
        state_dir: str,
        *,
        boot_id: str,
        config_fingerprint: str,
        write_file: Callable[..., None] = atomic_write,
        stop_bound: float = STOP_BOUND,
    ) -> None:
        """``write_file(path, data, dir_mode=...)`` writes atomically (tests wrap it);
        ``stop_bound``: how long a stop waits for a write in progress."""
        if not stop_bound >= 0:
            raise ValueError(f"checkpoint stop bound must be >= 0 seconds, got {stop_bound}")
        self.state = state
        self.stop_bound = stop_bound
        self._one_write = trio.CapacityLimiter(1)
        self._write_file = write_file
        self.state_dir = state_dir
        self.boot_id = boot_id
        self.config_fingerprint = config_fingerprint
        self.writes = 0
        self.last_error = ""

    @property
    def path(self) -> Path:
        return Path(self.state_dir, CHECKPOINT_FILE)

    def checkpoint(self) -> Checkpoint:
        """The claims to keep now: prepared ones not being released, and pending ones."""
        return Checkpoint(
            version=CHECKPOINT_VERSION,
            boot_id=self.boot_id,
            config_fingerprint=self.config_fingerprint,
            claims=tuple(sorted(self.state._store.durable_records(), key=lambda r: r.uid)),
        )

    def write(self, checkpoint: Checkpoint | None = None) -> None:
        """Write the checkpoint now (blocking). Raises StateFileError."""
        data = encode_checkpoint(checkpoint or self.checkpoint())
        metrics = self.state.metrics
        try:
            self._write_file(str(self.path), data, dir_mode=0o750)
        except OSError as exc:
            self.last_error = f'failed to write checkpoint "{self.path}": {exc.strerror or exc}'
            if metrics is not None:
                metrics.count_checkpoint_write("error")
            raise StateFileError(self.last_error) from exc
        self.writes += 1
        self.last_error = ""
        if metrics is not None:
            metrics.count_checkpoint_write("success")

    # -- the writer task ----------------------------------------------------------------
    async def run(
        self,
        changes: trio.MemoryReceiveChannel[ClaimsChanged],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Write a checkpoint for each batch of ``ClaimsChanged``; answer who asked.

        Runs inside ``NodeState.checkpoint_writer()``, the one place that says whether a
        writer runs: prepares and unprepares fail at once outside it."""
        batch: list[ClaimsChanged] = []
        left_running: list[bool] = []
        with self.state.checkpoint_writer():
            task_status.started()
            try:
                while True:
                    try:
                        batch = [await changes.receive()]
                    except trio.EndOfChannel:
                        return  # the owner stopped publishing
                    while True:
                        try:
                            batch.append(changes.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    left_running.clear()
                    error = await self._write_batch(left_running)
                    _answer(batch, error)
                    batch = []
            finally:
                # Nobody may wait for a write that will not happen: answer the batch in
                # hand and everything queued, in one step with no await; leaving the
                # writer's context then refuses new waiters. The batch in hand may have
                # been left writing (the stop bound ran out): whether it lands is unknown,
                # and its waiters must not undo their changes. Those queued behind it are
                # in no snapshot taken, and no later write starts: not written.
                if left_running:
                    _answer(batch, WRITE_LEFT_RUNNING, outcome_unknown=True)
                    batch = []
                while True:
                    try:
                        batch.append(changes.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                _answer(batch, "the checkpoint writer stopped")

    async def _write_batch(self, left_running: list[bool]) -> str:
        """Write one snapshot; the error, or "". ``left_running`` gets an entry when a stop
        left the write in its thread past the stop bound."""
        snapshot = self.checkpoint()
        began: list[bool] = []

        def write() -> None:
            began.append(True)  # run_to_completion runs this only if nobody gave up yet
            self.write(snapshot)

        try:
            await run_to_completion(write, limiter=self._one_write, bound=self.stop_bound)
        except StateFileError as exc:
            log.error("%s", exc)
            return str(exc)
        except trio.Cancelled:
            # Cancelled with the write begun: the bound ran out and its thread goes on. A
            # thread that still holds the limiter may be about to begin it: unknown too
            # (the safe side: "not written" would make waiters undo what may land).
            if began or self._one_write.borrowed_tokens:
                left_running.append(True)
            raise
        return ""

    # -- start-up -------------------------------------------------------------------------
    def _read(self) -> tuple[Checkpoint | None, str | None]:
        path = self.path
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
        """Rebuild the claims from the checkpoint and the CDI specs (blocking, at start)."""
        checkpoint, problem = self._read()
        scan = cdi.read_claim_specs(cdi_dir)
        for line in scan.errors:
            log.warning("ignoring unreadable CDI spec: %s", line)
        plan = plan_recovery(
            checkpoint=checkpoint,
            checkpoint_problem=problem,
            boot_id=self.boot_id,
            config_fingerprint=self.config_fingerprint,
            cdi_claims=scan.claims,
            allocatable=self.state._store.available,
        )
        for note in plan.notes:
            log.warning("%s", note)
        self.state.restore(plan.claims)
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
        self.write()
        return plan


def recorded_claim_cpus(state_dir: str, cdi_dir: str) -> CPUSet:
    """The CPUs of every claim the checkpoint or the CDI specs hold, trusted or not (blocking,
    read-only: a file that cannot be read adds nothing). The daemon keeps its shared core
    off them, so a claim prepared by an earlier dracpu is never taken for the floor."""
    cpus = CPUSet()
    try:
        checkpoint = decode_checkpoint(Path(state_dir, CHECKPOINT_FILE).read_bytes())
    except (OSError, CheckpointError):
        checkpoint = None
    if checkpoint is not None:
        for record in checkpoint.claims:
            cpus |= record.cpus
    for held in cdi.read_claim_specs(cdi_dir).claims.values():
        cpus |= held
    return cpus


# What the waiters of a write left in its thread at a stop hear.
WRITE_LEFT_RUNNING = (
    "the checkpoint writer stopped during a write that did not end within the stop bound:"
    " whether the checkpoint holds this change is unknown"
)


def _answer(batch: list[ClaimsChanged], error: str, *, outcome_unknown: bool = False) -> None:
    for message in batch:
        if message.reply is None:
            continue
        # A waiter cancelled meanwhile has closed its end: nobody to tell. One answer per
        # change: the writer closes its end once it answered.
        with message.reply, contextlib.suppress(trio.BrokenResourceError, trio.WouldBlock):
            message.reply.send_nowait(
                CheckpointWritten(
                    generation=message.generation, error=error, outcome_unknown=outcome_unknown
                )
            )
