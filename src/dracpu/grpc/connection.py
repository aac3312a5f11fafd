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

Hostile input costs bounded CPU per byte. Frame headers are read here before h2 sees the
frame, so an oversized frame or request header block is refused before it is buffered or
HPACK-decoded; ``receive_data(..., budget=...)`` does a bounded amount of work per call,
so the shell can let other connections run between slices of one large read; and the
HPACK encoder sends literals without Huffman coding (hpack's Huffman encoder is quadratic
in the value's length) and without the dynamic table, so repeated blocks are reused.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from grpclib.const import Status
from h2.errors import ErrorCodes
from h2.stream import StreamClosedBy
from hpack import Encoder, HeaderTuple
from hpack.hpack import encode_integer
from hpack.table import HeaderTable
from hyperframe.frame import GoAwayFrame, HeadersFrame, RstStreamFrame

from dracpu.grpc.errors import RPCError
from dracpu.grpc.framing import MAX_MESSAGE_SIZE, MessageDecoder, encode_message
from dracpu.grpc.status import (
    RESPONSE_HEADERS,
    Headers,
    bounded_header_value,
    http_error,
    status_trailers,
    trailers_only,
)
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
# Advertised in SETTINGS and enforced by the HPACK decoder (a block that decodes to more
# ends the connection with ENHANCE_YOUR_CALM). 8 KiB is the server default gRPC's
# PROTOCOL-HTTP2.md suggests for Request-Headers; the kubelet's take a few hundred bytes.
# (grpc-go advertises 16 MiB, defaultServerMaxHeaderListSize in internal/transport/
# defaults.go, and so would decode megabytes of headers; we do not.)
MAX_HEADER_LIST_SIZE = 8 * 1024
# The encoded header block (HEADERS plus CONTINUATION payloads) is refused from the frame
# headers, before any of it is HPACK-decoded, once it passes this. An encoder that follows
# RFC 7541 never needs more bytes for a list than the list's size (each field counts 32
# bytes over its name and value), so a client under MAX_HEADER_LIST_SIZE is not refused
# here unless it pads its HEADERS frames. golang.org/x/net/http2 (readMetaFrame) likewise
# stops decoding a block whose fragments outgrow twice the list budget, and closes the
# connection.
MAX_HEADER_BLOCK_SIZE = MAX_HEADER_LIST_SIZE
# Work done per receive_data(budget=...) call, in units: 1 per frame, 4 per HEADERS frame
# (a stream opened, decoded and often answered: ~100-200 µs of h2 work, where most frames
# cost 10-30 µs), and 1 per HEADER_BYTES_PER_UNIT of header block (HPACK-decoding costs
# up to ~1-2 µs a byte). A step is then at most 16 light frames, 4 requests or one full
# header block: a few ms, up to ~15 ms for a block of the costliest bytes, after which the
# shell lets other connections run.
STEP_BUDGET = 16
HEADERS_FRAME_UNITS = 4
HEADER_BYTES_PER_UNIT = 256
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


@dataclass(frozen=True, slots=True)
class _Refused:
    """A frame or header block over its limit, seen from a frame header."""

    what: str  # "frame" or "header block"
    stream_id: int
    size: int
    limit: int


_HEADERS_FRAME, _CONTINUATION_FRAME, _END_HEADERS = 0x1, 0x9, 0x4


class _FrameGuard:
    """Follows frame boundaries as bytes arrive, ahead of h2.

    From each 9-byte frame header it refuses a frame over the size limit (h2 checks only
    once the whole frame is buffered, so a header announcing 16 MiB would make it hold
    16 MiB first) and a request header block over its limit (h2 would HPACK-decode all of
    it first), and it measures the work of each step. A few operations per frame.
    """

    __slots__ = (
        "_block",
        "_block_stream",
        "_header",
        "_preface",
        "_skip",
        "in_refused_block",
        "max_frame_size",
        "max_header_block",
    )

    def __init__(self, max_frame_size: int, max_header_block: int) -> None:
        self.max_frame_size = max_frame_size
        self.max_header_block = max_header_block
        self._preface = 24  # the client preface; h2 itself checks its content
        self._header = bytearray()
        self._skip = 0
        self._block = 0  # header block bytes so far, while a block is open
        self._block_stream = 0
        self.in_refused_block = False  # after a refusal: the block's frames still arrive

    def refused_block_ends(self, data: memoryview) -> bool:
        """After a refused header block: does ``data`` hold the rest of it?

        Only frame headers are read, to find the frame that ends the block (END_HEADERS,
        or any frame that is not a CONTINUATION, which would be the client's error).
        """
        i, n = 0, len(data)
        while i < n and self.in_refused_block:
            if self._skip:
                step = min(self._skip, n - i)
                self._skip -= step
                i += step
                continue
            take = data[i : i + 9 - len(self._header)]
            self._header += take
            i += len(take)
            if len(self._header) < 9:
                break
            kind, flags = self._header[3], self._header[4]
            self._skip = int.from_bytes(self._header[:3], "big")
            self._header.clear()
            if kind != _CONTINUATION_FRAME or flags & _END_HEADERS:
                self.in_refused_block = False
        return not self.in_refused_block

    def scan(self, data: memoryview, budget: int | None) -> tuple[int, _Refused | None]:
        """How much of ``data`` one step takes, and the first refused frame in it.

        With a ``budget`` the step ends after the frame that spends it (the whole frame if
        ``data`` holds it); without one it takes everything.
        """
        i, n = 0, len(data)
        work = 0
        if self._preface:
            i = min(self._preface, n)
            self._preface -= i
        while i < n:
            if self._skip:
                step = min(self._skip, n - i)
                self._skip -= step
                i += step
                if not self._skip and budget is not None and work >= budget:
                    return i, None
                continue
            take = data[i : i + 9 - len(self._header)]
            self._header += take
            i += len(take)
            if len(self._header) < 9:
                break
            header = self._header
            length = int.from_bytes(header[:3], "big")
            kind, flags = header[3], header[4]
            stream_id = int.from_bytes(header[5:9], "big") & 0x7FFF_FFFF
            header.clear()
            if length > self.max_frame_size:
                return i, _Refused("frame", stream_id, length, self.max_frame_size)
            work += 1
            if kind in (_HEADERS_FRAME, _CONTINUATION_FRAME):
                if kind == _HEADERS_FRAME:
                    self._block, self._block_stream = 0, stream_id
                    work += HEADERS_FRAME_UNITS - 1
                self._block += length
                if self._block > self.max_header_block:
                    refused = _Refused(
                        "header block", self._block_stream, self._block, self.max_header_block
                    )
                    self._skip = length
                    self.in_refused_block = not flags & _END_HEADERS
                    return i, refused
                if flags & _END_HEADERS:
                    self._block = 0
                work += length // HEADER_BYTES_PER_UNIT
            self._skip = length
            if not length and budget is not None and work >= budget:
                return i, None
        return i, None


# Header blocks the stateless encoder keeps, and the largest it keeps: the server sends
# the same few blocks (response headers, OK trailers, a few error statuses) over and over.
# A full cache starts over, so blocks that stopped coming leave it.
_BLOCK_CACHE_ENTRIES = 256
_BLOCK_CACHE_BYTES = 512
_block_cache: dict[tuple[tuple[bytes, bytes], ...], bytes] = {}
# First-byte patterns of RFC 7541 6.2.2 (without indexing) and 6.2.3 (never indexed).
_WITHOUT_INDEXING, _NEVER_INDEXED = 0x00, 0x10


def _hpack_int(value: int, prefix_bits: int, flags: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1, hpack's encoder) with ``flags`` in its first byte."""
    out = encode_integer(value, prefix_bits)
    out[0] |= flags
    return bytes(out)


def _hpack_field(name: bytes, value: bytes, literal: int = _WITHOUT_INDEXING) -> bytes:
    """One field with no dynamic-table state: a static-table index when the field is there
    whole (not for a never-indexed field), else a literal of the ``literal`` kind, its name
    from the static table where it is there, no Huffman coding."""
    static = HeaderTable.STATIC_TABLE_MAPPING.get(name)
    if static is not None:
        name_index, values = static
        whole = values.get(value)
        if whole is not None and literal == _WITHOUT_INDEXING:
            return _hpack_int(whole, 7, 0x80)
        head = _hpack_int(name_index, 4, literal)
    else:
        head = bytes((literal,)) + _hpack_int(len(name), 7, 0x00) + name
    return head + _hpack_int(len(value), 7, 0x00) + value


def _as_bytes(item: object) -> bytes:
    if isinstance(item, bytes):
        return item
    return str(item).encode("utf-8")


def _never_indexed(item: Any) -> bool:
    """hpack's two ways to mark a sensitive field: ``NeverIndexedHeaderTuple``, or a true
    third item in a plain tuple."""
    if isinstance(item, HeaderTuple):
        return not item.indexable
    return len(item) > 2 and bool(item[2])


def _size_updates(changes: list[int]) -> bytes:
    """Dynamic table size updates (RFC 7541 6.3) for the changes since the last block: the
    smallest, then the last if it differs (4.2), so none passes what the peer allows now."""
    smallest, last = min(changes), changes[-1]
    updates = [smallest] if smallest == last else [smallest, last]
    return b"".join(_hpack_int(size, 5, 0x20) for size in updates)


class _StatelessEncoder(Encoder):
    """HPACK for what the server sends, with no dynamic table and no Huffman coding.

    - hpack's Huffman encoder builds one big integer a few bits at a time, which is
      quadratic in the value's length (a 64 KiB value took 0.4 s). On a unix socket the
      bytes Huffman coding saves are not worth any CPU.
    - Nothing is added to the dynamic table, so a block depends only on its fields: the
      blocks a server sends on every call (``:status 200`` and content-type, then
      ``grpc-status 0``) are encoded once per process and reused. hpack's encoder took
      ~20 µs a block; a repeated block now costs a dictionary look-up. The price is ~16
      bytes a call that indexing would have saved.
    - A sensitive field (hpack's ``NeverIndexedHeaderTuple``, or a third item that is
      true) goes as never indexed (RFC 7541 6.2.3), and its block is not kept.

    Table size changes asked for by the peer's SETTINGS are still announced at the start
    of the next block (RFC 7541 4.2): the table stays empty whatever its size.
    """

    def encode(self, headers: Any, huffman: bool = False) -> bytes:
        prefix = b""
        if self.table_size_changes:
            prefix = _size_updates(self.table_size_changes)
            self.table_size_changes = []
        items = list(headers.items() if isinstance(headers, dict) else headers)
        fields: list[tuple[bytes, bytes]] = []
        sensitive = False
        for item in items:
            fields.append((_as_bytes(item[0]), _as_bytes(item[1])))
            # h2 hands over plain 2-tuples: only other items are looked at further.
            if type(item) is not tuple or len(item) > 2:
                sensitive = sensitive or _never_indexed(item)
        if sensitive:
            return prefix + b"".join(
                _hpack_field(*field, _NEVER_INDEXED if _never_indexed(item) else _WITHOUT_INDEXING)
                for field, item in zip(fields, items, strict=True)
            )
        key = tuple(fields)
        block = _block_cache.get(key)
        if block is None:
            block = b"".join(_hpack_field(name, value) for name, value in key)
            if len(block) <= _BLOCK_CACHE_BYTES:
                if len(_block_cache) >= _BLOCK_CACHE_ENTRIES:
                    _block_cache.clear()
                _block_cache[key] = block
        return prefix + block if prefix else block


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


def _checked_headers(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """What the server sends, each value printable ASCII of bounded size (status.py)."""
    return [(name, bounded_header_value(value)) for name, value in headers]


class _H2Connection(h2.connection.H2Connection):
    # h2 remembers how every closed stream was closed, up to 65,536 per connection; the
    # kubelet keeps one connection for all its calls, so that table grew with every call
    # (~2 MB per 10,000 in the soak). Frames for a stream this far in the past are rare.
    MAX_CLOSED_STREAMS = 1024

    def _handle_data_on_closed_stream(
        self,
        events: list[h2.events.Event],
        exc: h2.exceptions.StreamClosedError,
        frame: Any,
    ) -> tuple[list[Any], list[h2.events.Event]]:
        # The rest of a request we refused (a message over the limit, answered early) is
        # still on its way when the client reads our RST_STREAM. RFC 9113 5.1: after
        # sending RST_STREAM an endpoint MUST ignore frames it receives on the stream; h2
        # answers each with another RST_STREAM. Keep the connection's WINDOW_UPDATE (the
        # bytes count against the connection window either way), drop the second reset.
        frames, events = super()._handle_data_on_closed_stream(events, exc, frame)
        if self._stream_closed_by(frame.stream_id) is StreamClosedBy.SEND_RST_STREAM:
            frames = [f for f in frames if not isinstance(f, RstStreamFrame)]
        return frames, events


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
        self._h2 = _H2Connection(config=_h2_config())
        self._h2.encoder = _StatelessEncoder()
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
        if max_header_block_size is None:
            max_header_block_size = max_header_list_size
        self._frames = _FrameGuard(self._h2.max_inbound_frame_size, max_header_block_size)
        # Bytes of the last read that a budgeted receive_data left for the next call.
        self._backlog = memoryview(b"")
        self._max_message_size = max_message_size
        self._max_buffer = max_connection_buffer
        self._buffered = 0
        # Request bytes let go of unfinished (refused, reset, over the buffer budget), in
        # all: the shell hands large amounts of it to the heap's reclaimer.
        self.dropped_request_bytes = 0
        self._streams: dict[int, _Stream] = {}
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

    def _refuse(self, refused: _Refused) -> ConnectionClosed:
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
                _checked_headers(trailers_only(Status.RESOURCE_EXHAUSTED, message))
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

    def _forget(self, sid: int) -> _Stream | None:
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

    def _hold(self, stream: _Stream, *, handed_over: bool = False) -> None:
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
        self._h2.send_headers(sid, _checked_headers(headers), end_stream=end_stream)

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
                self._send_headers(sid, stream.trailers, end_stream=True)
                if not stream.client_done:
                    # Answered before the request ended: release the stream (1.4).
                    h2conn.reset_stream(sid, ErrorCodes.NO_ERROR)
                self._forget(sid)
        except _STREAM_GONE:
            # The stream closed under us (a reset already processed by h2).
            self._forget(sid)
