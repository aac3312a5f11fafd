"""The server side of one gRPC-over-h2 connection, sans-IO.

``GRPCServerConnection`` wraps an ``h2`` connection: bytes in (``receive_data``) give
gRPC-level events, calls like ``send_message`` / ``send_status`` queue bytes, and
``data_to_send`` hands them to whoever owns the socket. It answers the requests it can
reject on its own (bad method or content-type, malformed ``grpc-timeout``, bad framing,
refused streams after GOAWAY) with the right status, so the shell only sees well-formed
unary requests.

Only unary-request methods are served (unary-unary and unary-stream, all the kubelet
uses): a request is handed over once its single message and END_STREAM have arrived.
Replies are held per stream and given to h2 as the flow-control window allows; trailers
follow the last queued byte.

Hostile input costs bounded CPU per byte: see ``frame_guard`` (read ahead of h2, work per
step), ``hpack_out`` (what is sent) and ``limits``.
"""

from __future__ import annotations

import contextlib

import h2.connection
import h2.events
import h2.exceptions
from grpclib.const import Status
from h2.errors import ErrorCodes
from hyperframe.frame import GoAwayFrame, HeadersFrame, RstStreamFrame

from dracpu.grpc.errors import RPCError
from dracpu.grpc.events import (
    ConnectionClosed,
    Event,
    Metadata,
    RequestReceived,
    StreamAborted,
    decode_metadata,
)
from dracpu.grpc.frame_guard import FrameGuard, Refused
from dracpu.grpc.framing import MAX_MESSAGE_SIZE, MessageDecoder, encode_message
from dracpu.grpc.h2_server import STREAM_GONE, server_h2
from dracpu.grpc.limits import (
    DEFAULT_MAX_CONCURRENT_STREAMS,
    MAX_CONNECTION_BUFFER,
    MAX_HEADER_BLOCK_SIZE,
    MAX_HEADER_LIST_SIZE,
    STEP_BUDGET,
)
from dracpu.grpc.status import (
    RESPONSE_HEADERS,
    Headers,
    checked_headers,
    http_error,
    status_trailers,
    trailers_only,
)
from dracpu.grpc.stream import StreamState
from dracpu.grpc.timeout import parse_grpc_timeout

# The events and limits are named here too, where the connection's users import them from.
__all__ = [
    "DEFAULT_MAX_CONCURRENT_STREAMS",
    "MAX_CONNECTION_BUFFER",
    "MAX_HEADER_BLOCK_SIZE",
    "MAX_HEADER_LIST_SIZE",
    "STEP_BUDGET",
    "ConnectionClosed",
    "Event",
    "GRPCServerConnection",
    "Metadata",
    "RequestReceived",
    "StreamAborted",
    "decode_metadata",
]


class GRPCServerConnection:
    """Server side of one HTTP/2 connection carrying unary-request gRPC calls."""

    def __init__(
        self,
        *,
        max_message_size: int = MAX_MESSAGE_SIZE,
        max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS,
        max_header_list_size: int = MAX_HEADER_LIST_SIZE,
        max_header_block_size: int | None = None,
        max_connection_buffer: int = MAX_CONNECTION_BUFFER,
    ) -> None:
        self._h2 = server_h2(
            max_concurrent_streams=max_concurrent_streams,
            max_header_list_size=max_header_list_size,
        )
        if max_header_block_size is None:
            max_header_block_size = max_header_list_size
        self._frames = FrameGuard(self._h2.max_inbound_frame_size, max_header_block_size)
        # Bytes of the last read that a budgeted receive_data left for the next call.
        self._backlog = memoryview(b"")
        self._max_message_size = max_message_size
        self._max_buffer = max_connection_buffer
        self._buffered = 0
        # Request bytes let go of unfinished (refused, reset, over the buffer budget), in
        # all: the shell hands large amounts of it to the heap's reclaimer.
        self.dropped_request_bytes = 0
        self._streams: dict[int, StreamState] = {}
        self._blocked: set[int] = set()  # streams with replies waiting for window
        self._goaway_last_id: int | None = None
        self._extra_out = bytearray()  # frames h2 does not know about (graceful GOAWAY)
        self._held_goaway = b""  # sent once a refused header block has ended
        self.closed = False

    # -- connection level -------------------------------------------------------------

    def initiate(self) -> None:
        """Queue the server preface (SETTINGS); send it right after accept."""
        self._h2.initiate_connection()

    def data_to_send(self) -> bytes:
        data = self._h2.data_to_send()
        if self._extra_out:
            data += bytes(self._extra_out)
            self._extra_out.clear()
        return data

    @property
    def active_streams(self) -> int:
        """Streams accepted and not yet finished (answered or reset)."""
        return len(self._streams)

    @property
    def buffered_request_bytes(self) -> int:
        """Request bytes held in unfinished messages, over all streams (bounded)."""
        return self._buffered

    @property
    def shutting_down(self) -> bool:
        return self._goaway_last_id is not None

    def start_shutdown(self) -> None:
        """Graceful GOAWAY: refuse new streams, let accepted ones finish.

        h2's own close_connection() would forbid sending on the accepted streams, so
        this GOAWAY is built by hand and new streams are refused here.
        """
        if self.closed or self._goaway_last_id is not None:
            return
        self._goaway_last_id = self._h2.highest_inbound_stream_id
        frame = GoAwayFrame(0, last_stream_id=self._goaway_last_id, error_code=0)
        frame.additional_data = b"server shutdown"
        # After h2's pending frames, so a SETTINGS ack still goes first.
        self._extra_out += self._h2.data_to_send() + frame.serialize()

    @property
    def holding_goaway(self) -> bool:
        """A refused header block is still arriving; the GOAWAY waits for its end."""
        return bool(self._held_goaway)

    def release_goaway(self) -> None:
        """Queue the GOAWAY of a refused header block now (the shell stops waiting)."""
        self._extra_out += self._held_goaway
        self._held_goaway = b""

    def close(self) -> None:
        """Final GOAWAY; the shell closes the socket after flushing."""
        if self.closed:
            return
        self.closed = True
        last = self._goaway_last_id
        # ProtocolError: the connection is already closed on h2's side.
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self._h2.close_connection(ErrorCodes.NO_ERROR, last_stream_id=last)
        self._forget_all()

    @property
    def input_pending(self) -> bool:
        """Bytes of an earlier read wait for ``receive_data`` (a budgeted call stopped)."""
        return bool(self._backlog) and not self.closed

    def receive_data(self, data: bytes, *, budget: int | None = None) -> list[Event]:
        """Feed bytes from the socket; always flush ``data_to_send`` afterwards.

        With ``budget`` (see STEP_BUDGET) at most about that much work is done; the rest
        of ``data`` is kept, ``input_pending`` is true, and ``receive_data(b"", budget=...)``
        goes on with it. Without, everything is processed.
        """
        if self.closed:
            self._backlog = memoryview(b"")
            if self._held_goaway and self._frames.refused_block_ends(memoryview(data)):
                self.release_goaway()
            return []
        view = memoryview(data)
        if self._backlog:
            view = memoryview(bytes(self._backlog) + data)
        end, refused = self._frames.scan(view, budget)
        # An empty rest would still pin the whole read: keep nothing then.
        self._backlog = view[end:] if end < len(view) else memoryview(b"")
        if refused is not None:
            closed = self._refuse(refused)
            if self._held_goaway and self._frames.refused_block_ends(view[end:]):
                self.release_goaway()
            return [closed]
        try:
            h2_events = self._h2.receive_data(bytes(view[:end]))
        except h2.exceptions.ProtocolError as exc:
            # h2 has queued GOAWAY(PROTOCOL_ERROR) where it can; nothing else is possible.
            self.closed = True
            self._forget_all()
            code = getattr(exc, "error_code", ErrorCodes.PROTOCOL_ERROR)
            return [ConnectionClosed(int(code))]
        events: list[Event] = []
        for ev in h2_events:
            try:
                self._handle(ev, events)
            except h2.exceptions.ProtocolError:
                # h2 parses the whole read before handing out events, so a request can
                # arrive together with the frame that ended the connection (a client
                # GOAWAY after its request): answering it is no longer possible. The
                # ConnectionTerminated event that follows closes our side.
                if self._h2.state_machine.state is not h2.connection.ConnectionState.CLOSED:
                    raise
                self._forget(getattr(ev, "stream_id", 0))
        if self._blocked and not self.closed:
            self._pump_blocked()
        return events

    def _refuse(self, refused: Refused) -> ConnectionClosed:
        """End the connection over a frame or header block seen to be too large.

        Nothing of the refused frame reaches h2. An oversized frame is a FRAME_SIZE_ERROR
        (RFC 9113 4.2). An oversized header block cannot be skipped without decoding it
        (HPACK state is shared by the whole connection), so the connection ends too, but
        first its stream gets a Trailers-Only RESOURCE_EXHAUSTED saying why, and the
        GOAWAY names that stream as processed so the client takes the status. The GOAWAY
        waits until the client has sent the rest of the block (``receive_data`` still
        scans frame headers), or ``release_goaway``: a client still sending its request
        (grpcio) fails the call on a GOAWAY before it has read the status.
        """
        self.closed = True
        self._forget_all()
        self._backlog = memoryview(b"")
        why = f"{refused.what} of {refused.size} bytes, max {refused.limit}"
        if refused.what == "frame":
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self._h2.close_connection(ErrorCodes.FRAME_SIZE_ERROR, additional_data=why.encode())
            return ConnectionClosed(int(ErrorCodes.FRAME_SIZE_ERROR))
        # After what h2 already queued (SETTINGS acks, earlier replies).
        out = self._h2.data_to_send()
        sid = refused.stream_id
        last_id = self._h2.highest_inbound_stream_id
        if sid % 2 == 1 and sid > last_id:
            message = (
                f"request metadata too large: header block of more than {refused.limit} "
                f"bytes (at least {refused.size}); connection closed"
            )
            answer = HeadersFrame(sid, flags=("END_HEADERS", "END_STREAM"))
            answer.data = self._h2.encoder.encode(
                checked_headers(trailers_only(Status.RESOURCE_EXHAUSTED, message))
            )
            # Answered before the request ended: RST_STREAM(NO_ERROR) tells the client it
            # may stop sending and take the status (PROTOCOL-HTTP2.md, Early Server Closure).
            out += (
                answer.serialize() + RstStreamFrame(sid, error_code=ErrorCodes.NO_ERROR).serialize()
            )
            last_id = sid
        goaway = GoAwayFrame(0, last_stream_id=last_id, error_code=ErrorCodes.ENHANCE_YOUR_CALM)
        goaway.additional_data = why.encode()
        self._extra_out += out
        self._held_goaway = goaway.serialize()
        if not self._frames.in_refused_block:
            self.release_goaway()
        return ConnectionClosed(int(ErrorCodes.ENHANCE_YOUR_CALM))

    def _handle(self, ev: h2.events.Event, out: list[Event]) -> None:
        if isinstance(ev, h2.events.DataReceived):
            self._on_data(ev)
        elif isinstance(ev, h2.events.RequestReceived):
            self._on_headers(ev)
        elif isinstance(ev, h2.events.StreamEnded):
            self._on_end(ev.stream_id, out)
        elif isinstance(ev, h2.events.StreamReset):
            if self._forget(ev.stream_id) is not None:
                out.append(StreamAborted(ev.stream_id))
        elif isinstance(ev, h2.events.ConnectionTerminated):
            for sid in self._streams:
                out.append(StreamAborted(sid))
            self._forget_all()
            self.closed = True
            out.append(ConnectionClosed(int(ev.error_code or 0)))
        # WindowUpdated and RemoteSettingsChanged are covered by _pump_blocked(); PING
        # and SETTINGS are acknowledged by h2 itself.

    def _forget(self, sid: int) -> StreamState | None:
        stream = self._streams.pop(sid, None)
        self._blocked.discard(sid)
        if stream is not None:
            self._buffered -= stream.held
            self.dropped_request_bytes += stream.held
            stream.held = 0
        return stream

    def _forget_all(self) -> None:
        self.dropped_request_bytes += self._buffered
        self._streams.clear()
        self._blocked.clear()
        self._buffered = 0

    def _hold(self, stream: StreamState, *, handed_over: bool = False) -> None:
        """Re-count what the stream holds; a poisoned decoder or handed-over message holds 0."""
        held = stream.decoder.buffered + len(stream.message or b"")
        if held < stream.held and not handed_over:
            self.dropped_request_bytes += stream.held - held
        self._buffered += held - stream.held
        stream.held = held

    # -- inbound ------------------------------------------------------------------------

    def _on_headers(self, ev: h2.events.RequestReceived) -> None:
        try:
            self._accept_headers(ev)
        except STREAM_GONE:
            # Later frames of the same read already closed the stream (the client's
            # END_STREAM crossed our early answer, or it reset the stream): nothing to send.
            self._forget(ev.stream_id)

    def _accept_headers(self, ev: h2.events.RequestReceived) -> None:
        sid = ev.stream_id
        if self._goaway_last_id is not None and sid > self._goaway_last_id:
            self._h2.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
            return
        headers: list[tuple[bytes, bytes]] = list(ev.headers or ())
        method = path = content_type = timeout_value = None
        for name, value in headers:
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout_value = value
        if method != b"POST":
            self._send_headers(sid, http_error(405, "gRPC requires POST"), end_stream=True)
            self._finish_early(sid, ev.stream_ended is not None)
            return
        if content_type is None or not content_type.startswith(b"application/grpc"):
            shown = (content_type or b"").decode("ascii", errors="replace")
            self._send_headers(
                sid, http_error(415, f"invalid gRPC content-type {shown!r}"), end_stream=True
            )
            self._finish_early(sid, ev.stream_ended is not None)
            return
        stream = StreamState(
            (path or b"").decode("utf-8", errors="replace"),
            decode_metadata(headers),
            None,
            self._max_message_size,
        )
        self._streams[sid] = stream
        if timeout_value is not None:
            try:
                stream.timeout = parse_grpc_timeout(timeout_value)
            except RPCError as exc:
                self.send_status(sid, exc.status, exc.message)

    def _finish_early(self, sid: int, client_done: bool) -> None:
        h2_stream = self._h2.streams.get(sid)
        if not client_done and h2_stream is not None and not h2_stream.closed:
            self._h2.reset_stream(sid, ErrorCodes.NO_ERROR)

    def _on_data(self, ev: h2.events.DataReceived) -> None:
        sid = ev.stream_id
        # Acknowledge everything, even on streams already answered, or the client's
        # connection window runs dry (protocols.md 1.7, 1.8).
        if ev.flow_controlled_length:
            self._h2.acknowledge_received_data(ev.flow_controlled_length, sid)
        stream = self._streams.get(sid)
        if stream is None or stream.trailers is not None or ev.data is None:
            return
        try:
            messages = stream.decoder.feed(ev.data)
        except RPCError as exc:
            self._hold(stream)
            self.send_status(sid, exc.status, exc.message)
            return
        if messages and (stream.message is not None or len(messages) > 1):
            stream.decoder = MessageDecoder(0)  # drop what is buffered; the call is over
            stream.message = None
            self._hold(stream)
            self.send_status(sid, Status.INTERNAL, "unary request carries more than one message")
            return
        if messages:
            stream.message = messages[0]
        self._hold(stream)
        if self._buffered > self._max_buffer:
            stream.decoder = MessageDecoder(0)
            stream.message = None
            self._hold(stream)
            self.send_status(
                sid,
                Status.RESOURCE_EXHAUSTED,
                f"connection holds more than {self._max_buffer} bytes of unfinished requests",
            )

    def _on_end(self, sid: int, out: list[Event]) -> None:
        stream = self._streams.get(sid)
        if stream is None:
            return
        stream.client_done = True
        if stream.trailers is not None:
            return  # already answered
        try:
            stream.decoder.finish()
        except RPCError as exc:
            self.send_status(sid, exc.status, exc.message)
            return
        if stream.message is None:
            self.send_status(sid, Status.INTERNAL, "unary request carries no message")
            return
        out.append(
            RequestReceived(sid, stream.path, stream.message, stream.metadata, stream.timeout)
        )
        stream.message = b""  # the handler owns it now; keep the stream's state small
        self._hold(stream, handed_over=True)

    # -- outbound -----------------------------------------------------------------------

    def send_message(self, stream_id: int, payload: bytes) -> None:
        """Queue one reply message (response headers go first, once)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return  # reset by the client, or already answered: drop silently
        if not stream.headers_sent:
            self._send_headers(stream_id, RESPONSE_HEADERS)
            stream.headers_sent = True
        stream.outbound += encode_message(payload)
        self._pump(stream_id, stream)

    def send_initial_metadata(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.headers_sent and stream.trailers is None:
            self._send_headers(stream_id, RESPONSE_HEADERS)
            stream.headers_sent = True

    def send_status(self, stream_id: int, status: Status, message: str = "") -> None:
        """End the response: trailers after queued replies, or Trailers-Only if none."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return
        if stream.headers_sent:
            stream.trailers = status_trailers(status, message)
        else:
            stream.trailers = trailers_only(status, message)
        self._pump(stream_id, stream)

    def reset_stream(self, stream_id: int, error_code: int = ErrorCodes.CANCEL) -> None:
        """Abandon a stream (e.g. deadline passed while replies were still queued)."""
        if self._forget(stream_id) is not None:
            self._h2.reset_stream(stream_id, error_code)

    def _send_headers(self, sid: int, headers: Headers, *, end_stream: bool = False) -> None:
        self._h2.send_headers(sid, checked_headers(headers), end_stream=end_stream)

    def outbound_pending(self, stream_id: int) -> int:
        """Reply bytes of this stream not yet handed to h2 (waiting for window)."""
        stream = self._streams.get(stream_id)
        return len(stream.outbound) if stream is not None else 0

    def _pump_blocked(self) -> None:
        for sid in list(self._blocked):
            stream = self._streams.get(sid)
            if stream is None:
                self._forget(sid)
            else:
                self._pump(sid, stream)

    def _pump(self, sid: int, stream: StreamState) -> None:
        h2conn = self._h2
        out = stream.outbound
        try:
            while out:
                size = min(
                    len(out), h2conn.local_flow_control_window(sid), h2conn.max_outbound_frame_size
                )
                if size <= 0:
                    self._blocked.add(sid)
                    return
                h2conn.send_data(sid, bytes(out[:size]))
                del out[:size]
            self._blocked.discard(sid)
            if stream.trailers is not None:
                self._send_headers(sid, stream.trailers, end_stream=True)
                if not stream.client_done:
                    # Answered before the request ended: release the stream (1.4).
                    h2conn.reset_stream(sid, ErrorCodes.NO_ERROR)
                self._forget(sid)
        except STREAM_GONE:
            # The stream closed under us (a reset already processed by h2).
            self._forget(sid)
