"""Length-prefixed message codec: golden bytes, partial frames, errors, fuzzing."""

from __future__ import annotations

import os

import pytest
from grpclib.const import Status
from hypothesis import given, settings
from hypothesis import strategies as st

from dracpu.grpc.errors import FramingError
from dracpu.grpc.framing import MAX_MESSAGE_SIZE, MessageDecoder, encode_message


def examples(default: int) -> int:
    """``FUZZ_EXAMPLES`` raises the example count for long runs; CI uses ``default``."""
    raw = os.environ.get("FUZZ_EXAMPLES", "").strip()
    return int(raw) if raw else default


def test_encode_golden_bytes() -> None:
    assert encode_message(b"") == b"\x00\x00\x00\x00\x00"
    assert encode_message(b"\x0a\x03abc") == b"\x00\x00\x00\x00\x05\x0a\x03abc"
    assert encode_message(b"x" * 300)[:5] == b"\x00\x00\x00\x01\x2c"


def test_decode_single_and_several_messages() -> None:
    dec = MessageDecoder()
    assert dec.feed(b"\x00\x00\x00\x00\x00") == [b""]
    assert dec.feed(b"\x00\x00\x00\x00\x01A\x00\x00\x00\x00\x02BC") == [b"A", b"BC"]
    assert dec.buffered == 0
    dec.finish()


def test_decode_buffers_partial_frames_byte_by_byte() -> None:
    dec = MessageDecoder()
    wire = encode_message(b"hello") + encode_message(b"!")
    out: list[bytes] = []
    for i in range(len(wire)):
        out += dec.feed(wire[i : i + 1])
        if i < 9:
            assert out == []
    assert out == [b"hello", b"!"]


def test_compressed_flag_is_unimplemented() -> None:
    with pytest.raises(FramingError) as info:
        MessageDecoder().feed(b"\x01\x00\x00\x00\x00")
    assert (info.value.status, info.value.message) == (
        Status.UNIMPLEMENTED,
        "compressed request messages are not supported",
    )


def test_invalid_flag_is_internal() -> None:
    with pytest.raises(FramingError) as info:
        MessageDecoder().feed(b"\x07\x00\x00\x00\x00")
    assert (info.value.status, info.value.message) == (
        Status.INTERNAL,
        "invalid compressed flag 0x07",
    )


def test_oversized_message_rejected_from_prefix_alone() -> None:
    dec = MessageDecoder()
    with pytest.raises(FramingError) as info:
        dec.feed(b"\x00\x00\x40\x00\x01")  # 4 MiB + 1, no body yet
    assert info.value.status is Status.RESOURCE_EXHAUSTED
    assert info.value.message == "received message larger than max (4194305 vs. 4194304)"
    assert dec.buffered == 0


def test_exactly_max_size_accepted() -> None:
    payload = b"\x00" * MAX_MESSAGE_SIZE
    assert MessageDecoder().feed(encode_message(payload)) == [payload]


def test_decoder_stays_failed() -> None:
    dec = MessageDecoder(max_size=3)
    with pytest.raises(FramingError):
        dec.feed(encode_message(b"toolong"))
    with pytest.raises(FramingError, match="larger than max"):
        dec.feed(encode_message(b"ok"))


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"\x00\x00", "request ended inside a message (2 of 5 prefix bytes)"),
        (b"\x00\x00\x00\x00\x04ab", "request ended inside a message (2 of 4 bytes)"),
    ],
)
def test_finish_inside_message(wire: bytes, message: str) -> None:
    dec = MessageDecoder()
    assert dec.feed(wire) == []
    with pytest.raises(FramingError) as info:
        dec.finish()
    assert (info.value.status, info.value.message) == (Status.INTERNAL, message)


@given(st.lists(st.binary(max_size=64), max_size=8), st.data())
def test_roundtrip_any_chunking(payloads: list[bytes], data: st.DataObject) -> None:
    wire = b"".join(encode_message(p) for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=10)))
    dec = MessageDecoder()
    out: list[bytes] = []
    prev = 0
    for cut in [*cuts, len(wire)]:
        out += dec.feed(wire[prev:cut])
        prev = cut
    dec.finish()
    assert out == payloads


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=6))
def test_fuzz_arbitrary_bytes_only_framing_errors(chunks: list[bytes]) -> None:
    dec = MessageDecoder(max_size=32)
    try:
        for chunk in chunks:
            for msg in dec.feed(chunk):
                assert len(msg) <= 32
        dec.finish()
    except FramingError as exc:
        assert exc.status in (Status.UNIMPLEMENTED, Status.INTERNAL, Status.RESOURCE_EXHAUSTED)
