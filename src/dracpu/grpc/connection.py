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
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from grpclib.const import Status
from h2.errors import ErrorCodes
from hyperframe.frame import GoAwayFrame

from dracpu.grpc.errors import RPCError
from dracpu.grpc.framing import MAX_MESSAGE_SIZE, MessageDecoder, encode_message
from dracpu.grpc.status import RESPONSE_HEADERS, http_error, status_trailers, trailers_only
from dracpu.grpc.timeout import parse_grpc_timeout

Metadata = tuple[tuple[str, str | bytes], ...]
# What h2 raises when asked to send on a stream it has already closed and forgotten (closed
# streams leave its table; sending on one then looks like opening a new, too-low id).
_STREAM_GONE = (h2.exceptions.StreamClosedError, h2.exceptions.StreamIDTooLowError)

# Request headers with a protocol meaning; everything else is custom metadata.
_RESERVED = frozenset(
    (
        b":method",
        b":scheme",
        b":path",
        b":authority",
        b"te",
        b"content-type",
        b"user-agent",
        b"grpc-timeout",
        b"grpc-encoding",
        b"grpc-accept-encoding",
        b"grpc-message-type",
    )
)
DEFAULT_MAX_CONCURRENT_STREAMS = 1000
# Advertised in SETTINGS and enforced by the HPACK decoder (an oversized header block
# ends the connection with ENHANCE_YOUR_CALM). The kubelet's request headers take a few
# hundred bytes.
MAX_HEADER_LIST_SIZE = 16 * 1024
# Request bytes one connection may hold in unfinished messages across all its streams.
# The client's DATA is acknowledged as it arrives (so windows never stall), which means
# flow control alone does not bound this: without a cap, every concurrent stream could
# buffer a message of MAX_MESSAGE_SIZE.
MAX_CONNECTION_BUFFER = 4 * MAX_MESSAGE_SIZE


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """A complete unary request: run its handler."""

    stream_id: int
    path: str
    message: bytes
    metadata: Metadata
    timeout: float | None


@dataclass(frozen=True, slots=True)
class StreamAborted:
    """The client reset the stream: stop its handler, send nothing more on it."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The peer ended the connection (GOAWAY or a protocol error): nothing more can be sent."""

    error_code: int


Event = RequestReceived | StreamAborted | ConnectionClosed


class _Stream:
    __slots__ = (
        "client_done",
        "decoder",
        "headers_sent",
        "held",
        "message",
        "metadata",
        "outbound",
        "path",
        "timeout",
        "trailers",
    )

    def __init__(self, path: str, metadata: Metadata, timeout: float | None, max_size: int):
        self.path = path
        self.metadata = metadata
        self.timeout = timeout
        self.decoder = MessageDecoder(max_size)
        self.message: bytes | None = None
        self.client_done = False
        self.headers_sent = False
        self.outbound = bytearray()
        self.trailers: list[tuple[bytes, bytes]] | None = None
        self.held = 0  # bytes counted against the connection's buffer budget


class _FrameSizeGuard:
    """Follows frame boundaries as bytes arrive, to refuse an oversized frame from its header.

    h2 checks a frame's length only once the whole frame is buffered, so a header that
    announces 16 MiB would make it hold 16 MiB first. Walking the 9-byte headers here costs
    a few operations per frame and bounds h2's buffer by one frame of the allowed size.
    """

    __slots__ = ("_header", "_preface", "_skip", "max_frame_size")

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self._preface = 24  # the client preface; h2 itself checks its content
        self._header = bytearray()
        self._skip = 0

    def oversized(self, data: bytes) -> int | None:
        """The announced length of the first frame over the limit in ``data``, if any."""
        i, n = 0, len(data)
        if self._preface:
            i = min(self._preface, n)
            self._preface -= i
        while i < n:
            if self._skip:
                step = min(self._skip, n - i)
                self._skip -= step
                i += step
                continue
            take = data[i : i + 9 - len(self._header)]
            self._header += take
            i += len(take)
            if len(self._header) == 9:
                length = int.from_bytes(self._header[:3], "big")
                self._header.clear()
                if length > self.max_frame_size:
                    return length
                self._skip = length
        return None


def _h2_config() -> h2.config.H2Configuration:
    # Header validation and normalisation cost about a quarter of the CPU of a call
    # (protocols.md 1.13); the few checks gRPC needs are done here instead.
    return h2.config.H2Configuration(
        client_side=False,
        header_encoding=None,
        validate_inbound_headers=False,
        validate_outbound_headers=False,
        normalize_inbound_headers=False,
        normalize_outbound_headers=False,
    )


def decode_metadata(headers: list[tuple[bytes, bytes]]) -> Metadata:
    """Custom metadata from request headers; ``-bin`` values are base64 (padding optional)."""
    items: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name in _RESERVED or name.startswith(b":"):
            continue
        key = name.decode("ascii", errors="replace")
        if key.endswith("-bin"):
            try:
                items.append(
                    (key, base64.b64decode(value + b"=" * (-len(value) % 4), validate=True))
                )
            except binascii.Error:
                continue  # undecodable binary metadata is dropped, not fatal
        else:
            items.append((key, value.decode("ascii", errors="replace")))
    return tuple(items)


class _H2Connection(h2.connection.H2Connection):
    # h2 remembers how every closed stream was closed, up to 65,536 per connection; the
    # kubelet keeps one connection for all its calls, so that table grew with every call
    # (~2 MB per 10,000 in the soak). Frames for a stream this far in the past are rare.
    MAX_CLOSED_STREAMS = 1024


class GRPCServerConnection:
    """Server side of one HTTP/2 connection carrying unary-request gRPC calls."""

    def __init__(
        self,
        *,
        max_message_size: int = MAX_MESSAGE_SIZE,
        max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS,
        max_header_list_size: int = MAX_HEADER_LIST_SIZE,
        max_connection_buffer: int = MAX_CONNECTION_BUFFER,
    ) -> None:
        self._h2 = _H2Connection(config=_h2_config())
        self._h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max_concurrent_streams,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: max_header_list_size,
            },
        )
        # The decoder enforces the limit from the first byte: a client may send headers
        # before it has seen our SETTINGS.
        self._h2.decoder.max_header_list_size = max_header_list_size
        self._frames = _FrameSizeGuard(self._h2.max_inbound_frame_size)
        self._max_message_size = max_message_size
        self._max_buffer = max_connection_buffer
        self._buffered = 0
        self._streams: dict[int, _Stream] = {}
        self._blocked: set[int] = set()  # streams with replies waiting for window
        self._goaway_last_id: int | None = None
        self._extra_out = bytearray()  # frames h2 does not know about (graceful GOAWAY)
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

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the socket; always flush ``data_to_send`` afterwards."""
        if self.closed:
            return []
        if (length := self._frames.oversized(data)) is not None:
            self.closed = True
            self._forget_all()
            why = f"frame of {length} bytes, max {self._frames.max_frame_size}"
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self._h2.close_connection(ErrorCodes.FRAME_SIZE_ERROR, additional_data=why.encode())
            return [ConnectionClosed(int(ErrorCodes.FRAME_SIZE_ERROR))]
        try:
            h2_events = self._h2.receive_data(data)
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

    def _forget(self, sid: int) -> _Stream | None:
        stream = self._streams.pop(sid, None)
        self._blocked.discard(sid)
        if stream is not None:
            self._buffered -= stream.held
            stream.held = 0
        return stream

    def _forget_all(self) -> None:
        self._streams.clear()
        self._blocked.clear()
        self._buffered = 0

    def _hold(self, stream: _Stream) -> None:
        """Re-count what the stream holds; a poisoned decoder or handed-over message holds 0."""
        held = stream.decoder.buffered + len(stream.message or b"")
        self._buffered += held - stream.held
        stream.held = held

    # -- inbound ------------------------------------------------------------------------

    def _on_headers(self, ev: h2.events.RequestReceived) -> None:
        try:
            self._accept_headers(ev)
        except _STREAM_GONE:
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
            self._h2.send_headers(sid, http_error(405, "gRPC requires POST"), end_stream=True)
            self._finish_early(sid, ev.stream_ended is not None)
            return
        if content_type is None or not content_type.startswith(b"application/grpc"):
            shown = (content_type or b"").decode("ascii", errors="replace")
            self._h2.send_headers(
                sid, http_error(415, f"invalid gRPC content-type {shown!r}"), end_stream=True
            )
            self._finish_early(sid, ev.stream_ended is not None)
            return
        stream = _Stream(
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
        self._hold(stream)

    # -- outbound -----------------------------------------------------------------------

    def send_message(self, stream_id: int, payload: bytes) -> None:
        """Queue one reply message (response headers go first, once)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return  # reset by the client, or already answered: drop silently
        if not stream.headers_sent:
            self._h2.send_headers(stream_id, RESPONSE_HEADERS)
            stream.headers_sent = True
        stream.outbound += encode_message(payload)
        self._pump(stream_id, stream)

    def send_initial_metadata(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.headers_sent and stream.trailers is None:
            self._h2.send_headers(stream_id, RESPONSE_HEADERS)
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

    def _pump(self, sid: int, stream: _Stream) -> None:
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
                h2conn.send_headers(sid, stream.trailers, end_stream=True)
                if not stream.client_done:
                    # Answered before the request ended: release the stream (1.4).
                    h2conn.reset_stream(sid, ErrorCodes.NO_ERROR)
                self._forget(sid)
        except _STREAM_GONE:
            # The stream closed under us (a reset already processed by h2).
            self._forget(sid)
