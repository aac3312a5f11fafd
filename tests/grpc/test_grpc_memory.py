"""Large requests leave no buffer behind, and the heap is handed back after a burst.

The decoder keeps a message as the pieces that arrived and nothing once it is out; the
connection counts the request bytes it drops; the shell holds no request while it waits
and notes large ones to the heap's ``Reclaimer``, which releases memory once per burst.
"""

from __future__ import annotations

import platform
import weakref
from functools import partial
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
import trio
import trio.testing
from builders import grpc_headers, h2_pair
from grpc_harness import (
    PREPARE,
    Observed,
    all_handlers,
    in_thread,
    prepare_request,
    prepare_stub,
    socket_path,
)

from dracpu import heap
from dracpu.grpc import serve_unix
from dracpu.grpc.connection import GRPCServerConnection, RequestReceived
from dracpu.grpc.framing import PREFIX_SIZE, MessageDecoder, encode_message
from dracpu.heap import Reclaimer

MiB = 1024 * 1024

# -- the decoder -----------------------------------------------------------------------------


def test_message_over_many_reads_is_joined_once_and_nothing_stays() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    wire = encode_message(payload)
    dec = MessageDecoder()
    out: list[bytes] = []
    for i in range(0, len(wire), 16384):
        out += dec.feed(wire[i : i + 16384])
        if not out:
            assert dec.buffered == min(i + 16384, len(wire))
    assert out == [payload]
    assert dec.buffered == 0
    assert dec._pieces == [] and dec._prefix == b""
    dec.finish()


def test_pieces_are_not_copied_when_a_read_is_all_body() -> None:
    dec = MessageDecoder()
    dec.feed(b"\x00\x00\x00\x01\x00")  # 256 bytes to come
    body = b"x" * 128
    assert dec.feed(body) == []
    assert dec._pieces[0] is body


def test_refused_message_releases_what_was_kept() -> None:
    dec = MessageDecoder(max_size=8)
    dec.feed(encode_message(b"1234")[:7])  # two of four bytes kept
    assert dec.buffered == PREFIX_SIZE + 2
    with pytest.raises(Exception, match="larger than max"):
        dec.feed(b"34" + b"\x00\x00\x00\x00\x09")
    assert dec.buffered == 0 and dec._pieces == []


# -- the connection ---------------------------------------------------------------------------


HEADERS = grpc_headers(PREPARE.encode())


def _send(
    server: GRPCServerConnection, client: h2.connection.H2Connection, sid: int, body: bytes
) -> list[Any]:
    client.send_headers(sid, HEADERS)
    events: list[Any] = []
    for i in range(0, len(body), 16384):
        if client.streams[sid].closed:
            break  # answered early and reset by the server
        client.send_data(sid, body[i : i + 16384])
        events += server.receive_data(client.data_to_send())
        client.receive_data(server.data_to_send())
    return events


def test_a_handed_over_request_is_not_counted_as_dropped() -> None:
    server, client = h2_pair()
    _send(server, client, 1, encode_message(b"x" * 60000))
    client.end_stream(1)
    (event,) = server.receive_data(client.data_to_send())
    assert isinstance(event, RequestReceived) and len(event.message) == 60000
    assert server.buffered_request_bytes == 0
    assert server.dropped_request_bytes == 0


def test_request_bytes_dropped_by_a_reset_are_counted() -> None:
    server, client = h2_pair()
    _send(server, client, 1, encode_message(b"x" * 60000)[:50000])
    assert server.buffered_request_bytes == 50000
    client.reset_stream(1)
    server.receive_data(client.data_to_send())
    assert server.buffered_request_bytes == 0
    assert server.dropped_request_bytes == 50000


def test_request_bytes_over_the_connection_budget_are_counted() -> None:
    server, client = h2_pair(max_connection_buffer=100_000)
    _send(server, client, 1, encode_message(b"x" * 200_000)[:60000])
    _send(server, client, 3, encode_message(b"x" * 200_000)[:60000])
    # The second stream crossed the budget with its third frame of 16 KiB: the three are
    # let go of, and the rest of its message is not kept either.
    assert server.buffered_request_bytes == 60000
    assert server.dropped_request_bytes == 3 * 16384


# -- the reclaimer ----------------------------------------------------------------------------


class Releases:
    def __init__(self) -> None:
        self.at: list[float] = []

    def __call__(self) -> None:
        self.at.append(trio.current_time())


def _reclaimer(releases: Releases) -> Reclaimer:
    return Reclaimer(large=1000, after=4000, quiet=0.25, interval=3.0, release=releases)


async def _note(reclaimer: Reclaimer, nursery: trio.Nursery, size: int) -> None:
    if reclaimer.note(size):
        nursery.start_soon(reclaimer.release_when_due)


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_small_requests_never_make_a_release_due() -> None:
    releases = Releases()
    reclaimer = _reclaimer(releases)
    assert not any(reclaimer.note(999) for _ in range(1000))


async def test_one_release_after_the_burst_is_quiet(mock_clock: trio.testing.MockClock) -> None:
    releases = Releases()
    reclaimer = _reclaimer(releases)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(10):
            await _note(reclaimer, nursery, 2000)
            await trio.sleep(0.1)
    # The last note came at start + 0.9; a quarter of a second later the burst was over.
    assert releases.at == [pytest.approx(start + 0.9 + 0.25)]
    assert reclaimer.releases == 1


async def test_releases_are_an_interval_apart(mock_clock: trio.testing.MockClock) -> None:
    releases = Releases()
    reclaimer = _reclaimer(releases)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        await _note(reclaimer, nursery, 5000)
        await trio.sleep(1.0)  # released at 0.25
        await _note(reclaimer, nursery, 5000)  # a second burst at 1.0
    assert releases.at == [pytest.approx(start + 0.25), pytest.approx(start + 3.25)]


async def test_a_flood_costs_one_release_per_interval(mock_clock: trio.testing.MockClock) -> None:
    releases = Releases()
    reclaimer = _reclaimer(releases)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(100):  # 10 s of large requests, never quiet
            await _note(reclaimer, nursery, 5000)
            await trio.sleep(0.1)
    gaps = [b - a for a, b in zip([start, *releases.at], releases.at, strict=False)]
    assert 3 <= len(releases.at) <= 4, releases.at
    assert all(gap >= 3.0 - 1e-9 for gap in gaps), gaps


async def test_a_failing_release_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise OSError("no")

    reclaimer = Reclaimer(large=1, after=1, quiet=0.0, interval=0.0, release=broken)
    async with trio.open_nursery() as nursery:
        await _note(reclaimer, nursery, 10)
    assert reclaimer.releases == 1
    assert "releasing memory after large requests failed" in caplog.text


async def test_release_memory_collects_and_trims() -> None:
    class Cycle:
        me: Any = None

    cycle = Cycle()
    cycle.me = cycle
    gone = weakref.ref(cycle)
    del cycle
    await heap.release_memory()
    assert gone() is None
    # glibc: the trim function is found; elsewhere it is None and trimming is skipped.
    assert (heap._malloc_trim() is not None) == (platform.libc_ver()[0] == "glibc")


def test_times_of_another_trio_run_are_forgotten() -> None:
    releases = Releases()
    reclaimer = _reclaimer(releases)

    async def burst(after: float) -> None:
        await trio.sleep(after)
        async with trio.open_nursery() as nursery:
            await _note(reclaimer, nursery, 5000)

    # The first run ends on a clock far ahead; the second must not wait for it.
    trio.run(burst, 1e6, clock=trio.testing.MockClock(autojump_threshold=0))
    trio.run(burst, 0, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(releases.at) == 2 and releases.at[1] < 1e6


# -- the shell -------------------------------------------------------------------------------


async def test_large_calls_are_released_after_they_end(nursery: trio.Nursery) -> None:
    releases = Releases()
    reclaimer = Reclaimer(large=64 * 1024, after=MiB, quiet=0.1, interval=0.5, release=releases)
    path = socket_path()
    seen = Observed()
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[None]) -> None:
        with scope:
            await serve_unix(path, all_handlers(seen), reclaimer=reclaimer, task_status=task_status)

    await nursery.start(run)
    channel = grpc.insecure_channel(
        "unix:" + path, options=[("grpc.max_send_message_length", 8 * MiB)]
    )
    try:
        call = prepare_stub(channel)
        for _ in range(20):  # small calls: nothing to release
            await in_thread(partial(call, prepare_request("a"), timeout=10))
        await trio.sleep(0.3)
        assert releases.at == []
        big = prepare_request("n" * (MiB + 1024))
        await in_thread(partial(call, big, timeout=10))
        with trio.fail_after(10):
            while not releases.at:
                await trio.sleep(0.05)
        assert reclaimer.releases == 1
    finally:
        channel.close()
        scope.cancel()
