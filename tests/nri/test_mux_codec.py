"""NRI multiplexer: frame layout, outbound sizing rule, reassembly, bad input, fuzzing."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dracpu.nri.errors import ConnectionBroken, MuxProtocolError, ProtocolError
from dracpu.nri.mux import (
    MAX_FRAME_PAYLOAD,
    Multiplexer,
    MuxData,
    MuxEvent,
    MuxFrameDropped,
    frame_message,
)

# protocols.md 5.5: the RegisterPlugin ttrpc frame (10-byte header + 74-byte Request).
REGISTER_PLUGIN_FRAME = bytes.fromhex(
    "0000004a 00000001 01 00"
    "0a1c 6e72692e706b672e6170692e7631616c706861312e52756e74696d65"
    "120e 5265676973746572506c7567696e"
    "1a14 0a0e 6578616d706c652d706c7567696e 1202 3130"
    "2080a8d6b907"
)


def examples(default: int) -> int:
    """``FUZZ_EXAMPLES`` raises the example count for long runs; CI uses ``default``."""
    raw = os.environ.get("FUZZ_EXAMPLES", "").strip()
    return int(raw) if raw else default


def test_register_plugin_golden_vector() -> None:
    # protocols.md 6.2: conn 2 carrying the 84-byte frame -> 00 00 00 02 00 00 00 54 + frame.
    assert len(REGISTER_PLUGIN_FRAME) == 84
    mux = Multiplexer()
    mux.send(2, REGISTER_PLUGIN_FRAME)
    assert mux.data_to_send() == bytes.fromhex("00000002 00000054") + REGISTER_PLUGIN_FRAME
    assert mux.data_to_send() == b""


def test_receive_golden_vector() -> None:
    mux = Multiplexer()
    wire = bytes.fromhex("00000002 00000054") + REGISTER_PLUGIN_FRAME
    assert mux.receive_data(wire) == [MuxData(2, REGISTER_PLUGIN_FRAME)]
    assert mux.pending_bytes == 0


@pytest.mark.parametrize(
    ("size", "frame_sizes"),
    [
        (1, [1]),
        (4095, [4095]),
        (4096, [4096]),
        (4097, [4096, 1]),
        (8700, [4096, 4604]),
        # The largest ttrpc message: header + 4 MiB of data.
        (10 + 4 * 1024 * 1024, [4096, 4190218]),
        # Larger than any ttrpc message: the rest is split at the reader's frame limit.
        (4096 + MAX_FRAME_PAYLOAD + 5, [4096, MAX_FRAME_PAYLOAD, 5]),
    ],
)
def test_outbound_sizing_rule(size: int, frame_sizes: list[int]) -> None:
    message = bytes(i % 251 for i in range(size))
    frames = frame_message(1, message)
    assert [len(f) - 8 for f in frames] == frame_sizes
    assert all(f[:4] == b"\x00\x00\x00\x01" for f in frames)
    assert [int.from_bytes(f[4:8], "big") for f in frames] == frame_sizes
    assert b"".join(f[8:] for f in frames) == message


def test_fragmented_message_golden_bytes() -> None:
    # Hand-computed: a 5000-byte message on conn 1 -> 4096-byte first frame (0x1000) and a
    # 904-byte (0x388) second frame.
    message = b"\xab" * 5000
    mux = Multiplexer()
    mux.send(1, message)
    expected = (
        bytes.fromhex("00000001 00001000")
        + b"\xab" * 4096
        + bytes.fromhex("00000001 00000388")
        + b"\xab" * 904
    )
    assert mux.data_to_send() == expected


def test_fragmented_message_is_reassembled_in_order() -> None:
    message = bytes(range(256)) * 40
    wire = b"".join(frame_message(1, message))
    events = Multiplexer().receive_data(wire)
    assert events == [MuxData(1, message[:4096]), MuxData(1, message[4096:])]


def test_empty_message_sends_nothing() -> None:
    mux = Multiplexer()
    mux.send(1, b"")
    assert mux.data_to_send() == b""


@pytest.mark.parametrize("conn_id", [0, -1, 2**32])
def test_send_rejects_bad_connection_id(conn_id: int) -> None:
    with pytest.raises(MuxProtocolError) as info:
        Multiplexer().send(conn_id, b"x")
    assert str(info.value) == f"connection id {conn_id} is outside 1..4294967295"


def test_constructor_rejects_connection_id_zero() -> None:
    with pytest.raises(MuxProtocolError) as info:
        Multiplexer(conn_ids=(0, 1))
    assert str(info.value) == "connection id 0 is outside 1..4294967295"


def test_several_frames_in_one_read_and_interleaved_connections() -> None:
    wire = (
        bytes.fromhex("00000001 00000003")
        + b"abc"
        + bytes.fromhex("00000002 00000002")
        + b"de"
        + bytes.fromhex("00000001 00000001")
        + b"f"
    )
    events = Multiplexer().receive_data(wire)
    assert events == [MuxData(1, b"abc"), MuxData(2, b"de"), MuxData(1, b"f")]


def test_frames_for_unused_connections_are_dropped() -> None:
    wire = (
        bytes.fromhex("00000000 00000002")
        + b"zz"
        + bytes.fromhex("00000007 00000003")
        + b"yyy"
        + bytes.fromhex("00000001 00000001")
        + b"k"
    )
    events = Multiplexer().receive_data(wire)
    assert events == [MuxFrameDropped(0, 2), MuxFrameDropped(7, 3), MuxData(1, b"k")]


def test_custom_connection_set() -> None:
    wire = bytes.fromhex("00000002 00000001") + b"x" + bytes.fromhex("00000005 00000001") + b"y"
    assert Multiplexer(conn_ids=[5]).receive_data(wire) == [
        MuxFrameDropped(2, 1),
        MuxData(5, b"y"),
    ]


def test_zero_length_frame_yields_nothing() -> None:
    assert Multiplexer().receive_data(bytes.fromhex("00000001 00000000")) == []


def test_partial_frame_is_buffered_until_complete() -> None:
    mux = Multiplexer()
    wire = bytes.fromhex("00000001 00000004") + b"wxyz"
    assert mux.receive_data(wire[:5]) == []
    assert mux.pending_bytes == 5
    assert mux.receive_data(wire[5:10]) == []
    assert mux.pending_bytes == 10
    assert mux.receive_data(wire[10:]) == [MuxData(1, b"wxyz")]
    assert mux.pending_bytes == 0


def test_byte_at_a_time_gives_the_same_events() -> None:
    wire = b"".join(frame_message(1, b"m" * 4500) + frame_message(2, b"n" * 7))
    wire += bytes.fromhex("00000009 00000001") + b"q"
    whole = Multiplexer().receive_data(wire)
    mux = Multiplexer()
    piecewise: list[MuxEvent] = []
    for i in range(len(wire)):
        piecewise += mux.receive_data(wire[i : i + 1])
    assert piecewise == whole
    assert whole == [
        MuxData(1, b"m" * 4096),
        MuxData(1, b"m" * 404),
        MuxData(2, b"n" * 7),
        MuxFrameDropped(9, 1),
    ]


def test_largest_frame_is_accepted() -> None:
    payload = b"p" * MAX_FRAME_PAYLOAD
    wire = MAX_FRAME_PAYLOAD.to_bytes(4, "big")
    events = Multiplexer().receive_data(b"\x00\x00\x00\x01" + wire + payload)
    assert events == [MuxData(1, payload)]


def test_oversized_frame_fails_at_its_header() -> None:
    mux = Multiplexer()
    # Only the 8 header bytes are given: the error must not wait for the payload.
    with pytest.raises(MuxProtocolError) as info:
        mux.receive_data(bytes.fromhex("00000001 0040000b"))
    assert str(info.value) == (
        "mux frame for connection 1 announces 4194315 bytes, more than the maximum of 4194314"
    )
    assert mux.pending_bytes == 0
    with pytest.raises(ConnectionBroken) as again:
        mux.receive_data(b"\x00")
    assert str(again.value) == (
        "multiplexer no longer accepts data: mux frame for connection 1 announces 4194315"
        " bytes, more than the maximum of 4194314"
    )


def test_oversized_frame_for_unused_connection_also_fails() -> None:
    with pytest.raises(MuxProtocolError) as info:
        Multiplexer().receive_data(bytes.fromhex("00000009 ffffffff"))
    assert str(info.value) == (
        "mux frame for connection 9 announces 4294967295 bytes, more than the maximum of 4194314"
    )


def test_eof_between_frames_is_clean() -> None:
    mux = Multiplexer()
    mux.receive_data(bytes.fromhex("00000001 00000001") + b"a")
    mux.receive_eof()
    with pytest.raises(ConnectionBroken) as info:
        mux.receive_data(b"")
    assert str(info.value) == "multiplexer no longer accepts data: the socket reached EOF"


def test_eof_inside_a_frame_is_an_error() -> None:
    mux = Multiplexer()
    mux.receive_data(bytes.fromhex("00000001 00000009") + b"abc")
    with pytest.raises(MuxProtocolError) as info:
        mux.receive_eof()
    assert str(info.value) == "socket closed in the middle of a mux frame (11 bytes)"


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=20))
def test_fuzz_arbitrary_bytes(chunks: list[bytes]) -> None:
    mux = Multiplexer()
    try:
        for chunk in chunks:
            for event in mux.receive_data(chunk):
                assert isinstance(event, MuxData | MuxFrameDropped)
            assert mux.pending_bytes <= 8 + MAX_FRAME_PAYLOAD
        mux.receive_eof()
    except ProtocolError:
        pass


frames = st.tuples(st.integers(0, 4), st.binary(max_size=40))


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(frames, max_size=12), st.lists(st.integers(1, 30), min_size=1, max_size=10))
def test_fuzz_well_formed_frames_survive_any_split(
    sent: list[tuple[int, bytes]], cuts: list[int]
) -> None:
    wire = b"".join(
        conn_id.to_bytes(4, "big") + len(data).to_bytes(4, "big") + data for conn_id, data in sent
    )
    mux = Multiplexer()
    events: list[MuxEvent] = []
    pos = 0
    i = 0
    while pos < len(wire):
        step = cuts[i % len(cuts)]
        events += mux.receive_data(wire[pos : pos + step])
        pos += step
        i += 1
    mux.receive_eof()
    expected: list[MuxEvent] = []
    for conn_id, data in sent:
        if conn_id in (1, 2):
            if data:
                expected.append(MuxData(conn_id, data))
        else:
            expected.append(MuxFrameDropped(conn_id, len(data)))
    assert events == expected


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 2]), st.binary(min_size=1, max_size=9000))
def test_round_trip_any_message(conn_id: int, message: bytes) -> None:
    sender = Multiplexer()
    sender.send(conn_id, message)
    wire = sender.data_to_send()
    first_len = int.from_bytes(wire[4:8], "big")
    assert first_len <= 4096
    events = Multiplexer().receive_data(wire)
    assert all(isinstance(e, MuxData) and e.conn_id == conn_id for e in events)
    assert b"".join(e.payload for e in events if isinstance(e, MuxData)) == message
