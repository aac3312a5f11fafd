"""One NRI socket, either end: the mux, a ttrpc server and a ttrpc client, driven by Trio.

`MuxPeer` feeds socket bytes to the sans-IO `Multiplexer`, hands each logical connection's
bytes to its ttrpc object (a server on the connection it serves, a client on the one it
calls), passes every inbound request to a callback, and matches replies to outstanding
calls. dracpu's NRI session serves connection 1 and calls on 2; the runtime simulator
(`dracpu_sim.runtime`) uses the same class with the connections swapped.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import trio

from dracpu.nri.errors import FrameTooLarge, ProtocolError
from dracpu.nri.mux import Multiplexer, MuxFrameDropped
from dracpu.nri.ttrpc import (
    RequestReceived,
    ResponseReceived,
    Status,
    StatusCode,
    TTRPCClientConnection,
    TTRPCServerConnection,
)

__all__ = ["PLUGIN_SERVICE", "RUNTIME_SERVICE", "CallFailed", "MuxPeer", "PeerClosed"]

log = logging.getLogger(__name__)

PLUGIN_SERVICE: Final = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE: Final = "nri.pkg.api.v1alpha1.Runtime"
_READ_SIZE: Final = 65536
# Payload bytes handled between two checkpoints (~6 ms of the worst frames measured).
_STEP_BYTES: Final = 8192


class PeerClosed(Exception):
    """The socket ended (or broke) before the call finished."""


class CallFailed(Exception):
    """The peer answered a call with an error status."""

    def __init__(self, method: str, status: Status) -> None:
        super().__init__(f"{method}: code {status.code}: {status.message}")
        self.status = status


@dataclass
class _Pending:
    done: trio.Event = field(default_factory=trio.Event)
    result: bytes | Status | None = None
    error: str = ""


class MuxPeer:
    """One NRI socket: a ttrpc server on `serve_conn`, a ttrpc client on `call_conn`.

    `run` is the read loop; it returns the reason the socket ended and raises
    `ProtocolError` when the peer breaks the wire format. Requests are handed to
    `on_request` in arrival order, from the read loop itself: it must answer (or hand the
    work to a task of its own) without waiting on the peer.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        serve_conn: int,
        call_conn: int,
        on_request: Callable[[RequestReceived], Awaitable[None]],
    ) -> None:
        self._stream = stream
        self._serve_conn = serve_conn
        self._call_conn = call_conn
        self._on_request = on_request
        self._mux = Multiplexer((serve_conn, call_conn))
        self._server = TTRPCServerConnection()
        self._client = TTRPCClientConnection()
        self._send_lock = trio.Lock()
        self._pending: dict[int, _Pending] = {}
        self._closed: str | None = None

    @property
    def closed(self) -> bool:
        return self._closed is not None

    async def run(self) -> str:
        reason = "the peer closed the socket"
        try:
            while True:
                try:
                    data = await self._stream.receive_some(_READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    reason = f"socket error: {exc}"
                    break
                if not data:
                    self._mux.receive_eof()
                    break
                await self._receive(bytes(data))
        except PeerClosed as exc:
            reason = str(exc)
        except ProtocolError as exc:
            reason = f"protocol error: {exc}"
            raise
        finally:
            self._close_pending(reason)
        return reason

    async def _receive(self, data: bytes) -> None:
        # A step at a time: a read of thousands of tiny frames (or one mux frame packed
        # with them) lets the rest of the daemon run every _STEP_BYTES of payload.
        budget = _STEP_BYTES
        for event in self._mux.receive_data(data):
            if isinstance(event, MuxFrameDropped):
                log.debug("dropped a mux frame for unused connection %d", event.conn_id)
                continue
            payload = event.payload
            for start in range(0, max(len(payload), 1), _STEP_BYTES):
                chunk = (
                    payload[start : start + _STEP_BYTES] if len(payload) > _STEP_BYTES else payload
                )
                if event.conn_id == self._serve_conn:
                    await self._serve(chunk)
                else:
                    self._replies(chunk)
                budget -= len(chunk) + 1
                if budget <= 0:
                    await trio.lowlevel.checkpoint()
                    budget = _STEP_BYTES

    async def _serve(self, data: bytes) -> None:
        for request in self._server.receive_data(data):
            if isinstance(request, RequestReceived):
                await self._on_request(request)
            else:
                log.warning(
                    "rejected a request on stream %d: %s",
                    request.stream_id,
                    request.status.message,
                )
                await self.flush()

    def _replies(self, data: bytes) -> None:
        for reply in self._client.receive_data(data):
            if not isinstance(reply, ResponseReceived):
                log.debug("dropped a late reply on stream %d", reply.stream_id)
                continue
            pending = self._pending.pop(reply.stream_id, None)
            if pending is not None:
                pending.result = reply.result
                pending.done.set()

    def _close_pending(self, reason: str) -> None:
        self._closed = reason
        for pending in self._pending.values():
            pending.error = reason
            pending.done.set()
        self._pending.clear()

    async def flush(self) -> None:
        """Send everything both ttrpc connections have queued."""
        async with self._send_lock:
            for message in self._server.messages_to_send():
                self._mux.send(self._serve_conn, message)
            for message in self._client.messages_to_send():
                self._mux.send(self._call_conn, message)
            data = self._mux.data_to_send()
            if not data:
                return
            try:
                await self._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise PeerClosed(f"socket error: {exc}") from exc

    async def respond(self, stream_id: int, result: bytes | Status) -> None:
        """Answer a request; a reply too large for ttrpc becomes RESOURCE_EXHAUSTED."""
        try:
            self._server.send_response(stream_id, result)
        except FrameTooLarge as exc:
            self._server.send_response(stream_id, Status(StatusCode.RESOURCE_EXHAUSTED, str(exc)))
        await self.flush()

    async def call(self, service: str, method: str, payload: bytes, *, timeout: float) -> bytes:
        """A unary call; raises `trio.TooSlowError`, `CallFailed` or `PeerClosed`."""
        if self._closed is not None:
            raise PeerClosed(self._closed)
        try:
            stream_id = self._client.send_request(
                service, method, payload, timeout_nano=int(timeout * 1e9)
            )
        except FrameTooLarge as exc:
            raise CallFailed(method, Status(StatusCode.RESOURCE_EXHAUSTED, str(exc))) from exc
        pending = _Pending()
        self._pending[stream_id] = pending
        await self.flush()
        with trio.move_on_after(timeout):
            await pending.done.wait()
        if not pending.done.is_set():
            self._pending.pop(stream_id, None)
            self._client.abandon(stream_id)
            raise trio.TooSlowError(f"{method} got no reply within {timeout:g}s")
        if pending.error:
            raise PeerClosed(pending.error)
        result = pending.result
        if isinstance(result, Status):
            raise CallFailed(method, result)
        assert result is not None
        return result

    async def aclose(self) -> None:
        await self._stream.aclose()
