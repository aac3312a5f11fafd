"""ttrpc codec: golden bytes (protocols.md 5.5), both roles, stream id rules, bad input."""

from __future__ import annotations

import pytest

from dracpu.nri.errors import (
    ConnectionBroken,
    FrameTooLarge,
    InvalidStreamId,
    MalformedMessage,
    UnknownMessageType,
)
from dracpu.nri.ttrpc import (
    MAX_DATA_LENGTH,
    ClientEvent,
    RequestReceived,
    RequestRejected,
    ResponseDropped,
    ResponseReceived,
    ServerEvent,
    Status,
    StatusCode,
    TTRPCClientConnection,
    TTRPCServerConnection,
    encode_frame,
    unimplemented_method,
    unimplemented_service,
)

RUNTIME = b"nri.pkg.api.v1alpha1.Runtime"
PLUGIN = b"nri.pkg.api.v1alpha1.Plugin"

# protocols.md 5.5, verbatim.
REGISTER_PAYLOAD = bytes.fromhex("0a0e6578616d706c652d706c7567696e 12023130")
REGISTER_REQUEST = (
    bytes.fromhex("0a1c")
    + RUNTIME
    + bytes.fromhex("120e")
    + b"RegisterPlugin"
    + bytes.fromhex("1a14")
    + REGISTER_PAYLOAD
    + bytes.fromhex("2080a8d6b907")
)
REGISTER_HEADER = bytes.fromhex("0000004a 00000001 01 00")
EMPTY_REPLY_STREAM_1 = bytes.fromhex("00000000 00000001 02 00")
METHOD_ERROR_DATA = bytes.fromhex("0a18 080c 1214") + b"method RunPodSandbox"
CONFIGURE_REPLY = bytes.fromhex("00000005 00000001 02 00 1203 10880d")


def pb_len(field: int, data: bytes) -> bytes:
    """Hand-encode a length-delimited protobuf field (all lengths here are < 128)."""
    assert len(data) < 128
    return bytes([field << 3 | 2, len(data)]) + data


def status_response(code: int, message: str) -> bytes:
    """Hand-encoded Response{status{code, message}} (code < 128)."""
    return pb_len(1, bytes([0x08, code]) + pb_len(2, message.encode()))


def frame(stream_id: int, message_type: int, data: bytes, flags: int = 0) -> bytes:
    header = len(data).to_bytes(4, "big") + stream_id.to_bytes(4, "big")
    return header + bytes([message_type, flags]) + data


# Configure as an NRI v0.11 runtime sends it (5.5), here from containerd v2.1.0:
# registration_timeout 5000 (20 88 27), request_timeout 2000 (28 d0 0f).
CONFIGURE_PAYLOAD = pb_len(2, b"containerd") + pb_len(3, b"v2.1.0") + bytes.fromhex("208827 28d00f")


# --------------------------------------------------------------------- golden vectors


def test_golden_register_plugin_request() -> None:
    assert len(REGISTER_REQUEST) == 74
    client = TTRPCClientConnection()
    stream_id = client.send_request(
        "nri.pkg.api.v1alpha1.Runtime",
        "RegisterPlugin",
        REGISTER_PAYLOAD,
        timeout_nano=2_000_000_000,
    )
    assert stream_id == 1
    assert client.data_to_send() == REGISTER_HEADER + REGISTER_REQUEST
    assert client.in_flight == frozenset({1})


def test_golden_empty_success_reply_decodes_as_empty_payload() -> None:
    client = TTRPCClientConnection()
    client.send_request("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin", REGISTER_PAYLOAD)
    assert client.receive_data(EMPTY_REPLY_STREAM_1) == [ResponseReceived(1, b"")]
    assert client.in_flight == frozenset()


def test_golden_error_reply_decodes_as_status() -> None:
    client = TTRPCClientConnection()
    client.send_request("nri.pkg.api.v1alpha1.Plugin", "RunPodSandbox")
    events = client.receive_data(frame(1, 2, METHOD_ERROR_DATA))
    assert events == [ResponseReceived(1, Status(12, "method RunPodSandbox"))]


def test_golden_register_plugin_request_is_served() -> None:
    server = TTRPCServerConnection()
    events = server.receive_data(REGISTER_HEADER + REGISTER_REQUEST)
    assert events == [
        RequestReceived(
            stream_id=1,
            service="nri.pkg.api.v1alpha1.Runtime",
            method="RegisterPlugin",
            payload=REGISTER_PAYLOAD,
            timeout_nano=2_000_000_000,
            metadata=(),
        )
    ]
    server.send_response(1, b"")
    assert server.data_to_send() == EMPTY_REPLY_STREAM_1


def test_golden_configure_exchange() -> None:
    request = (
        pb_len(1, PLUGIN)
        + pb_len(2, b"Configure")
        + pb_len(3, CONFIGURE_PAYLOAD)
        + bytes.fromhex("2080a8d6b907")
    )
    server = TTRPCServerConnection()
    [event] = server.receive_data(frame(1, 1, request))
    assert event == RequestReceived(
        1, "nri.pkg.api.v1alpha1.Plugin", "Configure", CONFIGURE_PAYLOAD, 2_000_000_000, ()
    )
    server.send_response(1, bytes.fromhex("10880d"))  # ConfigureResponse{events: 0x688}
    assert server.data_to_send() == CONFIGURE_REPLY


def test_golden_error_reply_is_sent() -> None:
    server = TTRPCServerConnection()
    server.receive_data(frame(3, 1, pb_len(1, PLUGIN) + pb_len(2, b"RunPodSandbox")))
    server.send_response(3, unimplemented_method("RunPodSandbox"))
    assert server.data_to_send() == bytes.fromhex("0000001a 00000003 02 00") + METHOD_ERROR_DATA


def test_request_with_metadata_hand_encoded() -> None:
    kv = pb_len(1, b"k1") + pb_len(2, b"v1")
    request = pb_len(1, b"svc") + pb_len(2, b"M") + pb_len(5, kv) + pb_len(5, pb_len(1, b"k2"))
    client = TTRPCClientConnection()
    client.send_request("svc", "M", metadata=[("k1", "v1"), ("k2", "")])
    assert client.data_to_send() == frame(1, 1, request)
    [event] = TTRPCServerConnection().receive_data(frame(1, 1, request))
    assert event == RequestReceived(1, "svc", "M", b"", 0, (("k1", "v1"), ("k2", "")))


def test_request_without_payload_field_is_the_empty_message() -> None:
    # Shutdown(Empty): the Request has no field 3 at all.
    request = pb_len(1, PLUGIN) + pb_len(2, b"Shutdown")
    [event] = TTRPCServerConnection().receive_data(frame(1, 1, request))
    assert event == RequestReceived(1, "nri.pkg.api.v1alpha1.Plugin", "Shutdown", b"", 0, ())


def test_status_code_zero_with_payload_is_success() -> None:
    client = TTRPCClientConnection()
    client.send_request("s", "m")
    data = pb_len(1, b"\x08\x00") + pb_len(2, b"\x10\x01")
    assert client.receive_data(frame(1, 2, data)) == [ResponseReceived(1, b"\x10\x01")]


def test_error_status_wins_over_payload() -> None:
    client = TTRPCClientConnection()
    client.send_request("s", "m")
    data = status_response(9, "busy") + pb_len(2, b"\x10\x01")
    assert client.receive_data(frame(1, 2, data)) == [ResponseReceived(1, Status(9, "busy"))]


def test_status_helpers() -> None:
    assert unimplemented_service("foo.Bar") == Status(12, "service foo.Bar")
    assert unimplemented_method("Baz") == Status(StatusCode.UNIMPLEMENTED, "method Baz")


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (0, "status code 0 means success; answer with a payload instead"),
        (2**31, "status code 2147483648 does not fit in int32"),
    ],
)
def test_status_rejects_bad_codes(code: int, message: str) -> None:
    with pytest.raises(ValueError) as info:
        Status(code, "x")
    assert str(info.value) == message


def test_negative_status_code_round_trips() -> None:
    server = TTRPCServerConnection()
    client = TTRPCClientConnection()
    sid = client.send_request("s", "m")
    server.receive_data(client.data_to_send())
    server.send_response(sid, Status(-7, "odd peer"))
    assert client.receive_data(server.data_to_send()) == [
        ResponseReceived(sid, Status(-7, "odd peer"))
    ]


# --------------------------------------------------------------------- stream ids


def test_client_stream_ids_are_odd_and_increasing() -> None:
    client = TTRPCClientConnection()
    assert [client.send_request("s", "m") for _ in range(4)] == [1, 3, 5, 7]
    wire = client.data_to_send()
    headers = [wire[i : i + 10] for i in (0, 16, 32, 48)]
    assert [h.hex() for h in headers] == [
        "00000006000000010100",
        "00000006000000030100",
        "00000006000000050100",
        "00000006000000070100",
    ]


def test_server_rejects_even_stream_ids() -> None:
    server = TTRPCServerConnection()
    text = "StreamID must be odd for client initiated streams"
    for sid in (0, 2):
        events = server.receive_data(frame(sid, 1, pb_len(1, b"s")))
        assert events == [RequestRejected(sid, Status(3, text))]
        assert server.data_to_send() == frame(sid, 2, status_response(3, text))
    assert server.awaiting_response == frozenset()
    # An even id does not advance the sequence: stream 1 is still acceptable.
    [event] = server.receive_data(frame(1, 1, pb_len(1, b"s")))
    assert isinstance(event, RequestReceived)


def test_server_rejects_reused_and_decreasing_ids_and_accepts_gaps() -> None:
    server = TTRPCServerConnection()
    text = "StreamID cannot be re-used and must increment"
    events: list[ServerEvent] = []
    for sid in (1, 5, 5, 3, 9):
        events += server.receive_data(frame(sid, 1, pb_len(2, b"m")))
    assert events == [
        RequestReceived(1, "", "m", b"", 0, ()),
        RequestReceived(5, "", "m", b"", 0, ()),
        RequestRejected(5, Status(3, text)),
        RequestRejected(3, Status(3, text)),
        RequestReceived(9, "", "m", b"", 0, ()),
    ]
    assert server.awaiting_response == frozenset({1, 5, 9})
    assert server.messages_to_send() == [
        frame(5, 2, status_response(3, text)),
        frame(3, 2, status_response(3, text)),
    ]
    # The original stream 5 is still answerable after its reuse was refused.
    server.send_response(5, b"ok")
    assert server.data_to_send() == frame(5, 2, pb_len(2, b"ok"))


def test_responses_may_complete_out_of_order() -> None:
    server = TTRPCServerConnection()
    client = TTRPCClientConnection()
    for method in ("A", "B", "C"):
        client.send_request("s", method)
    requests = server.receive_data(client.data_to_send())
    assert [r.stream_id for r in requests] == [1, 3, 5]
    server.send_response(5, b"c")
    server.send_response(1, b"a")
    server.send_response(3, Status(2, "boom"))
    events = client.receive_data(server.data_to_send())
    assert events == [
        ResponseReceived(5, b"c"),
        ResponseReceived(1, b"a"),
        ResponseReceived(3, Status(2, "boom")),
    ]


def test_send_response_needs_an_open_request() -> None:
    server = TTRPCServerConnection()
    with pytest.raises(InvalidStreamId) as info:
        server.send_response(1, b"")
    assert str(info.value) == "stream 1 has no request awaiting a response"
    server.receive_data(frame(1, 1, b""))
    server.send_response(1, b"")
    with pytest.raises(InvalidStreamId) as again:
        server.send_response(1, b"")
    assert str(again.value) == "stream 1 has no request awaiting a response"


def test_late_and_unknown_responses_are_dropped() -> None:
    client = TTRPCClientConnection()
    first = client.send_request("s", "m")
    second = client.send_request("s", "m")
    client.abandon(first)
    assert client.in_flight == frozenset({second})
    events: list[ClientEvent] = []
    for sid in (first, 99, second, second):
        events += client.receive_data(frame(sid, 2, b""))
    assert events == [
        ResponseDropped(first),
        ResponseDropped(99),
        ResponseReceived(second, b""),
        ResponseDropped(second),
    ]


def test_client_stream_ids_exhaust() -> None:
    client = TTRPCClientConnection()
    client._next_stream_id = 0xFFFF_FFFF
    assert client.send_request("s", "m") == 0xFFFF_FFFF
    with pytest.raises(InvalidStreamId) as info:
        client.send_request("s", "m")
    assert str(info.value) == "stream ids of this connection are exhausted; reconnect"


@pytest.mark.parametrize("timeout", [-1, 2**63])
def test_client_rejects_bad_timeouts(timeout: int) -> None:
    with pytest.raises(ValueError) as info:
        TTRPCClientConnection().send_request("s", "m", timeout_nano=timeout)
    assert str(info.value) == f"timeout_nano {timeout} is outside 0..9223372036854775807"


# --------------------------------------------------------------------- size limits


def test_encode_frame_limits() -> None:
    assert encode_frame(1, 3, 4, b"") == bytes.fromhex("00000000 00000001 03 04")
    assert len(encode_frame(1, 1, 0, bytes(MAX_DATA_LENGTH))) == 10 + MAX_DATA_LENGTH
    with pytest.raises(FrameTooLarge) as info:
        encode_frame(1, 1, 0, bytes(MAX_DATA_LENGTH + 1))
    assert str(info.value) == "ttrpc message of 4194305 bytes exceeds the maximum of 4194304"
    with pytest.raises(InvalidStreamId) as bad_id:
        encode_frame(2**32, 1, 0, b"")
    assert str(bad_id.value) == "stream id 4294967296 does not fit in uint32"


def test_oversized_request_is_refused_locally_and_uses_up_its_id() -> None:
    client = TTRPCClientConnection()
    with pytest.raises(FrameTooLarge) as info:
        client.send_request("s", "Synchronize", bytes(MAX_DATA_LENGTH))
    # "s" (3) + "Synchronize" (13) + payload tag and 4-byte length (5) + 4 MiB.
    assert str(info.value) == "ttrpc message of 4194325 bytes exceeds the maximum of 4194304"
    assert client.data_to_send() == b""
    assert client.in_flight == frozenset()
    assert client.send_request("s", "m") == 3


def test_request_of_exactly_4_mib_is_served() -> None:
    # service "s" (3 bytes) + payload field with a 4-byte length varint.
    payload = bytes(MAX_DATA_LENGTH - 3 - 5)
    client = TTRPCClientConnection()
    client.send_request("s", "", payload)
    wire = client.data_to_send()
    assert wire[:4] == MAX_DATA_LENGTH.to_bytes(4, "big")
    [event] = TTRPCServerConnection().receive_data(wire)
    assert isinstance(event, RequestReceived)
    assert event.payload == payload


def test_oversized_response_is_refused_and_can_be_replaced_by_a_status() -> None:
    server = TTRPCServerConnection()
    server.receive_data(frame(1, 1, b""))
    with pytest.raises(FrameTooLarge):
        server.send_response(1, bytes(MAX_DATA_LENGTH))
    assert server.awaiting_response == frozenset({1})
    server.send_response(1, Status(8, "reply too large"))
    assert server.data_to_send() == frame(1, 2, status_response(8, "reply too large"))


def test_server_answers_oversized_frame_at_its_header_without_buffering() -> None:
    server = TTRPCServerConnection()
    length = MAX_DATA_LENGTH + 1
    text = "message length 4194305 exceed maximum message size of 4194304"
    events = server.receive_data(length.to_bytes(4, "big") + bytes.fromhex("00000007 01 00"))
    assert events == [RequestRejected(7, Status(8, text))]
    assert server.data_to_send() == frame(7, 2, status_response(8, text))
    # The announced data is counted off as it arrives, never stored.
    chunk = bytes(65536)
    remaining = length
    while remaining:
        piece = chunk[: min(len(chunk), remaining)]
        assert server.receive_data(piece) == []
        assert server.pending_bytes == 0
        remaining -= len(piece)
    # The stream is back in sync; id 7 was never accepted, so 7 is still usable.
    [event] = server.receive_data(frame(7, 1, pb_len(2, b"m")))
    assert event == RequestReceived(7, "", "m", b"", 0, ())


def test_oversized_frame_and_following_frame_in_one_read() -> None:
    server = TTRPCServerConnection()
    huge = 0xFFFF_FFFF
    text = f"message length {huge} exceed maximum message size of 4194304"
    events = server.receive_data(huge.to_bytes(4, "big") + bytes.fromhex("00000001 03 00"))
    assert events == [RequestRejected(1, Status(8, text))]


def test_client_fails_the_call_on_an_oversized_response() -> None:
    client = TTRPCClientConnection()
    client.send_request("s", "m")
    client.send_request("s", "m")
    header = (MAX_DATA_LENGTH + 3).to_bytes(4, "big")
    events = client.receive_data(header + bytes.fromhex("00000001 02 00") + b"abc")
    text = "message length 4194307 exceed maximum message size of 4194304"
    assert events == [ResponseReceived(1, Status(8, text))]
    assert client.pending_bytes == 0
    assert client.receive_data(bytes(MAX_DATA_LENGTH)) == []
    # Unknown stream: still skipped, reported as dropped.
    events = client.receive_data(header + bytes.fromhex("00000009 02 00"))
    assert events == [ResponseDropped(9)]
    assert client.receive_data(bytes(MAX_DATA_LENGTH + 3)) == []
    assert client.receive_data(frame(3, 2, b"")) == [ResponseReceived(3, b"")]


# --------------------------------------------------------------------- bad input


def test_undecodable_request_is_answered_with_invalid_argument() -> None:
    server = TTRPCServerConnection()
    text = (
        "unmarshal request error: Error parsing message with type 'ttrpc.Request':"
        " Wire format was corrupt"
    )
    assert server.receive_data(frame(1, 1, b"\xff")) == [RequestRejected(1, Status(3, text))]
    bad_utf8 = "unmarshal request error: Error parsing message with type 'ttrpc.Request':"
    events = server.receive_data(frame(3, 1, pb_len(1, b"\xff\xfe")))
    assert events == [RequestRejected(3, Status(3, bad_utf8 + " String field had bad UTF-8"))]
    assert server.awaiting_response == frozenset()
    # Like the Go server, the id is consumed even though the request was refused.
    [event] = server.receive_data(frame(3, 1, b""))
    assert isinstance(event, RequestRejected)
    assert event.status.message == "StreamID cannot be re-used and must increment"


@pytest.mark.parametrize(
    ("message_type", "flags", "name"),
    [(2, 0, "response"), (3, 4, "data"), (0, 0, "unknown (0x00)"), (0x7F, 0, "unknown (0x7f)")],
)
def test_server_refuses_non_request_frames(message_type: int, flags: int, name: str) -> None:
    server = TTRPCServerConnection()
    with pytest.raises(UnknownMessageType) as info:
        server.receive_data(frame(1, message_type, b"", flags))
    text = f"ttrpc server received a {name} message on stream 1; only requests are served"
    assert str(info.value) == text
    with pytest.raises(ConnectionBroken) as again:
        server.receive_data(b"")
    assert str(again.value) == f"ttrpc server connection no longer accepts data: {text}"


@pytest.mark.parametrize(
    ("message_type", "name"), [(1, "request"), (3, "data"), (9, "unknown (0x09)")]
)
def test_client_refuses_non_response_frames(message_type: int, name: str) -> None:
    client = TTRPCClientConnection()
    with pytest.raises(UnknownMessageType) as info:
        client.receive_data(frame(2, message_type, b""))
    assert str(info.value) == (
        f"ttrpc client received a {name} message on stream 2; only responses are expected"
    )


def test_client_fails_on_undecodable_response() -> None:
    client = TTRPCClientConnection()
    client.send_request("s", "m")
    with pytest.raises(MalformedMessage) as info:
        client.receive_data(frame(1, 2, b"\x0a\x05"))
    assert str(info.value) == (
        "undecodable ttrpc response on stream 1: Error parsing message with type"
        " 'ttrpc.Response': Wire format was corrupt"
    )


def test_eof_handling() -> None:
    server = TTRPCServerConnection()
    server.receive_data(frame(1, 1, b"") + b"\x00\x00")
    with pytest.raises(MalformedMessage) as info:
        server.receive_eof()
    assert str(info.value) == "ttrpc server connection closed in the middle of a frame"

    client = TTRPCClientConnection()
    client.receive_eof()
    with pytest.raises(ConnectionBroken) as again:
        client.receive_data(b"")
    assert str(again.value) == (
        "ttrpc client connection no longer accepts data: the connection reached EOF"
    )

    skipping = TTRPCClientConnection()
    skipping.receive_data(
        (MAX_DATA_LENGTH + 1).to_bytes(4, "big") + bytes.fromhex("00000001 02 00")
    )
    with pytest.raises(MalformedMessage):
        skipping.receive_eof()


def test_split_delivery_byte_by_byte_gives_the_same_events() -> None:
    client = TTRPCClientConnection()
    for method in ("Configure", "Synchronize", "CreateContainer"):
        client.send_request("nri.pkg.api.v1alpha1.Plugin", method, b"\x08\x01" * 3000)
    wire = client.data_to_send() + frame(4, 1, b"") + frame(1, 1, b"")
    whole = TTRPCServerConnection().receive_data(wire)
    server = TTRPCServerConnection()
    piecewise: list[ServerEvent] = []
    for i in range(len(wire)):
        piecewise += server.receive_data(wire[i : i + 1])
    assert piecewise == whole
    assert [type(e).__name__ for e in whole] == [
        "RequestReceived",
        "RequestReceived",
        "RequestReceived",
        "RequestRejected",
        "RequestRejected",
    ]

    replies = b"".join(frame(sid, 2, pb_len(2, b"x" * 100)) for sid in (5, 1, 3))
    one = TTRPCClientConnection()
    two = TTRPCClientConnection()
    for c in (one, two):
        for _ in range(3):
            c.send_request("s", "m")
    bytewise: list[ClientEvent] = []
    for i in range(len(replies)):
        bytewise += two.receive_data(replies[i : i + 1])
    assert bytewise == one.receive_data(replies)
    assert [e.stream_id for e in bytewise] == [5, 1, 3]
