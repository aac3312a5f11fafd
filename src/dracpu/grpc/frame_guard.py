"""Frame boundaries of a gRPC server's inbound h2 bytes, read ahead of h2 (sans-IO).

Hostile input must cost bounded CPU and memory per byte. ``FrameGuard`` reads each 9-byte
frame header (RFC 9113 4.1: 24-bit length, type, flags, 31-bit stream id) before h2 sees
the frame, so an oversized frame or request header block is refused before it is buffered
or HPACK-decoded, and it measures the work of each step so that
``GRPCServerConnection.receive_data(..., budget=...)`` can stop after a bounded amount and
let the shell run other connections between slices of one large read.
"""

from __future__ import annotations

from dataclasses import dataclass

from dracpu.grpc.limits import HEADER_BYTES_PER_UNIT, HEADERS_FRAME_UNITS

__all__ = ["FrameGuard", "Refused"]


@dataclass(frozen=True, slots=True)
class Refused:
    """A frame or header block over its limit, seen from a frame header."""

    what: str  # "frame" or "header block"
    stream_id: int
    size: int
    limit: int


# Frame types HEADERS and CONTINUATION, and the END_HEADERS flag (RFC 9113 6.2, 6.10).
_HEADERS_FRAME, _CONTINUATION_FRAME, _END_HEADERS = 0x1, 0x9, 0x4


class FrameGuard:
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

    def scan(self, data: memoryview, budget: int | None) -> tuple[int, Refused | None]:
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
                return i, Refused("frame", stream_id, length, self.max_frame_size)
            work += 1
            if kind in (_HEADERS_FRAME, _CONTINUATION_FRAME):
                if kind == _HEADERS_FRAME:
                    self._block, self._block_stream = 0, stream_id
                    work += HEADERS_FRAME_UNITS - 1
                self._block += length
                if self._block > self.max_header_block:
                    refused = Refused(
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
