"""The cgroupfs writer: the one task that writes containers' cpusets into cgroupfs.

The NRI runtime normally applies dracpu's cpusets; dracpu writes them itself when the
runtime did not. Everything it writes goes through one task, :meth:`CgroupWriter.run`,
reading one inbox of requests from three senders:

- ``VerifyCpusets`` from the pool pusher (every update of a pool change, the ones the
  runtime reported as failed marked in ``failed``, and every pod sandbox) and from the NRI
  session (a CreateContainer reply's adjustments, new and synchronized sandboxes): one
  verification pass each (``verify.py``);
- ``DriftRepair`` from the drift watcher (``watcher.py``): drifted containers, sandboxes
  off the pool and unknown containers to confine, answered on the request's own channel.

One rule for every write, asked of the state owner (an ``IntentView``, ``intent_view.py``)
on the Trio thread right before the write: is this set still wanted? Then only what still
differs is written. The task runs the blocking core (``blocking_writer.py``) in worker
threads one step at a time (a limiter of one thread); as nothing else writes, no lock is
needed and a cgroup is written once per change, whoever asked. A step is abandoned when
the task is cancelled (at shutdown: a hung cgroupfs write must not hold up the daemon's
stop): the thread still writes and reads back as one step, what it writes is a set the
owner wanted and writing it again changes nothing, and the limiter keeps the next step
from starting before it ends. The names callers use from the layers below are re-exported here.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import trio

from dracpu.cgroupfs.blocking_writer import BlockingCgroupWriter, Results
from dracpu.cgroupfs.files import CPUS_FILE as CPUS_FILE
from dracpu.cgroupfs.files import MEMS_FILE as MEMS_FILE
from dracpu.cgroupfs.files import read_cgroup_file, write_cgroup_file
from dracpu.cgroupfs.intent_view import IntentView, still_wanted, strangers_still_unknown
from dracpu.cgroupfs.paths import CgroupLayout, CgroupPathError, resolve
from dracpu.cgroupfs.plan import (
    CgroupIntentError,
    CgroupWriteError,
    CpusetWrite,
    WriteOutcome,
    plan_cpuset_writes,
)
from dracpu.cgroupfs.verify import PassTally, account_pass
from dracpu.messages import ContainerIntent, VerifyCpusets
from dracpu.metrics import DriverMetrics
from dracpu.nursery.pulse import Pulse

__all__ = [
    "CgroupIntentError",
    "CgroupWriteError",
    "CgroupWriter",
    "CpusetWrite",
    "DriftRepair",
    "RepairResults",
    "WriteOutcome",
    "WriteRequest",
    "plan_cpuset_writes",
    "read_cgroup_file",
    "write_cgroup_file",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(slots=True)
class RepairResults:
    """What the writer did with a ``DriftRepair``, group by group (only the writes still
    wanted were attempted; an outcome with no writes: the cgroup held the set already)."""

    drifted: Results = field(default_factory=list)
    sandboxes: Results = field(default_factory=list)
    strangers: Results = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DriftRepair:
    """The drift watcher's findings, to be written if still wanted: ``drifted`` containers
    and ``sandboxes`` back onto their intent, ``strangers`` (cgroups no intent knows) onto
    the shared pool they were found off. The writer answers on ``reply`` (a channel of
    size 1 made for this request) and closes it; closed without an answer, the request
    was dropped (the writer stopped)."""

    drifted: Sequence[ContainerIntent]
    sandboxes: Sequence[ContainerIntent]
    strangers: Sequence[ContainerIntent]
    reply: trio.MemorySendChannel[RepairResults]


WriteRequest = VerifyCpusets | DriftRepair


class CgroupWriter(BlockingCgroupWriter):
    """The one cgroupfs writer: the blocking core, plus the task that serializes every
    write (see the module docstring).

    It also knows when a pool change's pass is on its way: from the pool pusher's push
    (``begin_pass``) to the end of this task's pass over it (``end_pass``). Meanwhile the
    runtime applies the updates one container at a time and this task writes what it did
    not, so a cgroup read in between is not drift: the drift watcher waits
    (``wait_no_pass``) instead of asking for the same write. Trio thread only.
    """

    def __init__(
        self,
        cgroup_root: str,
        *,
        metrics: DriverMetrics | None = None,
        layout: CgroupLayout | None = None,
        create_wait: float = 2.0,
        create_poll: float = 0.05,
        chunk: int = 128,
        offload: bool = True,
    ) -> None:
        if create_wait < 0 or create_poll <= 0:
            raise ValueError(
                f"invalid wait for new cgroups: wait {create_wait!r}, poll {create_poll!r}"
            )
        if chunk < 1:
            raise ValueError(f"verification chunk must be at least 1, got {chunk!r}")
        super().__init__(cgroup_root, metrics=metrics, layout=layout)
        self.create_wait = create_wait
        self.create_poll = create_poll
        self.chunk = chunk
        # False: the blocking steps run on the Trio thread (tests on a mock clock, where
        # waiting for a worker thread lets the clock jump).
        self.offload = offload
        # Unbounded: the NRI session sends from its request handlers and the pusher right
        # after its push, and neither may wait for cgroupfs (the runtime drops a plugin
        # that misses its 2 s deadline). What queues is bounded by the node's containers
        # and pool changes, and the watcher waits for each reply before it sends again.
        self._inbox_send, self._inbox = trio.open_memory_channel[WriteRequest](math.inf)
        self.tally = PassTally()
        self._passes = 0
        self._pass_ended = Pulse()
        # One blocking step at a time: an abandoned step holds it until its thread ends.
        self._one_thread = trio.CapacityLimiter(1)
        # New containers' cgroup checks take their thread from here, not Trio's default
        # pool: a check cut short at its deadline leaves its thread (a hung isdir), and it
        # keeps its token. With one token, a hung cgroupfs strands one thread in all; later
        # checks wait for the token until their own deadline, holding no thread.
        self._create_checks = trio.CapacityLimiter(1)

    def inbox(self) -> trio.MemorySendChannel[WriteRequest]:
        """A send end of the writer's inbox (one per sender)."""
        return self._inbox_send.clone()

    # -- a pool change's pass on its way ------------------------------------------------
    def begin_pass(self) -> None:
        self._passes += 1

    def end_pass(self) -> None:
        """A pass ended (or was never handed over); extra calls are harmless."""
        if self._passes == 0:
            return
        self._passes -= 1
        if self._passes == 0:
            self._pass_ended.fire()

    @property
    def pass_in_flight(self) -> bool:
        return self._passes > 0

    async def wait_no_pass(self) -> None:
        await self._pass_ended.wait_until(lambda: self._passes == 0)

    # -- the task -------------------------------------------------------------------------
    async def run(
        self, view: IntentView, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Carry out every request of the inbox, one at a time, asking ``view`` before
        each write. A new container's check first waits (bounded, in a task of its own)
        for the runtime to create its cgroup, which happens after dracpu's reply."""
        ready_send, ready = trio.open_memory_channel[WriteRequest](0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sort, nursery, ready_send)
            task_status.started()
            async for request in ready:
                await self._carry_out(request, view)

    async def _sort(
        self, nursery: trio.Nursery, ready: trio.MemorySendChannel[WriteRequest]
    ) -> None:
        async with ready:
            async for request in self._inbox:
                if isinstance(request, VerifyCpusets) and request.cause == "create":
                    nursery.start_soon(self._when_created, request, ready.clone())
                    continue
                try:
                    await ready.send(request)
                except BaseException:
                    _dropped(self, request)
                    raise

    async def _when_created(
        self, message: VerifyCpusets, ready: trio.MemorySendChannel[WriteRequest]
    ) -> None:
        async with ready:
            with trio.move_on_after(self.create_wait):
                # Reads only: cut short by the wait's deadline or a stop, the thread is left.
                while not await trio.to_thread.run_sync(
                    self._all_exist,
                    message.intents,
                    abandon_on_cancel=True,
                    limiter=self._create_checks,
                ):
                    await trio.sleep(self.create_poll)
            await ready.send(message)

    def _all_exist(self, intents: Sequence[ContainerIntent]) -> bool:
        # Resolved without the writer's path cache: this runs beside the writer's own
        # worker thread, and the cache belongs to that one.
        try:
            layout = self.layout
            return all(
                os.path.isdir(resolve(layout, i.cgroups_path)) for i in intents if i.cgroups_path
            )
        except CgroupPathError:
            return True  # nothing to wait for: the path cannot be resolved at all

    async def _carry_out(self, request: WriteRequest, view: IntentView) -> None:
        if isinstance(request, DriftRepair):
            await self._repair(request, view)
            return
        try:
            await self.verify(request, view)
        finally:
            if request.cause == "pool":
                self.end_pass()  # the pool pusher began it

    async def _blocking(self, step: partial[T]) -> T:
        """One step of the blocking core in the writer's one worker thread, abandoned if
        the task is cancelled (module docstring: why that is safe)."""
        if not self.offload:
            return step()
        return await trio.to_thread.run_sync(step, abandon_on_cancel=True, limiter=self._one_thread)

    # -- verification ---------------------------------------------------------------------
    async def verify(self, message: VerifyCpusets, view: IntentView) -> list[str]:
        """One pass now; returns the ids of the containers written because they differed.

        Worker threads read the cgroups back; for each chunk that differs, ``view`` is
        asked (on the Trio thread, at that moment) which sets are still wanted, and only
        those are written, in the same trip to the thread that reads the next chunk.
        """
        wanted = [i for i in message.intents if i.cgroups_path]
        failed = {f.intent.container_id: f.why for f in message.failed}
        pending = iter(wanted)
        results: Results = []
        step = await self._blocking(
            partial(self.read_differing, pending, chunk=self.chunk, strict=failed)
        )
        results += step.errors
        while step.differing:
            confirmed = still_wanted(view, step.differing)
            _log_unwanted(step.differing, confirmed, failed)
            step = await self._blocking(
                partial(self.write_then_read, confirmed, pending, chunk=self.chunk, strict=failed)
            )
            results += step.written
            results += step.errors
        written = account_pass(results, failed, self.tally, self.metrics)
        self.tally.verified += len(wanted)
        if message.since and self.metrics is not None:
            self.metrics.pool_convergence.observe(max(0.0, trio.current_time() - message.since))
        return written

    # -- drift repairs ----------------------------------------------------------------------
    async def _repair(self, request: DriftRepair, view: IntentView) -> None:
        async with request.reply:
            drifted = still_wanted(view, request.drifted)
            sandboxes = still_wanted(view, request.sandboxes)
            strangers = strangers_still_unknown(view, request.strangers)
            results = RepairResults()
            if drifted or sandboxes or strangers:
                results = await self._blocking(
                    partial(self._write_repairs, drifted, sandboxes, strangers)
                )
            # A watcher that stopped waiting (cancelled) closed its end: the writes stand.
            with contextlib.suppress(trio.BrokenResourceError):
                request.reply.send_nowait(results)

    def _write_repairs(
        self,
        drifted: list[ContainerIntent],
        sandboxes: list[ContainerIntent],
        strangers: list[ContainerIntent],
    ) -> RepairResults:
        # Only what still differs: a pass before this request may have written it.
        return RepairResults(
            drifted=self.write_many(drifted, only_if_differs=True),
            sandboxes=self.write_many(sandboxes, only_if_differs=True),
            strangers=self.write_many(strangers, only_if_differs=True),
        )


def _dropped(writer: CgroupWriter, request: WriteRequest) -> None:
    """A request the writer stopped before taking: its pass is over, its asker is told."""
    if isinstance(request, DriftRepair):
        request.reply.close()
    elif request.cause == "pool":
        writer.end_pass()


def _log_unwanted(
    differing: list[ContainerIntent], confirmed: list[ContainerIntent], failed: dict[str, str]
) -> None:
    if len(confirmed) == len(differing):
        return
    kept = {i.container_id for i in confirmed}
    for intent in differing:
        if intent.container_id not in kept and intent.container_id in failed:
            log.debug(
                "fallback cpuset write not needed container_id=%s cpus=%s: the state owner "
                "no longer wants that set",
                intent.container_id,
                intent.cpus,
            )
