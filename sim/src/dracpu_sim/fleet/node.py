"""One simulated node of the fleet: the daemon's own slice publisher, nothing else.

A ``FleetNode`` is what a dracpu daemon does to the API server: a ``KubeClient`` loaded
from a kubeconfig as the daemon loads it (its own connection pool; the ``User-Agent``
names the node, so the server's request log tells nodes apart), and the daemon's
``SliceReconciler`` with the daemon's settings. ``restart()`` is a new daemon process: a
new client and a new reconciler that knows nothing of the last one.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from dracpu.k8s.client import KubeClient
from dracpu.k8s.slices import SliceReconciler

__all__ = ["FleetNode"]


class FleetNode:
    """``reconciler_options`` are extra ``SliceReconciler`` keywords (the resync
    interval, the reconnect spread); its ``rand`` comes from ``rng``.
    ``request_timeout`` is the client's (the daemon's is 30 s)."""

    def __init__(
        self,
        name: str,
        desired: Sequence[Mapping[str, Any]],
        *,
        kubeconfig: str,
        rng: random.Random,
        reconciler_options: Mapping[str, Any] | None = None,
        request_timeout: float = 30.0,
    ) -> None:
        self.name = name
        self.user_agent = f"dracpu/fleet ({name})"
        self.desired = [dict(d) for d in desired]
        self.kubeconfig = kubeconfig
        self.rng = rng
        self.options = dict(reconciler_options or {})
        self.request_timeout = request_timeout
        self.reconciler: SliceReconciler | None = None
        self.incarnation = 0  # restarts so far
        self.published = trio.Event()  # the current incarnation published its pool
        self._retired_attempts = 0
        self._scope: trio.CancelScope | None = None

    @property
    def attempts(self) -> int:
        """Requests this node tried, over all its incarnations, refused ones included."""
        r = self.reconciler
        current = r.api_calls + r.watch_requests if r is not None else 0
        return self._retired_attempts + current

    @property
    def watching(self) -> bool:
        return self.reconciler is not None and self.reconciler.watch_streaming

    def set_desired(self, desired: Sequence[Mapping[str, Any]]) -> SliceReconciler:
        """New desired slices (a topology change); the reconciler that will apply them."""
        self.desired = [dict(d) for d in desired]
        assert self.reconciler is not None
        self.reconciler.set_desired(self.desired)
        return self.reconciler

    def restart(self) -> None:
        """Stop this daemon now; ``run`` starts a new one at once."""
        if self._scope is not None:
            self._scope.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run incarnation after incarnation until cancelled; ``started`` once the first
        one has published its pool."""
        started = False
        while True:
            kube = KubeClient.from_kubeconfig(self.kubeconfig, request_timeout=self.request_timeout)
            kube.api_client.user_agent = self.user_agent
            reconciler = SliceReconciler(
                kube,
                node_name=self.name,
                desired=self.desired,
                rand=self.rng.random,
                **self.options,
            )
            self.reconciler = reconciler
            self.published = trio.Event()
            try:
                with trio.CancelScope() as scope:
                    self._scope = scope
                    async with trio.open_nursery() as nursery:
                        await nursery.start(reconciler.run)
                        self.published.set()
                        if not started:
                            started = True
                            task_status.started()
                        await trio.sleep_forever()
            finally:
                self._scope = None
                self._retired_attempts += reconciler.api_calls + reconciler.watch_requests
                self.reconciler = None
                kube.close()
            self.incarnation += 1
