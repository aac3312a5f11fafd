"""The pool pusher: shared containers follow the shared pool after it changes.

It reads ``SharedPoolChanged`` from the state owner. Changes that queued up while it was
busy are one push: only the newest pool matters. It sends the updates with
``NRISession.update_containers`` from this task of its own (never from inside a runtime
request, protocols.md 6.6), hands the updates the runtime called a success to the
verifier (``VerifyCpusets``), then wakes the drift watcher.
"""

from __future__ import annotations

import trio

from dracpu.cgroupfs.watcher import DriftWatcher
from dracpu.logs import get_logger
from dracpu.messages import SharedPoolChanged, VerifyCpusets
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
        watcher: DriftWatcher | None = None,
        verify: trio.MemorySendChannel[VerifyCpusets] | None = None,
    ) -> None:
        self._changes = changes
        self._verify = verify
        self._plugin = plugin
        self._session = session
        self._watcher = watcher
        self.pushes = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            change = await self._changes.receive()
            while True:
                try:
                    change = self._changes.receive_nowait()
                except trio.WouldBlock:
                    break
            await self._push(change)

    async def _push(self, change: SharedPoolChanged) -> None:
        # The updates carry the pool as it is now: a change that arrives while this push
        # is on its way is the next push.
        updates = self._plugin.shared_pool_updates()
        if updates:
            failed = await self._session.update_containers(updates)
            # Updates the runtime called a success are read back (a runtime may not report
            # a failed best-effort update); the failed ones went to the fallback writer.
            failed_ids = set(failed)
            applied = tuple(u for u in updates if u.container_id not in failed_ids)
            if applied and self._verify is not None:
                await self._verify.send(
                    VerifyCpusets(intents=applied, cause="pool", since=change.at)
                )
            log.info(
                "shared pool pushed to containers",
                pool=change.cpus,
                containers=len(updates),
                failed=len(failed),
                v=2,
            )
        self.pushes += 1
        if self._watcher is not None:
            self._watcher.poke()
