"""ttrpc connections, sans-IO: a server and a client for unary calls (protocols.md 5.2-5.4).

Each takes bytes (``receive_data``) and returns event objects, and queues the bytes to
send; see the package docstring for what each role does with each kind of frame.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from google.protobuf.message import DecodeError

from dracpu.nri.errors import (
    ConnectionBroken,
    InvalidStreamId,
    MalformedMessage,
    ProtocolError,
    UnknownMessageType,
)
from dracpu.nri.ttrpc.frames import (
    STREAM_ID_MAX,
    Frame,
    FrameReader,
    MessageType,
    OversizedFrame,
    encode_frame,
    message_type_name,
    oversize_text,
)
from dracpu.nri.ttrpc.status import Status, StatusCode, status_response
from dracpu.proto.nri import ttrpc_pb2

__all__ = [
    "ClientEvent",
    "RequestReceived",
    "RequestRejected",
    "ResponseDropped",
    "ResponseReceived",
    "ServerEvent",
    "TTRPCClientConnection",
    "TTRPCServerConnection",
]

_INT64_MAX: Final = 2**63 - 1


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


EventT = TypeVar("EventT", ServerEvent, ClientEvent)


class _Connection(Generic[EventT]):
    """What both roles share: the frame reader, the outbound queue, the failure latch, and
    turning inbound frames into the role's events (``_handle``)."""

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

    def receive_data(self, data: bytes) -> list[EventT]:
        """Events for the frames these bytes complete; a protocol error ends the connection."""
        frames = self._read_frames(data)
        events: list[EventT] = []
        try:
            for frame in frames:
                events.append(self._handle(frame))
        except ProtocolError as exc:
            self._fail(exc)
            raise
        return events

    def _handle(self, frame: Frame | OversizedFrame) -> EventT:
        raise NotImplementedError

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


class TTRPCServerConnection(_Connection[ServerEvent]):
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

    def send_response(self, stream_id: int, result: bytes | Status) -> None:
        """Answer a request: `result` is the serialized reply message or an error Status.

        Raises `FrameTooLarge` (the request stays open, so an error Status can follow) and
        `InvalidStreamId` for a stream with no request awaiting an answer.
        """
        if stream_id not in self._awaiting:
            raise InvalidStreamId(f"stream {stream_id} has no request awaiting a response")
        if isinstance(result, Status):
            response = status_response(result)
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
                header.stream_id, StatusCode.RESOURCE_EXHAUSTED, oversize_text(header.length)
            )
        if header.message_type != MessageType.REQUEST:
            raise UnknownMessageType(
                f"ttrpc server received a {message_type_name(header.message_type)} message"
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
        data = status_response(status).SerializeToString(deterministic=True)
        self._outbound.append(encode_frame(stream_id, MessageType.RESPONSE, 0, data))
        return RequestRejected(stream_id, status)


class TTRPCClientConnection(_Connection[ClientEvent]):
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

    def _handle(self, frame: Frame | OversizedFrame) -> ClientEvent:
        header = frame.header
        if header.message_type != MessageType.RESPONSE:
            raise UnknownMessageType(
                f"ttrpc client received a {message_type_name(header.message_type)} message"
                f" on stream {header.stream_id}; only responses are expected"
            )
        stream_id = header.stream_id
        if stream_id not in self._in_flight:
            return ResponseDropped(stream_id)
        self._in_flight.discard(stream_id)
        if isinstance(frame, OversizedFrame):
            status = Status(StatusCode.RESOURCE_EXHAUSTED, oversize_text(header.length))
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
