"""The Trio shell around ``ServerConnection``: listen, read with the §15 timeouts, write.

``serve_http`` is started with ``nursery.start`` (or the supervisor) and reports the bound
port, so ``--bind-address=127.0.0.1:0`` works. Cancelling it is the graceful shutdown:
it stops accepting, drops idle and half-read connections, and lets a response that is
being written finish (shielded) for at most ``grace_period`` seconds.

An address it cannot listen on (another process holds the port: with ``hostNetwork`` the
node's ``:8080`` is everyone's) is a ``ListenError``: one line naming the address, the flag
that moves it and what else to change; the supervisor retries it quietly with backoff.
"""

from __future__ import annotations

import errno
import math
from collections.abc import Sequence
from functools import partial

import trio

from dracpu.http.address import format_bind_address
from dracpu.http.app import HTTPApp
from dracpu.http.connection import HTTPLimits, ServerConnection, Step
from dracpu.logs import get_logger
from dracpu.nursery.service import ServiceBlocked

__all__ = ["DEFAULT_GRACE_PERIOD", "HTTPServer", "ListenError", "serve_http"]

log = get_logger(__name__)

DEFAULT_GRACE_PERIOD = 5.0
READ_SIZE = 65536
# Bind failures the node's operator fixes (the port is taken, the host address is not this
# node's, a low port without the privilege): not bugs, so no traceback.
_BLOCKED_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})


class ListenError(ServiceBlocked):
    """The server cannot listen on its address; the message is the one line to log."""

    def __init__(self, host: str, port: int, paths: Sequence[str], err: OSError) -> None:
        self.host, self.port, self.errno = host, port, err.errno
        super().__init__(listen_error_message(host, port, paths, err))


def listen_error_message(host: str, port: int, paths: Sequence[str], err: OSError) -> str:
    """What to tell the operator when ``host:port`` cannot be bound. The daemon serves
    /healthz, /readyz and /metrics on ``--bind-address`` and /debug/state alone on
    ``--debug-address``: ``paths`` (what this listener serves) tells which flag set it."""
    debug_only = "/debug/state" in paths and "/healthz" not in paths
    flag = "--debug-address" if debug_only else "--bind-address"
    where = host or "every interface"
    head = f"cannot listen on {format_bind_address(host, port)} (port {port} on {where})"
    if err.errno == errno.EADDRINUSE:
        what = (
            "another process on this node already listens there "
            f"(`ss -ltnp 'sport = :{port}'` on the node names it)"
        )
        host_prefix = format_bind_address(host, 0).removesuffix("0")  # ":" or "[::1]:"
        advice = f"choose a free port with {flag}={host_prefix}PORT"
    else:
        what = (err.strerror or str(err)).lower()
        advice = f"choose another address with {flag}"
    if not debug_only:
        advice += (
            " and give the DaemonSet's `healthz` containerPort the same port (the startup, "
            "liveness and readiness probes use that named port; deploy/base/daemonset.yaml)"
        )
    return f"{head} for {', '.join(paths)}: {what}; {advice}"


class _Connection:
    def __init__(self, core: ServerConnection) -> None:
        self.core = core
        self.write_scope: trio.CancelScope | None = None


class HTTPServer:
    """Serves one ``HTTPApp``; ``serve_connection`` works on any Trio stream (tests drive it
    over memory streams under ``MockClock``)."""

    def __init__(
        self,
        app: HTTPApp,
        *,
        limits: HTTPLimits | None = None,
        grace_period: float = DEFAULT_GRACE_PERIOD,
    ) -> None:
        self.app = app
        self.limits = limits or HTTPLimits()
        self.grace_period = grace_period
        self._connections: set[_Connection] = set()
        self.connections_served = 0

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def serve(
        self,
        host: str,
        port: int,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``host:port`` (host ``""``: every interface) until cancelled; an
        address it cannot bind is a ``ListenError``."""
        try:
            listeners = await _open_listeners(host, port)
        except OSError as err:
            if err.errno not in _BLOCKED_ERRNOS:
                raise
            raise ListenError(host, port, self.app.paths, err) from err
        bound: int = listeners[0].socket.getsockname()[1]
        log.info("HTTP server listening", v=2, host=host, port=bound)
        await self.serve_on(listeners, started_value=bound, task_status=task_status)

    async def serve_on(
        self,
        listeners: Sequence[trio.abc.Listener[trio.abc.Stream]],
        *,
        started_value: int = 0,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve connections from ``listeners`` until cancelled, then shut down gracefully;
        the listeners are closed on the way out."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    partial(trio.serve_listeners, self.serve_connection, list(listeners))
                )
                task_status.started(started_value)
                try:
                    await trio.sleep_forever()
                finally:
                    self._begin_shutdown()
        finally:
            for listener in listeners:
                await trio.aclose_forcefully(listener)

    def _begin_shutdown(self) -> None:
        # Synchronous on purpose: runs while the nursery is being cancelled.
        limit = trio.current_time() + self.grace_period
        for conn in self._connections:
            conn.core.start_closing()
            if conn.write_scope is not None:
                conn.write_scope.deadline = min(conn.write_scope.deadline, limit)

    async def serve_connection(self, stream: trio.abc.Stream) -> None:
        conn = _Connection(ServerConnection(self.app, self.limits))
        self._connections.add(conn)
        self.connections_served += 1
        try:
            await self._run(conn, stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        except Exception as exc:
            # The port is reachable from the network: a bug met on one connection closes
            # that connection, never the listener (and the probes with it).
            log.error("HTTP connection failed; closed it", err=exc, stack=True)
        finally:
            self._connections.discard(conn)
            await trio.aclose_forcefully(stream)

    async def _run(self, conn: _Connection, stream: trio.abc.Stream) -> None:
        core = conn.core
        limits = self.limits
        # Go starts the header deadline of the first request when the connection is
        # accepted, and of later ones when their first byte arrives after the idle wait.
        request_start: float | None = trio.current_time()
        while True:
            step = core.step()
            if step.data and not await self._write(conn, stream, step):
                return
            if step.close:
                return
            if step.more:
                await trio.lowlevel.checkpoint()  # a long body: others run between steps
                continue
            if not step.need_data:
                request_start = None  # a response went out; the next request has not begun
                continue
            phase = core.phase
            if phase == "idle" and request_start is None:
                deadline = trio.current_time() + limits.idle_timeout
            else:
                if request_start is None:
                    request_start = trio.current_time()
                timeout = limits.read_header_timeout if phase != "body" else limits.read_timeout
                deadline = request_start + timeout
            with trio.move_on_at(deadline) as waited:
                data = await stream.receive_some(READ_SIZE)
            if waited.cancelled_caught:
                if phase != "idle" or request_start is not None:
                    log.info("HTTP request timed out", v=2, phase=phase)
                timeout_step = core.timed_out()
                if timeout_step.data:
                    await self._write(conn, stream, timeout_step)
                return
            if request_start is None and data:
                request_start = trio.current_time()
            core.receive_data(bytes(data))

    async def _write(self, conn: _Connection, stream: trio.abc.Stream, step: Step) -> bool:
        """Send one response, shielded so shutdown does not tear it; False if it timed out."""
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + self.limits.write_timeout
            if conn.core.closing:
                scope.deadline = min(scope.deadline, trio.current_time() + self.grace_period)
            conn.write_scope = scope
            try:
                await stream.send_all(step.data)
            finally:
                conn.write_scope = None
        if scope.cancelled_caught:
            log.info("HTTP response write timed out", v=2)
            return False
        return True


async def _open_listeners(host: str, port: int) -> list[trio.SocketListener]:
    bind_host = host or None
    listeners = await trio.open_tcp_listeners(port, host=bind_host)
    if port != 0 or len(listeners) < 2:
        return listeners
    # Port 0 on every interface gives each address family its own random port; one port is
    # wanted, so re-bind all families on the one the first listener got.
    for _attempt in range(5):
        chosen: int = listeners[0].socket.getsockname()[1]
        for listener in listeners:
            await trio.aclose_forcefully(listener)
        try:
            return await trio.open_tcp_listeners(chosen, host=bind_host)
        except OSError:
            listeners = await trio.open_tcp_listeners(0, host=bind_host)
    return listeners


async def serve_http(
    host: str,
    port: int,
    app: HTTPApp,
    *,
    limits: HTTPLimits | None = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until cancelled; ``task_status.started(bound_port)``."""
    if not math.isfinite(grace_period) or grace_period < 0:
        raise ValueError(f"grace_period must be >= 0, got {grace_period}")
    server = HTTPServer(app, limits=limits, grace_period=grace_period)
    await server.serve(host, port, task_status=task_status)
