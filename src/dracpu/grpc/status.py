"""gRPC status trailers and ``grpc-message`` percent-encoding (protocols.md 1.4, 1.5)."""

from __future__ import annotations

import re

from grpclib.const import Status

Headers = list[tuple[bytes, bytes]]

# Bytes that travel literally in grpc-message: printable ASCII except '%'.
_PLAIN = frozenset(range(0x20, 0x7F)) - {0x25}
_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")
_ESCAPED = [b"%%%02X" % b for b in range(256)]

RESPONSE_HEADERS: Headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]


def encode_grpc_message(text: str) -> bytes:
    """UTF-8 text -> header value, every byte outside 0x20-0x7E and '%' as %XX (uppercase)."""
    raw = text.encode("utf-8", errors="surrogatepass")
    if all(b in _PLAIN for b in raw):
        return raw
    return b"".join(bytes((b,)) if b in _PLAIN else _ESCAPED[b] for b in raw)


def decode_grpc_message(value: bytes) -> str:
    """Header value -> text; broken escapes are kept literally, invalid UTF-8 replaced."""
    raw = _ESCAPE.sub(lambda m: bytes((int(m.group(1), 16),)), value)
    return raw.decode("utf-8", errors="replace")


def status_trailers(status: Status, message: str = "") -> Headers:
    """The trailers block that ends a response whose headers were already sent."""
    trailers = [(b"grpc-status", str(status.value).encode("ascii"))]
    if message:
        trailers.append((b"grpc-message", encode_grpc_message(message)))
    return trailers


def trailers_only(status: Status, message: str = "") -> Headers:
    """A complete response in one HEADERS block: used for errors before any reply."""
    return [*RESPONSE_HEADERS, *status_trailers(status, message)]


def http_error(http_status: int, message: str) -> Headers:
    """A non-200 response (e.g. 415) that grpc clients still map to a gRPC status."""
    return [
        (b":status", str(http_status).encode("ascii")),
        (b"content-type", b"application/grpc"),
        *status_trailers(Status.INTERNAL, message),
    ]
