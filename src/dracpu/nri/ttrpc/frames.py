"""ttrpc frames (protocols.md 5.1): the 10-byte header, encoding, and a stream reader.

A frame is a 10-byte header and L data bytes::

    L (uint32 BE) | stream id (uint32 BE) | message type (uint8) | flags (uint8) | data
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

from dracpu.nri.errors import FrameTooLarge, InvalidStreamId

__all__ = [
    "HEADER",
    "HEADER_LENGTH",
    "MAX_DATA_LENGTH",
    "STREAM_ID_MAX",
    "Flag",
    "Frame",
    "FrameHeader",
    "FrameReader",
    "MessageType",
    "OversizedFrame",
    "encode_frame",
    "message_type_name",
    "oversize_text",
]

HEADER: Final = struct.Struct(">IIBB")
HEADER_LENGTH: Final = HEADER.size
MAX_DATA_LENGTH: Final = 4 * 1024 * 1024
STREAM_ID_MAX: Final = 0xFFFF_FFFF


class MessageType(enum.IntEnum):
    REQUEST = 0x01
    RESPONSE = 0x02
    DATA = 0x03


class Flag(enum.IntFlag):
    """Frame flags; unary NRI calls always send 0."""

    REMOTE_CLOSED = 0x01
    REMOTE_OPEN = 0x02
    NO_DATA = 0x04


def oversize_text(length: int) -> str:
    # The Go channel's wording, so logs on both sides read the same.
    return f"message length {length} exceed maximum message size of {MAX_DATA_LENGTH}"


def message_type_name(message_type: int) -> str:
    try:
        return MessageType(message_type).name.lower()
    except ValueError:
        return f"unknown (0x{message_type:02x})"


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
