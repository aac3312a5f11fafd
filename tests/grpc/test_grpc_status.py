"""grpc-message percent-encoding, trailers and grpc-timeout parsing."""

from __future__ import annotations

import pytest
from grpclib.const import Status
from hypothesis import given
from hypothesis import strategies as st

from dracpu.grpc.errors import TimeoutHeaderError
from dracpu.grpc.status import (
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
