"""ttrpc codec under hypothesis: arbitrary bytes only ever raise ProtocolError; round trips."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from dracpu.nri.errors import ProtocolError
from dracpu.nri.ttrpc import (
    HEADER_LENGTH,
    MAX_DATA_LENGTH,
    RequestReceived,
    RequestRejected,
    ResponseDropped,
    ResponseReceived,
    Status,
    TTRPCClientConnection,
    TTRPCServerConnection,
)

BOUND = HEADER_LENGTH + MAX_DATA_LENGTH


def examples(default: int) -> int:
    """``FUZZ_EXAMPLES`` raises the example count for long runs; CI uses ``default``."""
    raw = os.environ.get("FUZZ_EXAMPLES", "").strip()
    return int(raw) if raw else default


def headers() -> st.SearchStrategy[bytes]:
    """Frame headers biased towards the interesting values, followed by a little data."""
    length = st.one_of(
        st.integers(0, 40), st.sampled_from([MAX_DATA_LENGTH, MAX_DATA_LENGTH + 1, 2**32 - 1])
    )
    stream_id = st.one_of(st.integers(0, 9), st.just(2**32 - 1))
    return st.builds(
        lambda n, sid, t, f, data: (
            n.to_bytes(4, "big") + sid.to_bytes(4, "big") + bytes([t, f]) + data
        ),
        length,
        stream_id,
        st.integers(0, 4),
        st.integers(0, 255),
        st.binary(max_size=40),
    )


chunks = st.lists(st.one_of(st.binary(max_size=60), headers()), max_size=15)


@settings(max_examples=examples(400), deadline=None)
@given(chunks)
def test_server_fuzz(pieces: list[bytes]) -> None:
    server = TTRPCServerConnection()
    try:
        for piece in pieces:
            for event in server.receive_data(piece):
                assert isinstance(event, RequestReceived | RequestRejected)
            assert server.pending_bytes <= BOUND
            for message in server.messages_to_send():
                assert len(message) <= BOUND
        server.receive_eof()
    except ProtocolError:
        pass


@settings(max_examples=examples(400), deadline=None)
@given(chunks, st.integers(0, 6))
def test_client_fuzz(pieces: list[bytes], calls: int) -> None:
    client = TTRPCClientConnection()
    for _ in range(calls):
        client.send_request("s", "m")
    try:
        for piece in pieces:
            for event in client.receive_data(piece):
                assert isinstance(event, ResponseReceived | ResponseDropped)
            assert client.pending_bytes <= BOUND
        client.receive_eof()
    except ProtocolError:
        pass


text = st.text(max_size=30)
metadata = st.lists(st.tuples(text, text), max_size=3)
results = st.one_of(
    st.binary(max_size=200),
    st.builds(Status, st.integers(1, 16) | st.integers(-(2**31), -1), text),
)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(text, text, st.binary(max_size=300), st.integers(0, 2**63 - 1), metadata),
        min_size=1,
        max_size=5,
    ),
    st.data(),
)
def test_round_trip_client_server_client(
    calls: list[tuple[str, str, bytes, int, list[tuple[str, str]]]], data: st.DataObject
) -> None:
    client = TTRPCClientConnection()
    server = TTRPCServerConnection()
    ids = [
        client.send_request(svc, method, payload, timeout_nano=timeout, metadata=md)
        for svc, method, payload, timeout, md in calls
    ]
    received = server.receive_data(client.data_to_send())
    assert received == [
        RequestReceived(sid, svc, method, payload, timeout, tuple(md))
        for sid, (svc, method, payload, timeout, md) in zip(ids, calls, strict=True)
    ]
    order = data.draw(st.permutations(ids))
    answers = {sid: data.draw(results) for sid in order}
    for sid in order:
        server.send_response(sid, answers[sid])
    assert server.awaiting_response == frozenset()
    replies = client.receive_data(server.data_to_send())
    assert replies == [ResponseReceived(sid, answers[sid]) for sid in order]
    assert client.in_flight == frozenset()
