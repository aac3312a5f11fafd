"""``SimAPIServer``: the store, faults and counters of one simulated API server, its TCP
listener, in-process access for other simulators, and a kubeconfig pointing at it."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import trio
import yaml

from dracpu_sim.apiserver.faults import CallCounter, FaultInjector, RequestLog
from dracpu_sim.apiserver.handler import Handler
from dracpu_sim.apiserver.http import ConnectionServer
from dracpu_sim.apiserver.resources import ResourceType, resource_by_plural
from dracpu_sim.apiserver.selectors import parse_field_selector, parse_label_selector
from dracpu_sim.apiserver.store import MERGE_PATCH, ObjectStore, Watcher

__all__ = ["SimAPIServer", "main_apiserver", "serve", "write_kubeconfig"]

Obj = dict[str, Any]


class SimAPIServer:
    """A loopback Kubernetes API server. Constructing it does no I/O; ``serve`` listens.

    The in-process methods (``create``, ``get``, ``list``, ...) work on the same store
    without HTTP and are neither counted nor subject to injected faults.
    """

    def __init__(
        self,
        *,
        history_limit: int = 1000,
        bookmark_interval: float = 60.0,
        max_watch_seconds: float = 1800.0,
        graceful_pod_deletion: bool = False,
        clock: Callable[[], datetime] | None = None,
        seed: int | None = None,
        device_status: bool = True,
    ) -> None:
        self.store = ObjectStore(
            history_limit=history_limit,
            clock=clock or (lambda: datetime.now(UTC)),
            rng=random.Random(seed),
            graceful_pod_deletion=graceful_pod_deletion,
            device_status=device_status,
        )
        self.faults = FaultInjector()
        self.calls = CallCounter()
        self.handler = Handler(self.store, self.faults, self.calls)
        self.connections = ConnectionServer(
            self.handler, bookmark_interval=bookmark_interval, max_watch_seconds=max_watch_seconds
        )
        self.port: int | None = None
        self.restarts = 0
        self._serving: trio.CancelScope | None = None

    def log_requests(self) -> RequestLog:
        """Start logging every request (time, verb, resource, User-Agent, status)."""
        if self.handler.requests is None:
            self.handler.requests = RequestLog()
        return self.handler.requests

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the simulated API server is not listening yet")
        return f"http://127.0.0.1:{self.port}"

    async def serve(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen and serve until cancelled or ``stop()``; reports the bound port."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        self.port = int(listeners[0].socket.getsockname()[1])
        self.handler.server_address = f"{host}:{self.port}"
        with trio.CancelScope() as scope:
            self._serving = scope
            task_status.started(self.port)
            await trio.serve_listeners(self.connections.serve_connection, listeners)

    def stop(self, *, forget_watch_history: bool = True) -> None:
        """Go down as a restarting API server does: stop listening and close every
        connection, watches included, at once; ``serve`` returns. The objects are kept
        (they live in etcd); so is the version counter. ``forget_watch_history``: the
        restarted server's watch cache starts at the current version, so a client
        resuming an older one gets 410 Gone. ``serve(port=self.port)`` brings it back."""
        if self._serving is not None:
            self._serving.cancel()
            self._serving = None
            self.restarts += 1
        if forget_watch_history:
            self.store.compact()

    def write_kubeconfig(self, path: str | os.PathLike[str]) -> Path:
        return write_kubeconfig(path, self.url)

    # ---- in-process access (no HTTP) ----------------------------------------------------

    @staticmethod
    def _resource(plural: str) -> ResourceType:
        return resource_by_plural(plural)

    def create(self, plural: str, obj: Obj, namespace: str | None = None) -> Obj:
        ns = namespace or obj.get("metadata", {}).get("namespace")
        return self.store.create(self._resource(plural), ns, obj)

    def get(self, plural: str, name: str, namespace: str | None = None) -> Obj:
        return self.store.get(self._resource(plural), namespace, name)

    def list(
        self,
        plural: str,
        namespace: str | None = None,
        *,
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[Obj]:
        r = self._resource(plural)
        listed = self.store.list(
            r,
            namespace,
            parse_label_selector(label_selector),
            parse_field_selector(field_selector, r.field_labels),
        )
        items: list[Obj] = listed["items"]
        for item in items:
            item["kind"], item["apiVersion"] = r.kind, r.api_version
        return items

    def update(self, plural: str, obj: Obj, *, subresource: str | None = None) -> Obj:
        meta = obj.get("metadata", {})
        return self.store.update(
            self._resource(plural),
            meta.get("namespace"),
            meta["name"],
            obj,
            subresource=subresource,
        )

    def patch(
        self,
        plural: str,
        name: str,
        patch: Obj,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> Obj:
        return self.store.patch(
            self._resource(plural), namespace, name, MERGE_PATCH, patch, subresource=subresource
        )

    def delete(self, plural: str, name: str, namespace: str | None = None) -> Obj:
        body, _ = self.store.delete(self._resource(plural), namespace, name)
        return body

    def watch(
        self,
        plural: str,
        deliver: Callable[[str, Obj], None],
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
    ) -> Watcher:
        """Register ``deliver(type, obj)`` for events; undo with ``store.unwatch``."""
        r = self._resource(plural)
        return self.store.watch(
            r,
            namespace,
            parse_label_selector(""),
            parse_field_selector("", ()),
            resource_version,
            deliver,
        )

    def end_watches(self, *, drop: bool = False) -> int:
        """End every open watch stream, cleanly or (``drop``) by closing its connection
        without the final chunk; the number ended. Clients then watch again."""
        sessions = list(self.connections.watches)
        for session in sessions:
            session.request_end(drop=drop)
        return len(sessions)

    def request_bookmarks(self) -> None:
        """Make every open watch that allows bookmarks send one now."""
        for session in list(self.connections.watches):
            session.request_bookmark()


async def serve(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    server: SimAPIServer | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve a (new, unless given) ``SimAPIServer``; reports the bound port."""
    await (server or SimAPIServer()).serve(host=host, port=port, task_status=task_status)


def kubeconfig_document(url: str, *, namespace: str = "default") -> dict[str, Any]:
    name = "dracpu-sim"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": url}}],
        "users": [{"name": name, "user": {}}],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}
        ],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(path: str | os.PathLike[str], url: str) -> Path:
    """Write a kubeconfig for ``url`` atomically (temp file, rename), mode 0600."""
    target = Path(path)
    text = yaml.safe_dump(kubeconfig_document(url), sort_keys=False)
    fd, tmp = tempfile.mkstemp(prefix=".kubeconfig-", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


async def main_apiserver(port: int, kubeconfig_out: str) -> None:
    """``dracpu sim apiserver``: serve on 127.0.0.1, write the kubeconfig, print the URL."""
    server = SimAPIServer()
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(server.serve, port=port))
        write_kubeconfig(kubeconfig_out, server.url)
        print(server.url, flush=True)
