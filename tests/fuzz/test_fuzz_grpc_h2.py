"""gRPC over h2 under hypothesis: hostile frames and hostile-but-valid client behaviour.

``GRPCServerConnection`` must turn any byte stream into its own three event types (no h2,
hpack or other exception escapes), keep answering what it can, and hold a bounded amount of
request data however many streams a client opens.
"""

from __future__ import annotations

import contextlib

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hpack
from builders import grpc_headers
from fuzzing import bounded, fuzz_settings
from grpclib.const import Status
from hypothesis import event as hyp_event
from hypothesis import given
from hypothesis import strategies as st

from dracpu.grpc.connection import (
    ConnectionClosed,
    GRPCServerConnection,
    RequestReceived,
    StreamAborted,
)
from dracpu.grpc.framing import encode_message

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_MESSAGE = 64
MAX_BUFFER = 256
MAX_HEADER_LIST = 1024

EVENT_TYPES = (RequestReceived, StreamAborted, ConnectionClosed)


def small_server() -> GRPCServerConnection:
    server = GRPCServerConnection(
        max_message_size=MAX_MESSAGE,
        max_connection_buffer=MAX_BUFFER,
        max_header_list_size=MAX_HEADER_LIST,
        max_concurrent_streams=8,
    )
    server.initiate()
    server.data_to_send()
    return server


# -- raw frames ------------------------------------------------------------------------------

GOOD = grpc_headers()
stream_ids = st.sampled_from([0, 1, 3, 5, 7, 2, 2**31 - 1])
header_names = st.sampled_from(
    [
        *(b":method", b":path", b":scheme", b":authority", b"content-type", b"te"),
        *(b"grpc-timeout", b"x-meta", b"x-bin-bin", b"Upper", b"", b"\x00bad"),
    ]
)
header_values = st.one_of(
    st.sampled_from([b"POST", b"GET", b"/p.S/M", b"http", b"application/grpc", b"trailers"]),
    st.sampled_from([b"1S", b"99999999n", b"0m", b"1x", b"", b"QUJD", b"!!!"]),
    st.binary(max_size=40),
)
header_lists = st.lists(st.tuples(header_names, header_values), max_size=8)
grpc_payloads = st.one_of(
    st.binary(max_size=80),
    st.binary(max_size=MAX_MESSAGE + 8).map(encode_message),
    st.tuples(st.integers(0, 3), st.integers(0, 2**32 - 1), st.binary(max_size=20)).map(
        lambda t: bytes([t[0]]) + t[1].to_bytes(4, "big") + t[2]
    ),
)


# Frame type codes and flag bits of RFC 9113; frames are built by hand so that stream ids,
# flags and lengths the frame library would refuse can be sent too.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0,
    1,
    2,
    3,
    4,
    6,
    7,
    8,
    9,
)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20


def raw_frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + sid.to_bytes(4, "big") + payload


def _u32(n: int) -> bytes:
    return n.to_bytes(4, "big")


flag_bits = st.integers(0, 255) | st.sampled_from(
    [0, END_STREAM, END_HEADERS, END_HEADERS | END_STREAM]
)
frame_bytes = st.one_of(
    st.builds(
        lambda sid, headers, flags: raw_frame(HEADERS, flags, sid, hpack.Encoder().encode(headers)),
        stream_ids,
        header_lists,
        flag_bits,
    ),
    st.builds(
        lambda sid, data, flags: raw_frame(DATA, flags, sid, data),
        stream_ids,
        grpc_payloads,
        flag_bits,
    ),
    st.builds(
        lambda sid, data, flags: raw_frame(CONTINUATION, flags, sid, data),
        stream_ids,
        st.binary(max_size=30),
        flag_bits,
    ),
    st.builds(
        lambda sid, code: raw_frame(RST_STREAM, 0, sid, _u32(code)), stream_ids, st.integers(0, 15)
    ),
    st.builds(
        lambda sid, inc: raw_frame(WINDOW_UPDATE, 0, sid, _u32(inc)),
        stream_ids,
        st.integers(0, 2**32 - 1),
    ),
    st.builds(
        lambda items, flags: raw_frame(
            SETTINGS, flags, 0, b"".join(k.to_bytes(2, "big") + _u32(v) for k, v in items)
        ),
        st.lists(st.tuples(st.integers(0, 9), st.integers(0, 2**32 - 1)), max_size=3),
        st.sampled_from([0, ACK]),
    ),
    st.builds(
        lambda data, flags: raw_frame(PING, flags, 0, data),
        st.binary(max_size=9),
        st.sampled_from([0, ACK]),
    ),
    st.builds(
        lambda sid, dep: raw_frame(PRIORITY, 0, sid, _u32(dep) + b"\x10"), stream_ids, stream_ids
    ),
    st.builds(
        lambda last, code: raw_frame(GOAWAY, 0, 0, _u32(last) + _u32(code)),
        stream_ids,
        st.integers(0, 15),
    ),
    st.builds(
        lambda kind, flags, sid, data: raw_frame(kind, flags, sid, data),
        st.integers(0, 255),
        st.integers(0, 255),
        stream_ids,
        st.binary(max_size=20),
    ),
    st.binary(min_size=1, max_size=30),  # garbage, often a bogus frame header
    # A frame over the 16 KiB limit, and a good part of its body.
    st.builds(
        lambda length, kind, body: (
            length.to_bytes(3, "big") + bytes([kind, 0]) + _u32(1) + b"\x00" * body
        ),
        st.integers(16385, 2**24 - 1),
        st.sampled_from([DATA, HEADERS, SETTINGS, 0x42]),
        st.integers(0, 40_000),
    ),
    # A well-formed call, so that fuzzed frames around it meet a connection in use.
    st.builds(
        lambda sid, payload: (
            raw_frame(HEADERS, END_HEADERS, sid, hpack.Encoder().encode(GOOD))
            + raw_frame(DATA, END_STREAM, sid, encode_message(payload))
        ),
        st.sampled_from([1, 3, 5, 7]),
        st.binary(max_size=MAX_MESSAGE),
    ),
)


def note(what: str) -> None:
    """Label the example, so ``--hypothesis-show-statistics`` shows how deep inputs get."""
    hyp_event(what)


def _drive(server: GRPCServerConnection, wire: bytes, cuts: list[int]) -> list[object]:
    events: list[object] = []
    prev = 0
    for cut in [*sorted(c for c in cuts if c <= len(wire)), len(wire)]:
        for event in server.receive_data(wire[prev:cut]):
            assert isinstance(event, EVENT_TYPES)
            note(type(event).__name__)
            events.append(event)
            if isinstance(event, RequestReceived):
                assert len(event.message) <= MAX_MESSAGE
                # Answer like a handler would, exercising the outbound half.
                server.send_message(event.stream_id, event.message[:10])
                server.send_status(event.stream_id, Status.OK)
        prev = cut
        assert server.buffered_request_bytes <= MAX_BUFFER
        # h2's own input buffer holds at most one incomplete frame (16 KiB max frame size).
        assert len(server._h2.incoming_buffer._data) < 9 + 16384
        server.data_to_send()
    return events


@fuzz_settings(300)
@given(
    st.sampled_from([True] * 9 + [False]),  # mostly past the preface, to get further in
    st.lists(frame_bytes, max_size=14),
    st.lists(st.integers(0, 2000), max_size=6),
)
def test_any_frames_give_only_connection_events(
    preface: bool, frames: list[bytes], cuts: list[int]
) -> None:
    server = small_server()
    wire = (PREFACE if preface else b"") + b"".join(frames)
    with bounded():
        events = _drive(server, wire, cuts)
    if server.closed:
        # Once closed, the connection ignores input and never restarts.
        assert server.receive_data(PREFACE) == []
    if events and isinstance(events[-1], ConnectionClosed):
        assert server.closed


# -- a real h2 client misbehaving within the protocol ------------------------------------------


class Client:
    def __init__(self) -> None:
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.h2.initiate_connection()
        self.open: list[int] = []

    def act(self, op: tuple[object, ...]) -> None:
        kind = op[0]
        # The client library refuses some actions on its own (closed stream, no window):
        # that is the client's business, not the server's input.
        with contextlib.suppress(h2.exceptions.ProtocolError, KeyError):
            if kind == "headers":
                _, method, ctype, timeout, extra, end = op
                sid = self.h2.get_next_available_stream_id()
                headers = grpc_headers(method=method, content_type=ctype)  # type: ignore[arg-type]
                if timeout is not None:
                    headers.append((b"grpc-timeout", timeout))
                headers += extra  # type: ignore[operator]
                self.h2.send_headers(sid, headers, end_stream=bool(end))
                self.open.append(sid)
            elif kind == "data" and self.open:
                _, index, payload, end = op
                sid = self.open[int(index) % len(self.open)]  # type: ignore[call-overload]
                self.h2.send_data(sid, payload, end_stream=bool(end))  # type: ignore[arg-type]
            elif kind == "reset" and self.open:
                self.h2.reset_stream(self.open[int(op[1]) % len(self.open)])  # type: ignore[call-overload]
            elif kind == "call":
                sid = self.h2.get_next_available_stream_id()
                self.h2.send_headers(sid, GOOD)
                self.h2.send_data(sid, encode_message(op[1]), end_stream=True)  # type: ignore[arg-type]
            elif kind == "ping":
                self.h2.ping(b"12345678")
            elif kind == "window" and self.open:
                self.h2.increment_flow_control_window(int(op[1]))  # type: ignore[call-overload]
            elif kind == "goaway":
                self.h2.close_connection()


client_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("headers"),
            st.sampled_from([b"POST", b"GET"]),
            st.sampled_from([b"application/grpc", b"application/grpc+proto", b"text/plain"]),
            st.sampled_from([None, b"1S", b"10m", b"bogus", b"123456789S"]),
            st.lists(
                st.tuples(st.sampled_from([b"x-a", b"x-b-bin"]), st.binary(max_size=12)), max_size=2
            ),
            st.booleans(),
        ),
        st.tuples(st.just("data"), st.integers(0, 7), grpc_payloads, st.booleans()),
        st.tuples(st.just("reset"), st.integers(0, 7)),
        st.tuples(st.just("call"), st.binary(max_size=MAX_MESSAGE)),
        st.tuples(st.just("ping")),
        st.tuples(st.just("window"), st.integers(1, 2**16)),
        st.tuples(st.just("goaway")),
    ),
    max_size=25,
)


@fuzz_settings(300)
@given(client_ops, st.booleans())
def test_client_behaviour_gets_answers_and_bounded_buffers(
    ops: list[tuple[object, ...]], shutdown_midway: bool
) -> None:
    server = small_server()
    client = Client()
    requests = 0
    with bounded():
        for index, op in enumerate(ops):
            if shutdown_midway and index == len(ops) // 2:
                server.start_shutdown()
            client.act(op)
            for event in server.receive_data(client.h2.data_to_send()):
                assert isinstance(event, EVENT_TYPES)
                note(type(event).__name__)
                if isinstance(event, RequestReceived):
                    requests += 1
                    server.send_message(event.stream_id, b"reply")
                    server.send_status(event.stream_id, Status.OK)
            assert server.buffered_request_bytes <= MAX_BUFFER
            assert server.active_streams <= 8
            reply = server.data_to_send()
            with contextlib.suppress(h2.exceptions.ProtocolError):
                for event in client.h2.receive_data(reply):
                    # Every reply header block the client sees is well formed.
                    assert not isinstance(event, h2.events.UnknownFrameReceived)
    well_formed = [op for op in ops if op[0] == "call"]
    hostile = any(op[0] in ("goaway", "headers", "data", "reset") for op in ops)
    if well_formed and not shutdown_midway and not hostile:
        # Nothing hostile: every well-formed call is served.
        assert requests == len(well_formed)


def test_request_arriving_with_the_clients_goaway_in_one_read() -> None:
    """Found by atheris: h2 parses the whole read before events are handled, so the early
    answer to a bad request met a connection already closed by the GOAWAY after it."""
    server = small_server()
    get = grpc_headers(method=b"GET")
    wire = (
        PREFACE
        + raw_frame(SETTINGS, 0, 0, b"")
        + raw_frame(HEADERS, END_HEADERS, 1, hpack.Encoder().encode(get))
        + raw_frame(GOAWAY, 0, 0, _u32(1) + _u32(0))
    )
    assert server.receive_data(wire) == [ConnectionClosed(0)]
    assert server.closed and server.active_streams == 0


def test_early_answer_on_a_stream_h2_has_already_forgotten() -> None:
    """Found by atheris: HEADERS twice on one stream, then a higher stream, in one read;
    h2 had closed and dropped the first stream by the time its 405 answer was sent, and
    sending on it looked like opening a stream below the highest id."""
    server = small_server()
    headers = raw_frame(HEADERS, 0xC5, 0x7E32FF, b"")  # END_STREAM|END_HEADERS|PADDED|PRIORITY
    wire = (
        PREFACE
        + headers
        + headers
        + raw_frame(HEADERS, 0xC5, 0x7E33FF, b"")
        # The fuzzer's tail, kept as found: a frame header and part of its body.
        + b"\x00\x00\x00\x32\x7e\x00\xc5\x00\xff\x00\x00\x00\x00\x00\x00\x00\x00"
    )
    assert server.receive_data(wire) == []
    assert not server.closed and server.active_streams == 0
