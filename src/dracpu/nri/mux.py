"""The NRI socket multiplexer (protocols.md 6.2), sans-IO.

One unix socket carries several logical byte streams. Each chunk on the socket is a frame::

    conn id (uint32 BE) | payload length P (uint32 BE) | P payload bytes

Connection 1 carries the ttrpc conversation in which the plugin (us) is the server; connection
2 the one in which the runtime is the server. There is no open/close signalling, and frames
for connection ids nobody uses are dropped.

Outbound sizing is a hard rule of the Go peer: it reads each logical connection through a
4096-byte buffered reader, and a frame that does not fit the buffer it reads into kills the
connection. So every ttrpc message is sent as Go's own 4096-byte buffered writer would send it:
one frame if it fits in 4096 bytes, otherwise a first frame of exactly 4096 bytes and one
frame with the rest. That is why `send` takes exactly one ttrpc message per call.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from dracpu.nri.errors import ConnectionBroken, MuxProtocolError

HEADER: Final = struct.Struct(">II")
HEADER_LENGTH: Final = HEADER.size

PLUGIN_SERVICE_CONN: Final = 1
"""Logical connection on which the runtime calls the plugin (we serve ttrpc here)."""
RUNTIME_SERVICE_CONN: Final = 2
"""Logical connection on which the plugin calls the runtime (we are the ttrpc client)."""

FIRST_FRAME_MAX: Final = 4096
"""Largest first frame of one message: the Go reader's buffer size."""
MAX_FRAME_PAYLOAD: Final = 10 + 4 * 1024 * 1024
"""Largest payload accepted in one frame: a whole maximal ttrpc message (header + 4 MiB)."""
CONN_ID_MAX: Final = 0xFFFF_FFFF


@dataclass(frozen=True, slots=True)
class MuxData:
    """Bytes of logical connection `conn_id`; concatenate them to get its byte stream."""

    conn_id: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class MuxFrameDropped:
    """A frame for a connection id nobody uses was skipped (worth a debug log line)."""

    conn_id: int
    length: int


MuxEvent = MuxData | MuxFrameDropped


def _check_conn_id(conn_id: int) -> None:
    if not 1 <= conn_id <= CONN_ID_MAX:
        raise MuxProtocolError(f"connection id {conn_id} is outside 1..{CONN_ID_MAX}")


def frame_message(conn_id: int, message: bytes) -> list[bytes]:
    """Mux frames carrying one ttrpc message on `conn_id`, sized as a Go writer sizes them."""
    _check_conn_id(conn_id)
    if not message:
        return []
    if len(message) <= FIRST_FRAME_MAX:
        chunks = [message]
    else:
        # After the 4096-byte first frame the Go reader reads the remainder of the message
        # straight into a buffer of exactly that size, so the rest goes as one frame (split
        # further only if it is larger than anything a reader accepts).
        chunks = [message[:FIRST_FRAME_MAX]]
        chunks += [
            message[start : start + MAX_FRAME_PAYLOAD]
            for start in range(FIRST_FRAME_MAX, len(message), MAX_FRAME_PAYLOAD)
        ]
    return [HEADER.pack(conn_id, len(chunk)) + chunk for chunk in chunks]


class Multiplexer:
    """Splits the socket byte stream into per-connection payloads, and frames outbound ones.

    Inbound buffering is bounded: at most one frame header plus `MAX_FRAME_PAYLOAD` bytes stay
    pending between calls; a header announcing more fails at once.
    """

    def __init__(
        self, conn_ids: Iterable[int] = (PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN)
    ) -> None:
        ids = frozenset(conn_ids)
        for conn_id in ids:
            _check_conn_id(conn_id)
        self._conn_ids = ids
        self._inbound = bytearray()
        self._outbound = bytearray()
        self._closed_reason: str | None = None

    @property
    def pending_bytes(self) -> int:
        """Received bytes waiting for the rest of their frame."""
        return len(self._inbound)

    def receive_data(self, data: bytes) -> list[MuxEvent]:
        """Feed bytes read from the socket; return the frames they complete."""
        if self._closed_reason is not None:
            raise ConnectionBroken(f"multiplexer no longer accepts data: {self._closed_reason}")
        buf = self._inbound
        buf += data
        events: list[MuxEvent] = []
        offset = 0
        try:
            while len(buf) - offset >= HEADER_LENGTH:
                conn_id, length = HEADER.unpack_from(buf, offset)
                if length > MAX_FRAME_PAYLOAD:
                    raise MuxProtocolError(
                        f"mux frame for connection {conn_id} announces {length} bytes,"
                        f" more than the maximum of {MAX_FRAME_PAYLOAD}"
                    )
                end = offset + HEADER_LENGTH + length
                if end > len(buf):
                    break
                if conn_id not in self._conn_ids:
                    events.append(MuxFrameDropped(conn_id, length))
                elif length:
                    events.append(MuxData(conn_id, bytes(buf[offset + HEADER_LENGTH : end])))
                offset = end
        except MuxProtocolError as exc:
            self._closed_reason = str(exc)
            buf.clear()
            raise
        del buf[:offset]
        return events

    def receive_eof(self) -> None:
        """The socket reached EOF; fail if it stopped in the middle of a frame."""
        if self._closed_reason is not None:
            raise ConnectionBroken(f"multiplexer no longer accepts data: {self._closed_reason}")
        pending = len(self._inbound)
        self._closed_reason = "the socket reached EOF"
        if pending:
            self._inbound.clear()
            raise MuxProtocolError(f"socket closed in the middle of a mux frame ({pending} bytes)")

    def send(self, conn_id: int, message: bytes) -> None:
        """Queue one whole ttrpc message (header and data) for logical connection `conn_id`."""
        for frame in frame_message(conn_id, message):
            self._outbound += frame

    def data_to_send(self) -> bytes:
        """Return and forget everything queued for the socket."""
        out = bytes(self._outbound)
        self._outbound.clear()
        return out
