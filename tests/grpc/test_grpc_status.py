"""grpc-message percent-encoding, trailers and grpc-timeout parsing."""

from __future__ import annotations

import time

import pytest
from grpclib.const import Status
from hypothesis import given
from hypothesis import strategies as st

from dracpu.grpc.errors import TimeoutHeaderError
from dracpu.grpc.status import (
    MAX_STATUS_MESSAGE,
    bounded_header_value,
    decode_grpc_message,
    encode_grpc_message,
    http_error,
    status_trailers,
    trailers_only,
)
from dracpu.grpc.timeout import parse_grpc_timeout


def test_encode_golden() -> None:
    assert encode_grpc_message("bad: 100% ünï\n") == b"bad: 100%25 %C3%BCn%C3%AF%0A"
    assert encode_grpc_message("plain text ~") == b"plain text ~"
    assert encode_grpc_message("\x7f\x00") == b"%7F%00"


def test_encode_golden_lone_surrogate_and_limit() -> None:
    # A lone surrogate has no UTF-8 form: '?' keeps the value valid UTF-8.
    assert encode_grpc_message("\ud800x") == b"?x"
    assert encode_grpc_message("x" * 16, limit=16) == b"x" * 16
    # A limit too small for the note: just the whole characters that fit.
    assert encode_grpc_message("x" * 17, limit=16) == b"x" * 16
    assert encode_grpc_message("\u00fc" * 10, limit=4) == b""


NOTE_112 = b" [truncated; 112 characters in all]"


@pytest.mark.parametrize(
    ("text", "keep", "expected"),
    [
        # Cut inside an escape: the partial %XX is dropped.
        ("a" * 10 + "%" * 102, 12, b"a" * 10),
        # Cut inside a 2-byte character (%C3 of %C3%BC kept alone would be invalid UTF-8).
        ("ab" + "\u00fc" * 110, 2 + 6 + 3, b"ab%C3%BC"),
        # Cut inside a 4-byte character, after three of its four bytes.
        ("ab" + "\U0001f600" * 110, 2 + 12 + 9, b"ab%F0%9F%98%80"),
        # Cut right after a whole character.
        ("ab" + "\u00fc" * 110, 2 + 6, b"ab%C3%BC"),
    ],
)
def test_encode_truncates_on_whole_escapes_and_characters(
    text: str, keep: int, expected: bytes
) -> None:
    encoded = encode_grpc_message(text, limit=keep + len(NOTE_112))
    assert encoded == expected + NOTE_112
    decode_grpc_message(encoded).encode("utf-8", errors="strict")


def test_encode_long_message_golden() -> None:
    assert encode_grpc_message("x" * 5000, limit=64) == (
        b"x" * 28 + b" [truncated; 5000 characters in all]"
    )
    # The default limit keeps the whole Trailers-Only block far below the 8 KiB that
    # PROTOCOL-HTTP2.md suggests clients accept.
    encoded = encode_grpc_message("claim default/" + "n" * 10_000)
    assert len(encoded) == MAX_STATUS_MESSAGE
    assert encoded.startswith(b"claim default/nnnn")
    assert encoded.endswith(b"nnn [truncated; 10014 characters in all]")


def test_encode_cost_does_not_grow_with_the_text() -> None:
    # An 8 MiB text (a 4 MiB claim name, twice) costs what 4 KiB does; the whole of it is
    # never even scanned.
    huge = "\u00fc" * (8 * 1024 * 1024)
    started = time.thread_time()
    encoded = encode_grpc_message(huge)
    assert time.thread_time() - started < 0.05
    assert len(encoded) <= MAX_STATUS_MESSAGE
    assert encoded.startswith(b"%C3%BC%C3%BC")


def test_bounded_header_value_golden() -> None:
    assert bounded_header_value(b"application/grpc") == b"application/grpc"
    assert bounded_header_value(b"100%") == b"100%"  # printable: left alone
    assert bounded_header_value(b"bad\r\nx") == b"bad%0D%0Ax"
    assert bounded_header_value(b"\xff\xfe") == b"%EF%BF%BD%EF%BF%BD"
    long = bounded_header_value(b"v" * 5000)
    assert len(long) == MAX_STATUS_MESSAGE
    assert long.endswith(b"vvv [truncated; 5000 bytes in all]")


def test_decode_golden_and_broken_escapes() -> None:
    assert decode_grpc_message(b"bad: 100%25 %C3%BCn%C3%AF%0A") == "bad: 100% ünï\n"
    assert decode_grpc_message(b"%c3%bc") == "ü"
    assert decode_grpc_message(b"100% sure %G1 %4") == "100% sure %G1 %4"
    assert decode_grpc_message(b"%FF") == "\ufffd"


@given(st.text())
def test_roundtrip(text: str) -> None:
    encoded = encode_grpc_message(text)
    assert all(0x20 <= b <= 0x7E for b in encoded)
    if all(not 0xD800 <= ord(c) <= 0xDFFF for c in text):
        assert decode_grpc_message(encoded) == text


@given(st.text(), st.integers(0, 200))
def test_any_text_any_limit_gives_a_valid_bounded_value(text: str, limit: int) -> None:
    encoded = encode_grpc_message(text, limit=limit)
    assert len(encoded) <= limit
    assert all(0x20 <= b <= 0x7E for b in encoded)
    decoded = decode_grpc_message(encoded)
    decoded.encode("utf-8", errors="strict")
    # What is kept is a prefix of the text (lone surrogates aside, which become '?').
    if all(not 0xD800 <= ord(c) <= 0xDFFF for c in text):
        kept = decoded.split(" [truncated; ", 1)[0]
        assert text.startswith(kept)


def test_trailers() -> None:
    assert status_trailers(Status.OK) == [(b"grpc-status", b"0")]
    assert status_trailers(Status.UNIMPLEMENTED, "unknown service x.Y") == [
        (b"grpc-status", b"12"),
        (b"grpc-message", b"unknown service x.Y"),
    ]
    assert trailers_only(Status.INTERNAL, "ü") == [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", b"13"),
        (b"grpc-message", b"%C3%BC"),
    ]
    assert http_error(415, "x") == [
        (b":status", b"415"),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", b"13"),
        (b"grpc-message", b"x"),
    ]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"44999987u", 44.999987),
        (b"999975u", 0.999975),
        (b"1H", 3600.0),
        (b"2M", 120.0),
        (b"99999999S", 99999999.0),
        (b"250m", 0.25),
        (b"5n", 5e-9),
        (b"0S", 0.0),
    ],
)
def test_parse_timeout(value: bytes, seconds: float) -> None:
    assert parse_grpc_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (b"", "''"),
        (b"123456789S", "'123456789S'"),
        (b"10s", "'10s'"),
        (b"S", "'S'"),
        (b"-1S", "'-1S'"),
        (b" 1S", "' 1S'"),
        (b"1S\n", "'1S\\n'"),
        (b"1\xffS", "'1\\\\xffS'"),
    ],
)
def test_parse_timeout_rejects(value: bytes, shown: str) -> None:
    with pytest.raises(TimeoutHeaderError) as info:
        parse_grpc_timeout(value)
    assert info.value.status is Status.INVALID_ARGUMENT
    assert info.value.message == f"invalid grpc-timeout: {shown}"
