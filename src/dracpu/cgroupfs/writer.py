"""The raw cpuset writer: dracpu pins a container itself when the runtime could not.

The writer comes in layers: ``plan.py`` decides which cgroup files get which sets in which
order (pure), ``files.py`` reads and writes one cgroup file, and ``BlockingCgroupWriter``
(``blocking_writer.py``) carries a container's write out, parents widened first, and reads
the effective set back. This module is the Trio side: :class:`CgroupWriter` runs that
synchronous core in a worker thread, shielded so a cancelled caller cannot tear a write
from its read-back, and its ``run_fallback`` consumes the NRI session's
``CpusetUpdateFailed`` messages. The names callers use from the layers below are
re-exported here.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import msgspec
import trio

from dracpu.cgroupfs.blocking_writer import BlockingCgroupWriter
from dracpu.cgroupfs.files import CPUS_FILE as CPUS_FILE
from dracpu.cgroupfs.files import MEMS_FILE as MEMS_FILE
from dracpu.cgroupfs.files import read_cgroup_file, write_cgroup_file
from dracpu.cgroupfs.paths import CgroupPathError
from dracpu.cgroupfs.plan import (
    CgroupIntentError,
    CgroupWriteError,
    CpusetWrite,
    WriteOutcome,
    plan_cpuset_writes,
)
from dracpu.messages import ContainerIntent, CpusetUpdateFailed

__all__ = [
    "CgroupIntentError",
    "CgroupWriteError",
    "CgroupWriter",
    "CpusetWrite",
    "WriteOutcome",
    "plan_cpuset_writes",
    "read_cgroup_file",
    "write_cgroup_file",
]

log = logging.getLogger(__name__)


class FallbackResult(msgspec.Struct, frozen=True, kw_only=True):
    """What the fallback did with one ``CpusetUpdateFailed`` (``apply_fallback``'s result,
    also sent to the optional ``results`` channel of ``run_fallback``)."""

    container_id: str
    cpus: str
    ok: bool
    error: str = ""


class CgroupWriter(BlockingCgroupWriter):
    """Writes containers' cpusets straight into cgroupfs: the blocking core, plus its use
    from Trio (``write_async``) and the loop that applies what the runtime could not.

    It also knows when a pool change's pass is on its way: from the pool pusher's push
    (``begin_pass``) to the end of the verifier's pass over it (``end_pass``). Meanwhile the
    runtime applies the updates one container at a time and the verifier writes what it
    did not, so a cgroup read in between is not drift: the drift watcher waits
    (``wait_no_pass``) instead of writing it a second time. Trio thread only.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._passes = 0
        self._no_pass = trio.Event()
        self._no_pass.set()

    def begin_pass(self) -> None:
        if self._passes == 0:
            self._no_pass = trio.Event()
        self._passes += 1

    def end_pass(self) -> None:
        """A pass ended (or was never handed over); extra calls are harmless."""
        if self._passes == 0:
            return
        self._passes -= 1
        if self._passes == 0:
            self._no_pass.set()

    @property
    def pass_in_flight(self) -> bool:
        return self._passes > 0

    async def wait_no_pass(self) -> None:
        await self._no_pass.wait()

    async def write_async(
        self, intent: ContainerIntent, *, only_if_differs: bool = False
    ) -> WriteOutcome:
        """:meth:`write` in a worker thread; the write and its read-back are not torn."""
        with trio.CancelScope(shield=True):
            outcome = await trio.to_thread.run_sync(
                partial(self.write, intent, only_if_differs=only_if_differs)
            )
        return outcome

    async def run_fallback(
        self,
        failed: trio.MemoryReceiveChannel[CpusetUpdateFailed],
        results: trio.MemorySendChannel[FallbackResult] | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Apply every update the runtime could not, until ``failed`` is closed."""
        task_status.started()
        async for message in failed:
            result = await self.apply_fallback(message)
            if results is not None:
                await results.send(result)

    async def apply_fallback(self, message: CpusetUpdateFailed) -> FallbackResult:
        intent = message.intent
        try:
            # The pool change's verifier pass may have written it already: once is enough.
            outcome = await self.write_async(intent, only_if_differs=True)
        except (CgroupPathError, CgroupWriteError, CgroupIntentError) as exc:
            error = str(exc)
        else:
            error = "" if outcome.ok else outcome.describe_mismatch()
            if not error and not outcome.writes:
                log.debug(
                    "fallback cpuset write not needed container_id=%s cpus=%s: the cgroup "
                    "holds it already",
                    intent.container_id,
                    intent.cpus,
                )
                return FallbackResult(container_id=intent.container_id, cpus=intent.cpus, ok=True)
        ok = not error
        if self.metrics is not None:
            self.metrics.count_fallback_write("success" if ok else "error", "runtime-reported")
        if ok:
            log.info(
                "fallback cpuset write container_id=%s cpus=%s reason=%s",
                intent.container_id,
                intent.cpus,
                message.reason,
            )
        else:
            log.warning(
                "fallback cpuset write failed container_id=%s cpus=%s reason=%s: %s",
                intent.container_id,
                intent.cpus,
                message.reason,
                error,
            )
        return FallbackResult(
            container_id=intent.container_id, cpus=intent.cpus, ok=ok, error=error
        )
