"""Length-prefixed gRPC messages (protocols.md 1.3), sans-IO.

Each message is a 1-byte compressed flag, a 4-byte big-endian length and the serialized
protobuf. DATA frame boundaries are unrelated to message boundaries, so the decoder keeps
what a stream sent of a message and yields every complete message as soon as its last
byte arrives.
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
    """Bytes in, complete message payloads out. Poisoned by its first error.

    A message that spans several reads is kept as the pieces that arrived and joined once,
    when its last byte does: one allocation of the message's size, where a growing buffer
    reallocated on the way up and copied it twice more at the end (4 MiB requests left
    three times their size to the allocator each). Nothing is kept once a message is out.
    """

    __slots__ = ("_error", "_have", "_max_size", "_need", "_pieces", "_prefix")

    def __init__(self, max_size: int = MAX_MESSAGE_SIZE) -> None:
        self._max_size = max_size
        self._error: FramingError | None = None
        self._prefix = b""  # an incomplete prefix
        self._need = -1  # the body length of the message under way; -1 while in a prefix
        self._pieces: list[bytes] = []
        self._have = 0  # body bytes in _pieces

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete message held back."""
        return len(self._prefix) + self._have + (PREFIX_SIZE if self._need >= 0 else 0)

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return the messages they complete, in order."""
        if self._error is not None:
            raise self._error
        if self._need < 0 and not self._prefix and len(data) >= PREFIX_SIZE:
            # Common case (a unary request in one DATA frame): no copies.
            flag, length = PREFIX.unpack_from(data)
            if len(data) == PREFIX_SIZE + length:
                self._check_prefix(flag, length)
                return [data[PREFIX_SIZE:]]
        messages: list[bytes] = []
        view = memoryview(data)
        while view:
            if self._need < 0:
                take = PREFIX_SIZE - len(self._prefix)
                self._prefix += view[:take]
                view = view[take:]
                if len(self._prefix) < PREFIX_SIZE:
                    break
                flag, length = PREFIX.unpack(self._prefix)
                self._prefix = b""
                self._check_prefix(flag, length)
                self._need = length
            take = self._need - self._have
            if take and view:
                piece = view[:take]
                view = view[len(piece) :]
                # A read that is all body is kept as it is, not copied.
                self._pieces.append(data if len(piece) == len(data) else bytes(piece))
                self._have += len(piece)
            if self._have == self._need:
                pieces = self._pieces
                messages.append(pieces[0] if len(pieces) == 1 else b"".join(pieces))
                self._pieces, self._have, self._need = [], 0, -1
        return messages

    def finish(self) -> None:
        """The stream ended: a partial message left in the buffer is an error."""
        if self._error is not None:
            raise self._error
        if self._need >= 0:
            detail = f"{self._have} of {self._need} bytes"
        elif self._prefix:
            detail = f"{len(self._prefix)} of {PREFIX_SIZE} prefix bytes"
        else:
            return
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
        self._prefix, self._pieces, self._have, self._need = b"", [], 0, -1
        self._error = FramingError(status, message)
        raise self._error
