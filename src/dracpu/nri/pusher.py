"""The pool pusher: shared containers and pod sandboxes follow the shared pool after it changes.

It reads ``SharedPoolChanged`` from the state owner. Changes that queued up while it was
busy are one push: only the newest pool matters (the convergence is timed from the
oldest). It sends the containers' updates with ``NRISession.update_containers`` from this
task of its own (never from inside a runtime request, protocols.md 6.6), then hands the
cgroupfs writer task (``VerifyCpusets``) one pass over every update, whatever the runtime
answered (a runtime may call a dropped update a success), with the ones it reported as
failed marked in ``failed``, and over every pod sandbox, which NRI cannot update at all.
That pass is the change's only pass over the cgroups, and the runtime's failures get no
other: from the push to its end the writer knows one is on its way (``begin_pass``, ended
by the writer), and the drift watcher, woken after the push to confine strangers to the
new pool, waits for it rather than ask for the same cgroups a second time.
"""

from __future__ import annotations

import trio

from dracpu.cgroupfs.watcher import DriftWatcher
from dracpu.cgroupfs.writer import CgroupWriter
from dracpu.logs import get_logger
from dracpu.messages import CpusetUpdateFailed, SharedPoolChanged, VerifyCpusets
from dracpu.nri.plugin import NRIPlugin
from dracpu.nri.session import NRISession

__all__ = ["PoolPusher"]

log = get_logger("dracpu.daemon")


class PoolPusher:
    """Push the shared pool to every shared container after each change."""

    def __init__(
        self,
        changes: trio.MemoryReceiveChannel[SharedPoolChanged],
        plugin: NRIPlugin,
        session: NRISession,
        verify: trio.MemorySendChannel[VerifyCpusets] | None = None,
        *,
        writer: CgroupWriter | None = None,
        watcher: DriftWatcher | None = None,
    ) -> None:
        self._changes = changes
        self._verify = verify
        self._plugin = plugin
        self._session = session
        self._writer = writer
        self._watcher = watcher
        self.pushes = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            change = await self._changes.receive()
            since = change.at
            while True:
                try:
                    change = self._changes.receive_nowait()
                except trio.WouldBlock:
                    break
            await self._push(change, since)

    async def _push(self, change: SharedPoolChanged, since: float) -> None:
        # The updates carry the pool as it is now: a change that arrives while this push
        # is on its way is the next push.
        if self._writer is not None:
            self._writer.begin_pass()
        handed = False
        try:
            updates = self._plugin.shared_pool_updates()
            failed: tuple[CpusetUpdateFailed, ...] = ()
            if updates:
                failed = tuple(await self._session.update_containers(updates))
                log.info(
                    "shared pool pushed to containers",
                    pool=change.cpus,
                    containers=len(updates),
                    failed=len(failed),
                    v=2,
                )
            check = (*updates, *self._plugin.sandbox_intents())
            if check and self._verify is not None:
                await self._verify.send(
                    VerifyCpusets(intents=check, cause="pool", since=since, failed=failed)
                )
                handed = True
        finally:
            if not handed and self._writer is not None:
                self._writer.end_pass()
        self.pushes += 1
        if self._watcher is not None:
            self._watcher.poke()
