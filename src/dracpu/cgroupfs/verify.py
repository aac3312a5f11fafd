"""The verifier: after the runtime says it applied a cpuset, read the cgroup back.

A runtime can call an update a success that it never applied: containerd leaves updates
marked ``ignore_failure`` out of the failed list it returns (docs/how-it-works.md, "Verify,
don't trust"), and a runtime can apply an update while the cgroup ends up elsewhere. The
verifier reads ``VerifyCpusets`` messages and, in one pass in a worker thread, reads each
container's effective cpuset from cgroupfs and writes as it goes: every 128 containers
that differ, it asks the state owner which are still intended (after the read-back, so a
newer set the runtime applied meanwhile is never overwritten with an older one) and writes
those through the cgroupfs writer
(``dracpu_cgroup_fallback_writes_total{cause="verify-mismatch"}``). A runtime that dropped
the whole update has its first cgroups written after 128 reads, not after all of them.
For a pool change it observes ``dracpu_pool_convergence_seconds`` once every
container is verified, whatever the runtime answered.

Pod sandboxes go through the same pass: NRI cannot update a sandbox, so the pool pusher
hands every sandbox to the verifier with each pool change, and the NRI session hands it
each sandbox that starts; they are counted under ``cause="sandbox"`` and logged at debug
level, never as drift.

A claim holder's adjustment is verified too, once its container exists: the runtime
creates the cgroup after dracpu answered CreateContainer, so such checks wait (bounded)
for the directory in a task of their own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence

import trio

from dracpu.cgroupfs.paths import CgroupPathError
from dracpu.cgroupfs.writer import CgroupWriter, WriteOutcome
from dracpu.messages import ContainerIntent, VerifyCpusets
from dracpu.metrics import DriverMetrics

__all__ = ["Verifier"]

log = logging.getLogger(__name__)

CAUSE = "verify-mismatch"
SANDBOX_CAUSE = "sandbox"


class Verifier:
    """Read back, compare, write what differs (see the module docstring)."""

    def __init__(
        self,
        writer: CgroupWriter,
        intents_of: Callable[[list[str]], Mapping[str, ContainerIntent]],
        *,
        metrics: DriverMetrics | None = None,
        create_wait: float = 2.0,
        create_poll: float = 0.05,
    ) -> None:
        self.writer = writer
        self._intents_of = intents_of
        self.metrics = metrics
        self.create_wait = create_wait
        self.create_poll = create_poll
        self.verified = 0
        self.rewritten = 0
        """Containers written because they differed (pod sandboxes are counted apart)."""
        self.sandboxes_written = 0

    async def run(
        self,
        inbox: trio.MemoryReceiveChannel[VerifyCpusets],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started()
            async for message in inbox:
                if message.cause == "create":
                    nursery.start_soon(self._verify_created, message)
                    continue
                try:
                    await self.verify(message)
                finally:
                    self.writer.end_pass()  # the pool pusher began it

    async def verify(self, message: VerifyCpusets) -> list[str]:
        """Verify now; returns the ids of the containers written because they differed.

        One pass in a worker thread reads each cgroup back; for those that differ it asks
        the state owner (on the Trio thread, at that moment) whether that set is still
        intended, and writes only those. A set the runtime applied for a newer intent is
        read back as "differs" too: asking after the read-back keeps it from being
        overwritten with the older one.
        """
        wanted = [i for i in message.intents if i.cgroups_path]
        with trio.CancelScope(shield=True):
            results = await trio.to_thread.run_sync(
                self.writer.write_differing, wanted, self._still_wanted_from_thread
            )
        written = self._account(results)
        self.verified += len(wanted)
        if message.since and self.metrics is not None:
            self.metrics.pool_convergence.observe(max(0.0, trio.current_time() - message.since))
        return written

    def _still_wanted_from_thread(self, differing: list[ContainerIntent]) -> list[ContainerIntent]:
        try:
            return trio.from_thread.run_sync(self._still_wanted, differing)
        except trio.RunFinishedError:
            return []  # the daemon is stopping: write nothing

    def _still_wanted(self, differing: list[ContainerIntent]) -> list[ContainerIntent]:
        # Only the ones asked about: building every container's intent for each chunk of
        # a pass cost more than the pass itself at 1,000 containers.
        current = self._intents_of([i.container_id for i in differing])
        return [i for i in differing if _same(current.get(i.container_id), i)]

    async def _verify_created(self, message: VerifyCpusets) -> None:
        # The container's cgroup appears once the runtime created it after our reply.
        with trio.move_on_after(self.create_wait):
            while not await trio.to_thread.run_sync(self._all_exist, message.intents):
                await trio.sleep(self.create_poll)
        await self.verify(message)

    def _all_exist(self, intents: Sequence[ContainerIntent]) -> bool:
        try:
            return all(
                os.path.isdir(self.writer.directory_of(i.cgroups_path))
                for i in intents
                if i.cgroups_path
            )
        except CgroupPathError:
            return True  # nothing to wait for: the path cannot be resolved at all

    def _account(
        self, results: list[tuple[ContainerIntent, WriteOutcome | Exception]]
    ) -> list[str]:
        written: list[str] = []
        for intent, outcome in results:
            if isinstance(outcome, Exception):
                error = str(outcome)
            else:
                error = "" if outcome.ok else outcome.describe_mismatch()
            if self.metrics is not None:
                self.metrics.count_fallback_write(
                    "error" if error else "success", SANDBOX_CAUSE if intent.sandbox else CAUSE
                )
            if error:
                log.warning(
                    "cpuset of %s %s is not what dracpu intends and cannot be written: %s",
                    "pod sandbox" if intent.sandbox else "container",
                    intent.container_id,
                    error,
                )
                continue
            if intent.sandbox:
                self.sandboxes_written += 1
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
        self.rewritten += len(written)
        return written


def _same(current: ContainerIntent | None, intent: ContainerIntent) -> bool:
    return (
        current is not None
        and current.cpus == intent.cpus
        and (not intent.mems or current.mems == intent.mems)
    )
