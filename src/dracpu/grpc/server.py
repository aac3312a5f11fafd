"""The Trio shell: a unix socket listener, one task per connection, one per RPC.

The protocol work happens in ``connection.GRPCServerConnection``; this module reads the
socket, feeds it, starts handlers from a grpclib ``__mapping__()`` table, and writes out
whatever it queued. A unary reply (headers, message, trailers) leaves in one socket write.

Shutdown is structured: cancelling ``serve_unix`` closes the listener, sends GOAWAY on
every connection, gives in-flight RPCs ``grace_period`` seconds, then cancels what is
left and removes the socket file.

Large requests leave memory behind (``dracpu.heap``): a connection holds no request once
its handler has it, and tells the process's ``Reclaimer`` about every large request that
ended or was discarded, which hands the memory back after the burst.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
from collections.abc import Callable, Mapping
from typing import Any

import trio
from google.protobuf.message import DecodeError, Message
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from h2.errors import ErrorCodes

from dracpu.grpc.connection import GRPCServerConnection
from dracpu.grpc.errors import RPCError, ServerError
from dracpu.grpc.events import ConnectionClosed, Metadata, RequestReceived, StreamAborted
from dracpu.grpc.limits import STEP_BUDGET
from dracpu.heap import RECLAIMER, Reclaimer
from dracpu.nursery.pulse import Pulse

log = logging.getLogger(__name__)

READ_SIZE = 65536
DEFAULT_GRACE_PERIOD = 5.0
# After the protocol core ends a connection (a refused header block, a protocol error),
# what the client still sends is read and dropped for this long, or this much, before the
# socket closes: see _Connection._linger.
LINGER_SECONDS = 1.0
LINGER_BYTES = 8 * 1024 * 1024
_ACCEPT_RETRY_ERRNOS = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS))


class Deadline:
    """The call's deadline on the Trio clock (grpclib's ``Deadline`` shape)."""

    __slots__ = ("when",)

    def __init__(self, when: float) -> None:
        self.when = when

    def time_remaining(self) -> float:
        return max(0.0, self.when - trio.current_time())


class ServerStream:
    """What a handler gets: grpclib's server ``Stream`` shape for unary-request calls."""

    def __init__(
        self,
        conn: _Connection,
        stream_id: int,
        request: Message,
        *,
        metadata: Metadata,
        deadline: Deadline | None,
        server_streaming: bool,
    ) -> None:
        self._conn = conn
        self._stream_id = stream_id
        self._request: Message | None = request
        self.server_streaming = server_streaming
        self.metadata = metadata
        self.deadline = deadline
        self.sent_messages = 0

    async def recv_message(self) -> Any:
        """The request on the first call, then None (the request side has ended)."""
        request, self._request = self._request, None
        return request

    async def send_initial_metadata(self) -> None:
        self._conn.core.send_initial_metadata(self._stream_id)
        if self.server_streaming:
            await self._conn.flush()

    async def send_message(self, message: Message) -> None:
        if not self.server_streaming and self.sent_messages:
            raise RPCError(Status.INTERNAL, "unary method sent more than one reply")
        self.sent_messages += 1
        self._conn.core.send_message(self._stream_id, message.SerializeToString())
        # A unary reply waits for the trailers so all three leave in one write; a
        # streamed one goes out now. Either way, wait while the window is closed.
        if self.server_streaming:
            await self._conn.flush()
        await self._conn.drain(self._stream_id)


def _known_services(handlers: Mapping[str, Handler]) -> frozenset[str]:
    return frozenset(path.split("/")[1] for path in handlers if path.count("/") == 2)


def unknown_method_message(path: str, services: frozenset[str]) -> str:
    """grpc-go's wording for an unroutable ``:path``."""
    parts = path.split("/")
    if len(parts) != 3 or parts[0] or not parts[1] or not parts[2]:
        return f"malformed method name: {path!r}"
    service, method = parts[1], parts[2]
    if service in services:
        return f"unknown method {method} for service {service}"
    return f"unknown service {service}"


class _Connection:
    """One client connection: a read loop plus a task per RPC in its own nursery."""

    def __init__(
        self,
        sock: trio.abc.Stream,
        handlers: Mapping[str, Handler],
        services: frozenset[str],
        grace_period: float,
        reclaim: Callable[[int], None] = lambda size: None,
    ) -> None:
        self.core = GRPCServerConnection()
        self._reclaim = reclaim
        self._dropped_seen = 0
        self._sock = sock
        self._handlers = handlers
        self._services = services
        self._grace_period = grace_period
        self._send_lock = trio.Lock()
        self._window_changed = Pulse()
        self._idle = trio.Event()
        self._handler_scopes: dict[int, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        self.shutdown_requested = trio.Event()
        # Shielded so that cancelling the server becomes a graceful drain, not an abort;
        # the drain task cancels this scope when the grace period is over.
        self.scope = trio.CancelScope(shield=True)

    async def run(self) -> None:
        with self.scope:
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    self.core.initiate()
                    await self.flush()
                    nursery.start_soon(self._drain_on_shutdown)
                    await self._read_loop()
                    nursery.cancel_scope.cancel()
            finally:
                await trio.aclose_forcefully(self._sock)

    async def flush(self) -> None:
        """Write out everything the protocol core queued, under the send lock."""
        async with self._send_lock:
            data = self.core.data_to_send()
            if not data:
                return
            try:
                await self._sock.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._abort()

    async def drain(self, stream_id: int) -> None:
        """Wait until the stream's queued reply bytes are inside the flow-control window."""
        while self.core.outbound_pending(stream_id):
            noted = self._window_changed.fired  # a window update during the flush counts
            await self.flush()
            if self.core.outbound_pending(stream_id):
                await self._window_changed.wait_past(noted)

    def _abort(self) -> None:
        self.core.closed = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _linger(self) -> None:
        """Let the client read the last frames of a connection the core ended.

        Closing a unix socket with unread bytes in it resets the connection, and a client
        still sending (the rest of a refused header block) may then fail with EPIPE before
        it reads the status and GOAWAY we sent. So whatever the client still sends is read
        (the core only looks for the end of a refused header block, which releases the
        GOAWAY) and dropped, for a short while; EOF follows our last frame.
        """
        eof_sent = False
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            with trio.move_on_after(LINGER_SECONDS):
                dropped = 0
                while dropped < LINGER_BYTES:
                    await self.flush()
                    if not eof_sent and not self.core.holding_goaway:
                        if isinstance(self._sock, trio.abc.HalfCloseableStream):
                            await self._sock.send_eof()
                        eof_sent = True
                    data = await self._sock.receive_some(READ_SIZE)
                    if not data:
                        break
                    dropped += len(data)
                    self.core.receive_data(bytes(data))
            self.core.release_goaway()
            await self.flush()

    async def _read_loop(self) -> None:
        while True:
            if self.core.closed:
                await self._linger()
                return
            try:
                data = await self._sock.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            # A step at a time: between steps other connections run, so however much work
            # one read holds (thousands of tiny frames, a maximal header block) it delays
            # them by one step (STEP_BUDGET), not by the whole read. The events (a request
            # of up to 4 MiB) and the read are not kept across the waits: a connection may
            # then stay idle for hours.
            self._step(bytes(data))
            del data
            while self.core.input_pending:
                await trio.lowlevel.checkpoint()
                self._step(b"")
            # Window updates may unblock senders; SETTINGS/PING acks must leave (1.1).
            self._window_changed.fire()
            await self.flush()
            self._check_idle()

    def _step(self, data: bytes) -> None:
        for event in self.core.receive_data(data, budget=STEP_BUDGET):
            self._dispatch(event)
        dropped = self.core.dropped_request_bytes - self._dropped_seen
        if dropped:
            self._dropped_seen += dropped
            self._reclaim(dropped)

    def _dispatch(self, event: RequestReceived | StreamAborted | ConnectionClosed) -> None:
        if isinstance(event, RequestReceived):
            self._start_rpc(event)
        elif isinstance(event, StreamAborted):
            scope = self._handler_scopes.pop(event.stream_id, None)
            if scope is not None:
                scope.cancel()
        else:
            for scope in self._handler_scopes.values():
                scope.cancel()
            self._handler_scopes.clear()

    def _start_rpc(self, req: RequestReceived) -> None:
        handler = self._handlers.get(req.path)
        if handler is None:
            message = unknown_method_message(req.path, self._services)
            self.core.send_status(req.stream_id, Status.UNIMPLEMENTED, message)
            return
        cardinality: Cardinality = handler.cardinality
        if cardinality.client_streaming:
            self.core.send_status(
                req.stream_id, Status.UNIMPLEMENTED, "client-streaming methods are not supported"
            )
            return
        try:
            request = handler.request_type.FromString(req.message)
        except DecodeError as exc:
            self.core.send_status(
                req.stream_id, Status.INTERNAL, f"failed to decode request message: {exc}"
            )
            return
        assert self._nursery is not None
        deadline = None if req.timeout is None else Deadline(trio.current_time() + req.timeout)
        stream = ServerStream(
            self,
            req.stream_id,
            request,
            metadata=req.metadata,
            deadline=deadline,
            server_streaming=cardinality.server_streaming,
        )
        scope = trio.CancelScope()
        self._handler_scopes[req.stream_id] = scope
        self._nursery.start_soon(
            self._run_rpc, handler, stream, req.stream_id, scope, len(req.message)
        )

    async def _run_rpc(
        self,
        handler: Handler,
        stream: ServerStream,
        stream_id: int,
        scope: trio.CancelScope,
        request_size: int,
    ) -> None:
        try:
            await self._serve_rpc(handler, stream, stream_id, scope)
        finally:
            # Counted once the call is over, whichever way: its request is garbage now.
            self._reclaim(request_size)

    async def _serve_rpc(
        self, handler: Handler, stream: ServerStream, stream_id: int, scope: trio.CancelScope
    ) -> None:
        with scope:
            status, message = await self._call_handler(handler, stream)
            if status is Status.DEADLINE_EXCEEDED and self.core.outbound_pending(stream_id):
                # Replies still stuck behind the window: trailers cannot follow them.
                self.core.reset_stream(stream_id, ErrorCodes.CANCEL)
            else:
                self.core.send_status(stream_id, status, message)
            await self.drain(stream_id)
            await self.flush()
        self._handler_scopes.pop(stream_id, None)
        self._check_idle()

    async def _call_handler(self, handler: Handler, stream: ServerStream) -> tuple[Status, str]:
        """Run the handler; map its outcome to the status that ends the call."""
        try:
            if stream.deadline is None:
                await handler.func(stream)
            else:
                with trio.move_on_at(stream.deadline.when) as deadline_scope:
                    await handler.func(stream)
                if deadline_scope.cancelled_caught:
                    return Status.DEADLINE_EXCEEDED, "deadline exceeded"
        except GRPCError as exc:
            return exc.status, exc.message or ""
        except RPCError as exc:
            return exc.status, exc.message
        except Exception as exc:
            log.exception("gRPC handler failed")
            return Status.UNKNOWN, f"{type(exc).__name__}: {exc}"
        if not stream.server_streaming and not stream.sent_messages:
            return Status.INTERNAL, "unary method sent no reply"
        return Status.OK, ""

    def _check_idle(self) -> None:
        if self.core.shutting_down and not self._handler_scopes and not self.core.active_streams:
            self._idle.set()

    async def _drain_on_shutdown(self) -> None:
        await self.shutdown_requested.wait()
        self.core.start_shutdown()
        await self.flush()
        self._check_idle()
        with trio.move_on_after(self._grace_period):
            await self._idle.wait()
        self.core.close()
        await self.flush()
        self._abort()


def _bind_unix(path: str) -> tuple[socket.socket, int]:
    """Bind and listen; socket file mode 0600, parent created 0750; returns (sock, inode)."""
    parent = os.path.dirname(path) or "."
    try:
        os.makedirs(parent, mode=0o750, exist_ok=True)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(st.st_mode):
                raise ServerError(f"{path} exists and is not a socket; refusing to remove it")
            os.unlink(path)  # stale socket from a previous run
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # umask closes the window between bind() creating the file and chmod().
            old_umask = os.umask(0o177)
            try:
                sock.bind(path)
            finally:
                os.umask(old_umask)
            os.chmod(path, 0o600)
            sock.listen(128)
            inode = os.stat(path).st_ino
        except BaseException:
            sock.close()
            raise
    except OSError as exc:
        raise ServerError(f"cannot listen on {path}: {exc.strerror or exc}") from exc
    return sock, inode


def _remove_socket(path: str, inode: int) -> None:
    # Only remove the file if it is still ours: a newer instance may have replaced it.
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    except OSError:
        pass


async def serve_unix(
    path: str,
    handlers: Mapping[str, Handler],
    *,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    reclaimer: Reclaimer = RECLAIMER,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``handlers`` (a grpclib ``__mapping__()``) on a unix socket until cancelled.

    Large requests are noted to ``reclaimer`` (the process's by default); its release
    runs in the listener's nursery, so it outlives the connection that asked for it.
    """
    if len(os.fsencode(path)) > 107:
        raise ServerError(f"unix socket path is longer than 107 bytes: {path}")
    raw, inode = _bind_unix(path)
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(raw))
    services = _known_services(handlers)
    connections: set[_Connection] = set()
    try:
        async with trio.open_nursery() as nursery:

            def reclaim(size: int) -> None:
                if reclaimer.note(size):
                    nursery.start_soon(reclaimer.release_when_due)

            task_status.started()
            try:
                await _accept_loop(
                    listener, handlers, services, grace_period, connections, nursery, reclaim
                )
            finally:
                # Ask every connection to drain (they are shielded), then stop accepting.
                # Synchronous part first: the await below raises Cancelled again.
                for conn in connections:
                    conn.shutdown_requested.set()
                await trio.aclose_forcefully(listener)
    finally:
        _remove_socket(path, inode)


async def _accept_loop(
    listener: trio.SocketListener,
    handlers: Mapping[str, Handler],
    services: frozenset[str],
    grace_period: float,
    connections: set[_Connection],
    nursery: trio.Nursery,
    reclaim: Callable[[int], None],
) -> None:
    while True:
        try:
            sock = await listener.accept()
        except OSError as exc:
            if exc.errno in _ACCEPT_RETRY_ERRNOS:
                log.warning("accept failed (%s); retrying", exc.strerror)
                await trio.sleep(0.1)
                continue
            raise ServerError(f"accept failed: {exc.strerror or exc}") from exc
        conn = _Connection(sock, handlers, services, grace_period, reclaim)
        connections.add(conn)
        nursery.start_soon(_run_connection, conn, connections)


async def _run_connection(conn: _Connection, connections: set[_Connection]) -> None:
    try:
        await conn.run()
    except Exception:
        # A bug met on one connection closes that connection (conn.run closed the socket),
        # not the listener and every other caller with it.
        log.exception("gRPC connection failed; closed it")
    finally:
        connections.discard(conn)
