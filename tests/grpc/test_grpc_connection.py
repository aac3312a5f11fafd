"""The sans-IO connection core, driven by an in-memory h2 client."""

from __future__ import annotations

from typing import Any

import h2.events
import hpack
from builders import GRPC_PATH, H2Pair, grpc_headers, h2_pair
from grpclib.const import Status
from h2.errors import ErrorCodes
from hyperframe.frame import (
    ContinuationFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    RstStreamFrame,
    WindowUpdateFrame,
)

from dracpu.grpc.connection import (
    MAX_HEADER_BLOCK_SIZE,
    STEP_BUDGET,
    ConnectionClosed,
    GRPCServerConnection,
    RequestReceived,
    StreamAborted,
    decode_metadata,
)
from dracpu.grpc.framing import encode_message
from dracpu.grpc.status import MAX_STATUS_MESSAGE


def test_unary_request_reply_in_one_flush() -> None:
    pair = H2Pair()
    sid = pair.request(encode_message(b"\x0a\x01x"), [(b"grpc-timeout", b"999975u")])
    events = pair.exchange()
    assert events == [RequestReceived(sid, GRPC_PATH.decode(), b"\x0a\x01x", (), 0.999975)]
    pair.server.send_message(sid, b"reply")
    pair.server.send_status(sid, Status.OK)
    assert pair.server.active_streams == 0
    pair.exchange()
    (resp,) = pair.of(h2.events.ResponseReceived, sid)
    assert resp.headers == [(b":status", b"200"), (b"content-type", b"application/grpc")]
    (data,) = pair.of(h2.events.DataReceived, sid)
    assert data.data == b"\x00\x00\x00\x00\x05reply"
    (trailers,) = pair.of(h2.events.TrailersReceived, sid)
    assert trailers.headers == [(b"grpc-status", b"0")]


def test_metadata_decoding() -> None:
    headers = [
        (b":path", b"/a/b"),
        (b"user-agent", b"grpc-go/1.2"),
        (b"x-op", b"abc"),
        (b"x-id-bin", b"AAEC"),
        (b"x-short-bin", b"AAE"),
        (b"x-bad-bin", b"*"),
    ]
    assert decode_metadata(headers) == (
        ("x-op", "abc"),
        ("x-id-bin", b"\x00\x01\x02"),
        ("x-short-bin", b"\x00\x01"),
    )


def _trailers_only(pair: H2Pair, sid: int) -> list[tuple[bytes, bytes]]:
    (resp,) = pair.of(h2.events.ResponseReceived, sid)
    assert pair.of(h2.events.StreamEnded, sid)
    return list(resp.headers)


def test_bad_timeout_is_invalid_argument_trailers_only() -> None:
    pair = H2Pair()
    sid = pair.request(encode_message(b""), [(b"grpc-timeout", b"10s")])
    assert pair.exchange() == []
    assert _trailers_only(pair, sid) == [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", b"3"),
        (b"grpc-message", b"invalid grpc-timeout: '10s'"),
    ]


def test_wrong_content_type_is_415() -> None:
    pair = H2Pair()
    sid: int = pair.client.get_next_available_stream_id()
    pair.client.send_headers(
        sid, grpc_headers(content_type=b"application/json", te=False), end_stream=True
    )
    assert pair.exchange() == []
    assert _trailers_only(pair, sid) == [
        (b":status", b"415"),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", b"13"),
        (b"grpc-message", b"invalid gRPC content-type 'application/json'"),
    ]


def test_get_is_405() -> None:
    pair = H2Pair()
    sid: int = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, grpc_headers(method=b"GET", te=False))
    pair.exchange()
    assert _trailers_only(pair, sid)[0] == (b":status", b"405")
    # Answered before the client finished: the stream is released with RST(NO_ERROR).
    (reset,) = pair.of(h2.events.StreamReset, sid)
    assert reset.error_code == ErrorCodes.NO_ERROR


def test_no_message_and_two_messages_are_internal() -> None:
    pair = H2Pair()
    none_sid = pair.request(None)
    two_sid = pair.request(encode_message(b"a") + encode_message(b"b"))
    assert pair.exchange() == []
    assert _trailers_only(pair, none_sid)[3] == (
        b"grpc-message",
        b"unary request carries no message",
    )
    assert _trailers_only(pair, two_sid)[2:] == [
        (b"grpc-status", b"13"),
        (b"grpc-message", b"unary request carries more than one message"),
    ]


def test_truncated_message_is_internal() -> None:
    pair = H2Pair()
    sid = pair.request(b"\x00\x00\x00\x00\x09abc")
    assert pair.exchange() == []
    assert _trailers_only(pair, sid)[3] == (
        b"grpc-message",
        b"request ended inside a message (3 of 9 bytes)",
    )


def test_client_reset_aborts_stream() -> None:
    pair = H2Pair()
    sid = pair.request(encode_message(b""))
    pair.exchange()
    pair.client.reset_stream(sid, ErrorCodes.CANCEL)
    assert pair.exchange() == [StreamAborted(sid)]
    pair.server.send_message(sid, b"late")  # dropped, no exception
    pair.server.send_status(sid, Status.OK)
    pair.exchange()
    assert pair.of(h2.events.DataReceived, sid) == []


def test_reply_larger_than_window_waits_for_window_update() -> None:
    pair = H2Pair()
    sid = pair.request(encode_message(b""))
    pair.exchange()
    payload = b"z" * 100_000
    pair.server.send_message(sid, payload)
    pair.server.send_status(sid, Status.OK)
    # 65,535 bytes fit the initial window; the rest waits.
    assert pair.server.outbound_pending(sid) == 100_005 - 65_535
    # The client does not acknowledge yet: nothing more leaves.
    received = pair.client.receive_data(pair.server.data_to_send())
    got = sum(len(e.data) for e in received if isinstance(e, h2.events.DataReceived))
    assert got == 65_535
    assert pair.server.outbound_pending(sid) == 34_470
    pair.client.acknowledge_received_data(65_535, sid)
    pair.exchange()
    assert pair.server.outbound_pending(sid) == 0
    assert pair.server.active_streams == 0
    (trailers,) = pair.of(h2.events.TrailersReceived, sid)
    assert trailers.headers == [(b"grpc-status", b"0")]


def test_graceful_shutdown_refuses_new_streams() -> None:
    pair = H2Pair()
    first = pair.request(encode_message(b""))
    pair.exchange()
    pair.server.start_shutdown()
    pair.exchange()
    (goaway,) = [e for e in pair.client_events if isinstance(e, h2.events.ConnectionTerminated)]
    assert isinstance(goaway, h2.events.ConnectionTerminated)
    assert (goaway.error_code, goaway.last_stream_id, goaway.additional_data) == (
        ErrorCodes.NO_ERROR,
        first,
        b"server shutdown",
    )
    # The accepted stream can still be answered.
    pair.server.send_message(first, b"ok")
    pair.server.send_status(first, Status.OK)
    assert pair.server.active_streams == 0


def test_stream_opened_after_goaway_is_refused() -> None:
    pair = H2Pair()
    pair.server.start_shutdown()
    pair.server.data_to_send()  # a peer that never saw the GOAWAY
    sid = pair.request(encode_message(b""))
    assert pair.exchange() == []
    (reset,) = pair.of(h2.events.StreamReset, sid)
    assert reset.error_code == ErrorCodes.REFUSED_STREAM
    assert pair.server.active_streams == 0


def test_garbage_preface_closes_connection() -> None:
    server = GRPCServerConnection()
    server.initiate()
    events = server.receive_data(b"GET / HTTP/1.1\r\n\r\n" + b"x" * 10)
    assert events == [ConnectionClosed(ErrorCodes.PROTOCOL_ERROR)]
    assert server.closed
    assert server.receive_data(b"more") == []


def test_memory_of_closed_streams_is_bounded() -> None:
    """The kubelet keeps one connection for every call: what h2 remembers of closed streams
    must not grow with the number of calls (the soak saw ~2 MB per 10,000)."""
    pair = H2Pair()
    for _ in range(1500):
        sid = pair.request(encode_message(b"\x0a\x01x"))
        pair.exchange()
        pair.server.send_message(sid, b"ok")
        pair.server.send_status(sid, Status.OK)
        pair.exchange()
        # The client forgets too, so its own table is not what this test measures.
        pair.client._closed_streams.clear()
    remembered = len(pair.server._h2._closed_streams)
    assert 0 < remembered <= 1024
    # Calls keep working after the oldest closed streams were forgotten.
    sid = pair.request(encode_message(b"\x0a\x01y"))
    events = pair.exchange()
    assert [type(e).__name__ for e in events] == ["RequestReceived"]


# -- hostile input: bounded work per step, bounded outbound headers --------------------------


def test_budgeted_steps_give_the_same_events_as_one_call() -> None:
    whole, stepped = H2Pair(), H2Pair()
    for pair in (whole, stepped):
        for i in range(40):
            pair.request(encode_message(b"m%d" % i))
    data = whole.client.data_to_send()
    assert data == stepped.client.data_to_send()
    expected = whole.server.receive_data(data)
    assert len(expected) == 40
    got = stepped.server.receive_data(data, budget=STEP_BUDGET)
    steps = 1
    while stepped.server.input_pending:
        got += stepped.server.receive_data(b"", budget=STEP_BUDGET)
        steps += 1
    assert got == expected
    # 40 HEADERS frames at 4 units and 40 DATA frames at 1; a step ends once 16 are spent.
    assert steps == 12
    assert whole.server.data_to_send() == stepped.server.data_to_send()


def test_a_step_holds_at_most_one_full_header_block() -> None:
    pair = H2Pair()
    filler = (b"x-fill", b"v" * (MAX_HEADER_BLOCK_SIZE - 400))
    sids = [pair.request(encode_message(b"m"), [filler]) for _ in range(3)]
    data = pair.client.data_to_send()
    per_step = [pair.server.receive_data(data, budget=STEP_BUDGET)]
    while pair.server.input_pending:
        per_step.append(pair.server.receive_data(b"", budget=STEP_BUDGET))
    # Each HEADERS frame (~7 KiB of block) spends a whole budget: one request per step.
    requests = [[e.stream_id for e in step if isinstance(e, RequestReceived)] for step in per_step]
    assert all(isinstance(e, RequestReceived) for step in per_step for e in step)
    assert requests == [
        [],
        [sids[0]],
        [sids[1]],
        [sids[2]],
    ]


def test_header_block_limit_counts_continuations_across_reads() -> None:
    server, _ = h2_pair(max_header_list_size=1000)
    head = HeadersFrame(1, flags=("END_STREAM",), data=b"\x00" * 600)
    assert server.receive_data(head.serialize()) == []  # h2 holds the fragment, undecoded
    more = ContinuationFrame(1, flags=("END_HEADERS",), data=b"\x00" * 401)
    assert server.receive_data(more.serialize()) == [ConnectionClosed(ErrorCodes.ENHANCE_YOUR_CALM)]
    frames = _frames(server.data_to_send())
    answer = next(f for f in frames if isinstance(f, HeadersFrame))
    assert answer.stream_id == 1 and {"END_STREAM", "END_HEADERS"} <= set(answer.flags)
    trailers = dict(hpack.Decoder().decode(answer.data, raw=True))
    assert trailers[b"grpc-status"] == b"8"
    assert trailers[b"grpc-message"] == (
        b"request metadata too large: header block of more than 1000 bytes (at least 1001);"
        b" connection closed"
    )
    (goaway,) = [f for f in frames if isinstance(f, GoAwayFrame)]
    assert (goaway.last_stream_id, goaway.error_code) == (1, ErrorCodes.ENHANCE_YOUR_CALM)


def _frames(data: bytes) -> list[Any]:
    frames = []
    while data:
        frame, length = Frame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9 : 9 + length]))
        frames.append(frame)
        data = data[9 + length :]
    return frames


def test_long_status_message_is_cut_and_sent_without_huffman_coding() -> None:
    pair = H2Pair()
    sid = pair.request(encode_message(b"x"))
    pair.exchange()
    pair.server.send_status(sid, Status.UNKNOWN, "claim default/" + "n" * (8 * 1024 * 1024))
    raw = pair.server.data_to_send()
    # Literal bytes on the wire (hpack's Huffman encoder is quadratic in the length).
    assert b"claim default/nnnnnnnn" in raw
    pair.client_events += pair.client.receive_data(raw)
    message = dict(_trailers_only(pair, sid))[b"grpc-message"]
    assert len(message) == MAX_STATUS_MESSAGE
    assert message.endswith(b" [truncated; 8388622 characters in all]")


def test_every_outbound_header_value_is_bounded() -> None:
    pair = H2Pair()
    sid = pair.request(encode_message(b"x"), [(b"content-type", b"text/\x01" + b"z" * 6000)])
    pair.exchange()
    (resp,) = pair.of(h2.events.ResponseReceived, sid)
    headers = dict(resp.headers)
    assert headers[b":status"] == b"415"
    # The 415 text quotes the request's content-type: escaped and cut like any message.
    assert len(headers[b"grpc-message"]) == MAX_STATUS_MESSAGE
    assert headers[b"grpc-message"].startswith(b"invalid gRPC content-type 'text/\\x01zzz")


def test_frames_of_a_stream_the_server_reset_are_ignored_not_reset_again() -> None:
    # RFC 9113 5.1: after sending RST_STREAM, frames received on the stream are ignored.
    pair = H2Pair(max_message_size=1000)
    sid = pair.request(b"\x00" + (300_000).to_bytes(4, "big") + b"a" * 16_000, more=True)
    pair.server.receive_data(pair.client.data_to_send())
    refused = _frames(pair.server.data_to_send())
    assert [type(f).__name__ for f in refused] == ["HeadersFrame", "RstStreamFrame"]
    # The client keeps sending the rest before it reads the answer and the reset.
    late = b""
    for _ in range(3):
        pair.client.send_data(sid, b"b" * 16_000)
        late += pair.client.data_to_send()
    assert pair.server.receive_data(late) == []
    after = _frames(pair.server.data_to_send())
    assert not [f for f in after if isinstance(f, RstStreamFrame)]
    # The late bytes still count against the connection's window, which is given back.
    updates = [f for f in after if isinstance(f, WindowUpdateFrame)]
    assert updates and {f.stream_id for f in updates} == {0}
