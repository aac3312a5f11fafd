"""What a gRPC server connection hands to its shell, and request metadata (sans-IO).

``GRPCServerConnection.receive_data`` returns these events; ``decode_metadata`` turns a
request's header list into the custom metadata a handler sees.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

__all__ = [
    "ConnectionClosed",
    "Event",
    "Metadata",
    "RequestReceived",
    "StreamAborted",
    "decode_metadata",
]

Metadata = tuple[tuple[str, str | bytes], ...]

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
