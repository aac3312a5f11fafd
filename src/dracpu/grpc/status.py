"""gRPC status trailers and ``grpc-message`` percent-encoding (protocols.md 1.4, 1.5).

Everything the server puts in a header goes through here, so this is where outbound
header values are bounded: a ``grpc-message`` is valid UTF-8, percent-encoded as gRPC's
PROTOCOL-HTTP2.md defines it (every byte outside 0x20-0x7E, and '%', becomes ``%XX``), and
at most ``MAX_STATUS_MESSAGE`` bytes once encoded. Error texts can quote request fields of
any size (a claim name is up to 4 MiB of a request message); a header that size cost
minutes of CPU in the HPACK encoder, and clients would not take it anyway:
PROTOCOL-HTTP2.md suggests they limit trailers to 8 KiB, and grpcio fails a call whose
trailers pass its 16 KiB hard limit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from grpclib.const import Status

Headers = list[tuple[bytes, bytes]]

# Encoded bytes of one grpc-message: the whole Trailers-Only block stays well under the
# 8 KiB that PROTOCOL-HTTP2.md suggests clients accept.
MAX_STATUS_MESSAGE = 4096
# Bytes that must be escaped: everything except printable ASCII, and '%' itself.
_UNSAFE = re.compile(rb"[^\x20-\x24\x26-\x7e]")
_NOT_PRINTABLE = re.compile(rb"[^\x20-\x7e]")
_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")
_ESCAPED = [b"%%%02X" % b for b in range(256)]
_PERCENT = 0x25

RESPONSE_HEADERS: Headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]


def _escape(raw: bytes) -> bytes:
    if _UNSAFE.search(raw) is None:
        return raw
    return _UNSAFE.sub(lambda m: _ESCAPED[m[0][0]], raw)


def _whole_prefix(encoded: bytes, size: int) -> bytes:
    """The longest prefix of at most ``size`` bytes that ends between escapes and between
    UTF-8 characters (so that it still decodes to valid UTF-8)."""
    cut = min(size, len(encoded))
    # Not inside an escape: a '%' in the last two kept bytes starts a cut escape.
    pct = encoded.rfind(b"%", max(0, cut - 2), cut)
    if pct != -1:
        cut = pct
    # Not inside a multi-byte character. Its bytes are all >= 0x80, so all escaped: walk
    # back over escaped continuation bytes to the lead byte and count what is kept.
    back = cut
    while back >= 3 and encoded[back - 3] == _PERCENT:
        byte = int(encoded[back - 2 : back], 16)
        if byte & 0xC0 != 0x80:
            if byte >= 0xC0:
                need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
                if (cut - back) // 3 + 1 < need:
                    cut = back - 3
            break
        back -= 3
    return encoded[:cut]


def encode_grpc_message(text: str, limit: int = MAX_STATUS_MESSAGE) -> bytes:
    """UTF-8 text -> header value: %XX escapes as gRPC defines them, at most ``limit`` bytes.

    Linear in ``limit``, not in the text: a longer text is cut (on a character boundary)
    and ends with a note saying so. Lone surrogates, which have no UTF-8 form, become '?'.
    """
    # Every character takes at least one byte, so nothing past `limit` characters can be
    # kept; the rest of a huge text is never encoded or scanned.
    head = text[: limit + 1]
    return _bounded(head, len(head) == len(text), f"{len(text)} characters", limit)


def bounded_header_value(value: bytes, limit: int = MAX_STATUS_MESSAGE) -> bytes:
    """Any outbound header value as a valid one: printable ASCII, at most ``limit`` bytes.

    Values built by this module already are; this is the check every HEADERS frame the
    server sends goes through, and costs one regular-expression scan when nothing is wrong.
    Anything else is treated as a grpc-message: UTF-8 (invalid bytes replaced), escaped, cut.
    """
    if len(value) <= limit and _NOT_PRINTABLE.search(value) is None:
        return value
    head = value[: limit + 1]
    text = head.decode("utf-8", errors="replace")
    return _bounded(text, len(head) == len(value), f"{len(value)} bytes", limit)


def checked_headers(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """What the server sends, each value through ``bounded_header_value``."""
    return [(name, bounded_header_value(value)) for name, value in headers]


def _bounded(head: str, complete: bool, total: str, limit: int) -> bytes:
    encoded = _escape(head.encode("utf-8", errors="replace"))
    if complete and len(encoded) <= limit:
        return encoded
    note = f" [truncated; {total} in all]".encode()
    if len(note) > limit:
        return _whole_prefix(encoded, limit)
    return _whole_prefix(encoded, limit - len(note)) + note


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
