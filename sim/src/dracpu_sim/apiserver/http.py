"""The Trio + h11 shell: read requests, hand them to the pure ``Handler``, write the
answers, and stream watches as chunked newline-delimited JSON events."""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

import h11
import msgspec
import trio

from dracpu_sim.apiserver.errors import ApiError
from dracpu_sim.apiserver.handler import (
    DropConnection,
    Handler,
    Request,
    Response,
    WatchStart,
    error_response,
)

__all__ = ["ConnectionServer", "WatchSession"]

log = logging.getLogger(__name__)

MAX_BODY = 8 * 1024 * 1024
MAX_PENDING_EVENTS = 100_000
_SERVER_HEADERS = (("cache-control", "no-cache, private"),)


class WatchSession:
    """One open watch: events queued by the store's synchronous callback, drained by
    the connection task."""

    def __init__(self, start: WatchStart) -> None:
        self.start = start
        self.pending: deque[bytes] = deque()
        self.wake = trio.Event()
        self.overflowed = False
        self.bookmark_requested = False
        self.client_gone = False
        self.end_requested = False
        self.drop = False

    def deliver(self, kind: str, obj: dict[str, Any]) -> None:
        if len(self.pending) >= MAX_PENDING_EVENTS:
            # A watcher this far behind is closed, as the real watch cache does.
            self.overflowed = True
        else:
            self.pending.append(_event_line(kind, obj))
        self.wake.set()

    def request_end(self, *, drop: bool = False) -> None:
        """End the stream: cleanly (the final chunk, as when timeoutSeconds is up) or,
        with ``drop``, by closing the connection mid-stream."""
        self.end_requested = True
        self.drop = drop
        self.wake.set()

    def request_bookmark(self) -> None:
        if self.start.allow_bookmarks:
            self.bookmark_requested = True
            self.wake.set()


def _event_line(kind: str, obj: dict[str, Any]) -> bytes:
    return msgspec.json.encode({"type": kind, "object": obj}) + b"\n"


class ConnectionServer:
    """Serves connections for one ``Handler``; tracks open watches."""

    def __init__(
        self,
        handler: Handler,
        *,
        bookmark_interval: float = 60.0,
        max_watch_seconds: float = 1800.0,
    ) -> None:
        self.handler = handler
        self.bookmark_interval = bookmark_interval
        self.max_watch_seconds = max_watch_seconds
        self.watches: set[WatchSession] = set()

    async def serve_connection(self, stream: trio.abc.Stream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        try:
            async with stream:
                await self._loop(conn, stream)
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away mid-answer
        except* h11.ProtocolError as group:
            log.debug("HTTP protocol error: %s", group.exceptions[0])

    async def _loop(self, conn: h11.Connection, stream: trio.abc.Stream) -> None:
        while True:
            try:
                request = await _read_request(conn, stream)
            except h11.RemoteProtocolError as exc:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await _send(
                        conn,
                        stream,
                        error_response(ApiError(400, "BadRequest", f"malformed request: {exc}")),
                    )
                return
            if request is None:
                return
            result = self.handler.handle(request)
            if isinstance(result, DropConnection):
                return
            if isinstance(result, WatchStart):
                if not await self._watch(conn, stream, result):
                    return
            else:
                await _send(conn, stream, result)
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()

    async def _watch(
        self, conn: h11.Connection, stream: trio.abc.Stream, start: WatchStart
    ) -> bool:
        """Stream one watch; False when the connection cannot be reused afterwards."""
        session = WatchSession(start)
        store = self.handler.store
        try:
            watcher = store.watch(
                start.resource,
                start.namespace,
                start.labels,
                start.fields,
                None if start.send_initial_events else start.resource_version,
                session.deliver,
            )
        except ApiError as err:
            if err.code != 410:
                await _send(conn, stream, error_response(err))
                return True
            # An expired version is reported inside a 200 stream, as an ERROR event.
            await _start_stream(conn, stream)
            await _data(conn, stream, _event_line("ERROR", err.status()))
            await _data(conn, stream, None)
            return True
        if start.send_initial_events:
            bookmark = store.bookmark(start.resource)
            bookmark["metadata"]["annotations"] = {"k8s.io/initial-events-end": "true"}
            session.pending.append(_event_line("BOOKMARK", bookmark))
        self.watches.add(session)
        try:
            await _start_stream(conn, stream)
            limit = min(start.timeout_seconds or self.max_watch_seconds, self.max_watch_seconds)
            deadline = trio.current_time() + limit
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _watch_for_disconnect, conn, stream, session, nursery.cancel_scope
                )
                await self._pump(conn, stream, session, deadline)
                nursery.cancel_scope.cancel()
        finally:
            store.unwatch(watcher)
            self.watches.discard(session)
        if session.client_gone or session.drop:
            return False
        await _data(conn, stream, None)
        return True

    async def _pump(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        session: WatchSession,
        deadline: float,
    ) -> None:
        """Send events until the deadline (timeoutSeconds), an end request or overflow.
        The deadline is only looked at between events: a timeout that cut a chunk in
        half would corrupt the stream the client is still reading."""
        store = self.handler.store
        while not session.overflowed:
            while session.pending:
                await _data(conn, stream, session.pending.popleft())
            if session.end_requested:
                return
            if session.bookmark_requested:
                session.bookmark_requested = False
                await _data(
                    conn, stream, _event_line("BOOKMARK", store.bookmark(session.start.resource))
                )
                continue
            session.wake = trio.Event()
            if session.pending or session.bookmark_requested or session.end_requested:
                continue
            now = trio.current_time()
            if now >= deadline:
                return
            with trio.move_on_at(min(deadline, now + self.bookmark_interval)) as tick:
                await session.wake.wait()
            if tick.cancelled_caught and trio.current_time() < deadline:
                session.request_bookmark()


async def _watch_for_disconnect(
    conn: h11.Connection, stream: trio.abc.Stream, session: WatchSession, scope: trio.CancelScope
) -> None:
    """While a watch streams, the client only sends anything by closing: stop then."""
    while True:
        data = await stream.receive_some(65536)
        if not data:
            session.client_gone = True
            scope.cancel()
            return
        conn.receive_data(bytes(data))


async def _read_request(conn: h11.Connection, stream: trio.abc.Stream) -> Request | None:
    head: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            conn.receive_data(bytes(data))
            if not data and conn.their_state is h11.IDLE:
                return None
            continue
        if isinstance(event, h11.ConnectionClosed):
            return None
        if isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                raise h11.RemoteProtocolError("request body too large", 413)
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers}
            return Request(
                head.method.decode("ascii"), head.target.decode("latin-1"), headers, bytes(body)
            )


async def _send(conn: h11.Connection, stream: trio.abc.Stream, response: Response) -> None:
    headers = [*response.headers, *_SERVER_HEADERS, ("content-length", str(len(response.body)))]
    data = conn.send(h11.Response(status_code=response.status, headers=headers))
    data += conn.send(h11.Data(data=response.body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    await stream.send_all(data)


async def _start_stream(conn: h11.Connection, stream: trio.abc.Stream) -> None:
    headers = [
        ("content-type", "application/json"),
        *_SERVER_HEADERS,
        ("transfer-encoding", "chunked"),
    ]
    await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)) or b"")


async def _data(conn: h11.Connection, stream: trio.abc.Stream, chunk: bytes | None) -> None:
    """Send one chunk, or the end of the stream when ``chunk`` is None."""
    event: h11.Data | h11.EndOfMessage = (
        h11.EndOfMessage() if chunk is None else h11.Data(data=chunk)
    )
    await stream.send_all(conn.send(event) or b"")
