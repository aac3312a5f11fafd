"""ttrpc framing and unary calls (protocols.md 5), sans-IO, in both roles.

A frame is a 10-byte header and L data bytes::

    L (uint32 BE) | stream id (uint32 BE) | message type (uint8) | flags (uint8) | data

Requests and responses carry the protobuf envelopes `ttrpc.Request` / `ttrpc.Response`.
NRI only makes unary calls, so Data frames and streaming flags are never produced and are
refused when received.

What each role does with each kind of inbound frame (anything else raises):

| role   | frame                                  | outcome                                       |
| ------ | -------------------------------------- | --------------------------------------------- |
| server | L > 4 MiB, any type                    | data skipped unbuffered; RESOURCE_EXHAUSTED    |
|        |                                        | reply queued; `RequestRejected`                |
| server | Request, even stream id                | INVALID_ARGUMENT reply; `RequestRejected`      |
| server | Request, id <= previous request id     | INVALID_ARGUMENT reply; `RequestRejected`      |
| server | Request, undecodable envelope          | INVALID_ARGUMENT reply; `RequestRejected`      |
| server | Request, otherwise                     | `RequestReceived`; caller must `send_response` |
| server | Response, Data, unknown type           | `UnknownMessageType`                           |
| client | Response for a call in flight          | `ResponseReceived` (payload or Status)         |
| client | same, L > 4 MiB                        | data skipped; `ResponseReceived` with          |
|        |                                        | RESOURCE_EXHAUSTED                             |
| client | Response for any other stream          | `ResponseDropped` (late reply after a timeout) |
| client | Response in flight, undecodable        | `MalformedMessage`                             |
| client | Request, Data, unknown type            | `UnknownMessageType`                           |

The server rows mirror the Go ttrpc server, which answers these on the offending stream id
and keeps the connection.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from google.protobuf.message import DecodeError

from dracpu.nri.errors import (
    ConnectionBroken,
    FrameTooLarge,
    InvalidStreamId,
    MalformedMessage,
    ProtocolError,
    UnknownMessageType,
)
from dracpu.proto.nri import ttrpc_pb2

HEADER: Final = struct.Struct(">IIBB")
HEADER_LENGTH: Final = HEADER.size
MAX_DATA_LENGTH: Final = 4 * 1024 * 1024
STREAM_ID_MAX: Final = 0xFFFF_FFFF
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1
_INT64_MAX: Final = 2**63 - 1


class MessageType(enum.IntEnum):
    REQUEST = 0x01
    RESPONSE = 0x02
    DATA = 0x03


class Flag(enum.IntFlag):
    """Frame flags; unary NRI calls always send 0."""

    REMOTE_CLOSED = 0x01
    REMOTE_OPEN = 0x02
    NO_DATA = 0x04


class StatusCode(enum.IntEnum):
    """gRPC status codes, which ttrpc reuses."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


@dataclass(frozen=True, slots=True)
class Status:
    """A failed call: a non-zero gRPC code and a message (success is a payload instead)."""

    code: int
    message: str = ""

    def __post_init__(self) -> None:
        if self.code == StatusCode.OK:
            raise ValueError("status code 0 means success; answer with a payload instead")
        if not _INT32_MIN <= self.code <= _INT32_MAX:
            raise ValueError(f"status code {self.code} does not fit in int32")


def unimplemented_service(service: str) -> Status:
    """The reply the Go server gives for a service it does not serve."""
    return Status(StatusCode.UNIMPLEMENTED, f"service {service}")


def unimplemented_method(method: str) -> Status:
    """The reply the Go server gives for a method its service does not have."""
    return Status(StatusCode.UNIMPLEMENTED, f"method {method}")


def _oversize_text(length: int) -> str:
    # The Go channel's wording, so logs on both sides read the same.
    return f"message length {length} exceed maximum message size of {MAX_DATA_LENGTH}"


def _message_type_name(message_type: int) -> str:
    try:
        return MessageType(message_type).name.lower()
    except ValueError:
        return f"unknown (0x{message_type:02x})"


# ------------------------------------------------------------------------ frames


@dataclass(frozen=True, slots=True)
class FrameHeader:
    length: int
    stream_id: int
    message_type: int
    flags: int


@dataclass(frozen=True, slots=True)
class Frame:
    header: FrameHeader
    data: bytes


@dataclass(frozen=True, slots=True)
class OversizedFrame:
    """A frame whose data exceeds the limit; reported at its header, its data is skipped."""

    header: FrameHeader


def encode_frame(stream_id: int, message_type: int, flags: int, data: bytes) -> bytes:
    """Header plus data; refuses what a receiver must reject."""
    if len(data) > MAX_DATA_LENGTH:
        raise FrameTooLarge(
            f"ttrpc message of {len(data)} bytes exceeds the maximum of {MAX_DATA_LENGTH}"
        )
    if not 0 <= stream_id <= STREAM_ID_MAX:
        raise InvalidStreamId(f"stream id {stream_id} does not fit in uint32")
    return HEADER.pack(len(data), stream_id, message_type, flags) + data


class FrameReader:
    """Cuts a ttrpc byte stream into frames.

    At most one frame (header + 4 MiB) stays buffered between calls; the data of an
    oversized frame is counted off as it arrives and never stored.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._skip = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes buffered towards the next frame."""
        return len(self._buf)

    @property
    def mid_frame(self) -> bool:
        """True when the stream stopped inside a frame (a truncated stream at EOF)."""
        return bool(self._buf) or self._skip > 0

    def feed(self, data: bytes) -> list[Frame | OversizedFrame]:
        view = memoryview(data)
        if self._skip:
            skipped = min(self._skip, len(view))
            self._skip -= skipped
            view = view[skipped:]
        buf = self._buf
        buf += view
        frames: list[Frame | OversizedFrame] = []
        offset = 0
        while len(buf) - offset >= HEADER_LENGTH:
            header = FrameHeader(*HEADER.unpack_from(buf, offset))
            start = offset + HEADER_LENGTH
            if header.length > MAX_DATA_LENGTH:
                frames.append(OversizedFrame(header))
                skipped = min(header.length, len(buf) - start)
                self._skip = header.length - skipped
                offset = start + skipped
                continue
            end = start + header.length
            if end > len(buf):
                break
            frames.append(Frame(header, bytes(buf[start:end])))
            offset = end
        del buf[:offset]
        return frames


# ------------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """A call to serve; answer it with `TTRPCServerConnection.send_response`."""

    stream_id: int
    service: str
    method: str
    payload: bytes
    timeout_nano: int
    metadata: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class RequestRejected:
    """A request the codec already answered with `status` (worth a log line)."""

    stream_id: int
    status: Status


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    """The end of a call we made: the reply payload, or the error status."""

    stream_id: int
    result: bytes | Status


@dataclass(frozen=True, slots=True)
class ResponseDropped:
    """A reply for a stream we are not waiting on (abandoned after a timeout, or bogus)."""

    stream_id: int


ServerEvent = RequestReceived | RequestRejected
ClientEvent = ResponseReceived | ResponseDropped


# ------------------------------------------------------------------------ connections


class _Connection:
    """What both roles share: the frame reader, the outbound queue, the failure latch."""

    _role = "ttrpc"

    def __init__(self) -> None:
        self._reader = FrameReader()
        self._outbound: list[bytes] = []
        self._closed_reason: str | None = None

    @property
    def pending_bytes(self) -> int:
        return self._reader.pending_bytes

    def _read_frames(self, data: bytes) -> list[Frame | OversizedFrame]:
        if self._closed_reason is not None:
            raise ConnectionBroken(
                f"{self._role} connection no longer accepts data: {self._closed_reason}"
            )
        return self._reader.feed(data)

    def _fail(self, exc: ProtocolError) -> None:
        self._closed_reason = str(exc)

    def receive_eof(self) -> None:
        """The logical connection ended; fail if it stopped inside a frame."""
        if self._closed_reason is not None:
            raise ConnectionBroken(
                f"{self._role} connection no longer accepts data: {self._closed_reason}"
            )
        truncated = self._reader.mid_frame
        self._closed_reason = "the connection reached EOF"
        if truncated:
            raise MalformedMessage(f"{self._role} connection closed in the middle of a frame")

    def messages_to_send(self) -> list[bytes]:
        """Return and forget the queued messages, one complete ttrpc frame each.

        Hand each to `Multiplexer.send` separately: the mux sizes its frames per message.
        """
        out = self._outbound
        self._outbound = []
        return out

    def data_to_send(self) -> bytes:
        """Return and forget the queued messages as one byte string (no multiplexer)."""
        return b"".join(self.messages_to_send())


class TTRPCServerConnection(_Connection):
    """The serving side of one ttrpc connection (NRI mux connection 1)."""

    _role = "ttrpc server"

    def __init__(self) -> None:
        super().__init__()
        self._last_stream_id = 0
        self._awaiting: set[int] = set()

    @property
    def awaiting_response(self) -> frozenset[int]:
        """Stream ids of requests handed out and not answered yet."""
        return frozenset(self._awaiting)

    def receive_data(self, data: bytes) -> list[ServerEvent]:
        frames = self._read_frames(data)
        events: list[ServerEvent] = []
        try:
            for frame in frames:
                events.append(self._handle(frame))
        except ProtocolError as exc:
            self._fail(exc)
            raise
        return events

    def send_response(self, stream_id: int, result: bytes | Status) -> None:
        """Answer a request: `result` is the serialized reply message or an error Status.

        Raises `FrameTooLarge` (the request stays open, so an error Status can follow) and
        `InvalidStreamId` for a stream with no request awaiting an answer.
        """
        if stream_id not in self._awaiting:
            raise InvalidStreamId(f"stream {stream_id} has no request awaiting a response")
        if isinstance(result, Status):
            response = _status_response(result)
        else:
            response = ttrpc_pb2.Response(payload=result)
        frame = encode_frame(
            stream_id, MessageType.RESPONSE, 0, response.SerializeToString(deterministic=True)
        )
        self._awaiting.discard(stream_id)
        self._outbound.append(frame)

    def _handle(self, frame: Frame | OversizedFrame) -> ServerEvent:
        header = frame.header
        if isinstance(frame, OversizedFrame):
            return self._reject(
                header.stream_id, StatusCode.RESOURCE_EXHAUSTED, _oversize_text(header.length)
            )
        if header.message_type != MessageType.REQUEST:
            raise UnknownMessageType(
                f"ttrpc server received a {_message_type_name(header.message_type)} message"
                f" on stream {header.stream_id}; only requests are served"
            )
        if header.stream_id % 2 != 1:
            return self._reject(
                header.stream_id,
                StatusCode.INVALID_ARGUMENT,
                "StreamID must be odd for client initiated streams",
            )
        if header.stream_id <= self._last_stream_id:
            return self._reject(
                header.stream_id,
                StatusCode.INVALID_ARGUMENT,
                "StreamID cannot be re-used and must increment",
            )
        self._last_stream_id = header.stream_id
        request = ttrpc_pb2.Request()
        try:
            request.ParseFromString(frame.data)
        except DecodeError as exc:
            return self._reject(
                header.stream_id, StatusCode.INVALID_ARGUMENT, f"unmarshal request error: {exc}"
            )
        self._awaiting.add(header.stream_id)
        return RequestReceived(
            stream_id=header.stream_id,
            service=request.service,
            method=request.method,
            payload=request.payload,
            timeout_nano=request.timeout_nano,
            metadata=tuple((kv.key, kv.value) for kv in request.metadata),
        )

    def _reject(self, stream_id: int, code: StatusCode, message: str) -> RequestRejected:
        status = Status(code, message)
        data = _status_response(status).SerializeToString(deterministic=True)
        self._outbound.append(encode_frame(stream_id, MessageType.RESPONSE, 0, data))
        return RequestRejected(stream_id, status)


class TTRPCClientConnection(_Connection):
    """The calling side of one ttrpc connection (NRI mux connection 2)."""

    _role = "ttrpc client"

    def __init__(self) -> None:
        super().__init__()
        self._next_stream_id = 1
        self._in_flight: set[int] = set()

    @property
    def in_flight(self) -> frozenset[int]:
        """Stream ids of calls sent and not finished (fail these when the socket closes)."""
        return frozenset(self._in_flight)

    def send_request(
        self,
        service: str,
        method: str,
        payload: bytes = b"",
        *,
        timeout_nano: int = 0,
        metadata: Iterable[tuple[str, str]] = (),
    ) -> int:
        """Queue a unary call; return its stream id.

        Like the Go client, the id is used up before the size check, so a refused
        (`FrameTooLarge`) request leaves a gap in the ids on the wire.
        """
        if not 0 <= timeout_nano <= _INT64_MAX:
            raise ValueError(f"timeout_nano {timeout_nano} is outside 0..{_INT64_MAX}")
        stream_id = self._next_stream_id
        if stream_id > STREAM_ID_MAX:
            raise InvalidStreamId("stream ids of this connection are exhausted; reconnect")
        self._next_stream_id += 2
        request = ttrpc_pb2.Request(
            service=service,
            method=method,
            payload=payload,
            timeout_nano=timeout_nano,
            metadata=[ttrpc_pb2.KeyValue(key=k, value=v) for k, v in metadata],
        )
        frame = encode_frame(
            stream_id, MessageType.REQUEST, 0, request.SerializeToString(deterministic=True)
        )
        self._in_flight.add(stream_id)
        self._outbound.append(frame)
        return stream_id

    def abandon(self, stream_id: int) -> None:
        """Stop waiting for a call (local timeout); its late reply becomes `ResponseDropped`."""
        self._in_flight.discard(stream_id)

    def receive_data(self, data: bytes) -> list[ClientEvent]:
        frames = self._read_frames(data)
        events: list[ClientEvent] = []
        try:
            for frame in frames:
                events.append(self._handle(frame))
        except ProtocolError as exc:
            self._fail(exc)
            raise
        return events

    def _handle(self, frame: Frame | OversizedFrame) -> ClientEvent:
        header = frame.header
        if header.message_type != MessageType.RESPONSE:
            raise UnknownMessageType(
                f"ttrpc client received a {_message_type_name(header.message_type)} message"
                f" on stream {header.stream_id}; only responses are expected"
            )
        stream_id = header.stream_id
        if stream_id not in self._in_flight:
            return ResponseDropped(stream_id)
        self._in_flight.discard(stream_id)
        if isinstance(frame, OversizedFrame):
            status = Status(StatusCode.RESOURCE_EXHAUSTED, _oversize_text(header.length))
            return ResponseReceived(stream_id, status)
        response = ttrpc_pb2.Response()
        try:
            response.ParseFromString(frame.data)
        except DecodeError as exc:
            raise MalformedMessage(
                f"undecodable ttrpc response on stream {stream_id}: {exc}"
            ) from exc
        if response.HasField("status") and response.status.code != StatusCode.OK:
            return ResponseReceived(
                stream_id, Status(response.status.code, response.status.message)
            )
        return ResponseReceived(stream_id, response.payload)


def _status_response(status: Status) -> ttrpc_pb2.Response:
    return ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=status.code, message=status.message))
