"""One stream's state on a gRPC server connection (sans-IO)."""

from __future__ import annotations

from dracpu.grpc.events import Metadata
from dracpu.grpc.framing import MessageDecoder

__all__ = ["StreamState"]


class StreamState:
    """An accepted stream: its request so far, and its reply until handed to h2."""

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
