"""Length-prefixed gRPC messages (protocols.md 1.3), sans-IO.

Each message is a 1-byte compressed flag, a 4-byte big-endian length and the serialized
protobuf. DATA frame boundaries are unrelated to message boundaries, so the decoder keeps
a per-stream buffer and yields every complete message as soon as its last byte arrives.
"""

from __future__ import annotations

import struct

from grpclib.const import Status

from dracpu.grpc.errors import FramingError

MAX_MESSAGE_SIZE = 4 * 1024 * 1024  # grpc-go's default receive limit
PREFIX = struct.Struct(">BI")
PREFIX_SIZE = PREFIX.size


def encode_message(payload: bytes) -> bytes:
    """One uncompressed length-prefixed message (we never compress replies)."""
    return PREFIX.pack(0, len(payload)) + payload


class MessageDecoder:
    """Bytes in, complete message payloads out. Poisoned by its first error."""

    __slots__ = ("_buffer", "_error", "_max_size")

    def __init__(self, max_size: int = MAX_MESSAGE_SIZE) -> None:
        self._buffer = bytearray()
        self._max_size = max_size
        self._error: FramingError | None = None

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete message held back."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return the messages they complete, in order."""
        if self._error is not None:
            raise self._error
        buf = self._buffer
        if not buf and len(data) >= PREFIX_SIZE:
            # Common case (a unary request in one DATA frame): no buffer copies.
            flag, length = PREFIX.unpack_from(data)
            if len(data) == PREFIX_SIZE + length:
                self._check_prefix(flag, length)
                return [data[PREFIX_SIZE:]]
        buf += data
        messages: list[bytes] = []
        offset = 0
        while len(buf) - offset >= PREFIX_SIZE:
            flag, length = PREFIX.unpack_from(buf, offset)
            self._check_prefix(flag, length)
            end = offset + PREFIX_SIZE + length
            if end > len(buf):
                break
            messages.append(bytes(buf[offset + PREFIX_SIZE : end]))
            offset = end
        del buf[:offset]
        return messages

    def finish(self) -> None:
        """The stream ended: a partial message left in the buffer is an error."""
        if self._error is not None:
            raise self._error
        if not self._buffer:
            return
        if len(self._buffer) < PREFIX_SIZE:
            detail = f"{len(self._buffer)} of {PREFIX_SIZE} prefix bytes"
        else:
            _, length = PREFIX.unpack_from(self._buffer)
            detail = f"{len(self._buffer) - PREFIX_SIZE} of {length} bytes"
        self._fail(Status.INTERNAL, f"request ended inside a message ({detail})")

    def _check_prefix(self, flag: int, length: int) -> None:
        # Checked as soon as the prefix is complete, so an oversized message is
        # rejected before any of its body is buffered.
        if flag == 1:
            self._fail(Status.UNIMPLEMENTED, "compressed request messages are not supported")
        if flag != 0:
            self._fail(Status.INTERNAL, f"invalid compressed flag {flag:#04x}")
        if length > self._max_size:
            self._fail(
                Status.RESOURCE_EXHAUSTED,
                f"received message larger than max ({length} vs. {self._max_size})",
            )

    def _fail(self, status: Status, message: str) -> None:
        self._buffer.clear()
        self._error = FramingError(status, message)
        raise self._error
