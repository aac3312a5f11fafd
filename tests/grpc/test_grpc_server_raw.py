"""The Trio server seen from a bare h2 client: exact frames, server-side deadlines, GOAWAY."""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing
from grpc_harness import PREPARE, Observed, RawClient, all_handlers, prepare_request, socket_path
from h2.errors import ErrorCodes

from dracpu.grpc import serve_unix
from dracpu.grpc.framing import encode_message

GRPC_OK = [(b"grpc-status", b"0")]


async def _start(
    nursery: trio.Nursery, grace: float = 2.0
) -> tuple[str, Observed, trio.CancelScope]:
    path, seen, scope = socket_path(), Observed(), trio.CancelScope()

    async def run(task_status: trio.TaskStatus[None]) -> None:
        try:
            with scope:
                await serve_unix(
                    path, all_handlers(seen), grace_period=grace, task_status=task_status
                )
        finally:
            seen.stopped.set()

    await nursery.start(run)
    return path, seen, scope


def body(*names: str) -> bytes:
    return encode_message(prepare_request(*names).SerializeToString())


async def test_unary_response_frames(nursery: trio.Nursery) -> None:
    path, _, _ = await _start(nursery)
    client = await RawClient.connect(path)
    resp = await client.call(PREPARE, body("a"))
    assert resp.headers == [(b":status", b"200"), (b"content-type", b"application/grpc")]
    assert resp.data[:1] == b"\x00"
    assert int.from_bytes(resp.data[1:5], "big") == len(resp.data) - 5
    assert resp.trailers == GRPC_OK
    await client.aclose()


async def test_status_message_bytes_on_the_wire(nursery: trio.Nursery) -> None:
    path, _, _ = await _start(nursery)
    client = await RawClient.connect(path)
    resp = await client.call(PREPARE, body("fail"))
    assert resp.headers == [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", b"9"),
        (b"grpc-message", b"bad: 100%25 %C3%BCn%C3%AF%0A"),
    ]
    await client.aclose()


async def test_server_side_deadline(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    path, seen, _ = await _start(nursery)
    client = await RawClient.connect(path)
    start = trio.current_time()
    resp = await client.call(PREPARE, body("block"), extra=[(b"grpc-timeout", b"5S")])
    assert trio.current_time() - start == pytest.approx(5.0)
    assert resp.headers[2:] == [(b"grpc-status", b"4"), (b"grpc-message", b"deadline exceeded")]
    assert seen.cancelled.is_set()
    await client.aclose()


async def test_bad_timeout_header(nursery: trio.Nursery) -> None:
    path, seen, _ = await _start(nursery)
    client = await RawClient.connect(path)
    resp = await client.call(PREPARE, body("a"), extra=[(b"grpc-timeout", b"1x")])
    assert resp.headers[2:] == [
        (b"grpc-status", b"3"),
        (b"grpc-message", b"invalid grpc-timeout: '1x'"),
    ]
    assert seen.metadata == []  # the handler never ran
    await client.aclose()


async def test_goaway_on_shutdown(nursery: trio.Nursery) -> None:
    path, seen, scope = await _start(nursery)
    client = await RawClient.connect(path)
    resp = await client.call(PREPARE, body("a"))
    assert resp.trailers == GRPC_OK
    scope.cancel()
    await client.until(lambda: client.eof)
    assert client.goaway is not None
    assert (client.goaway.error_code, client.goaway.last_stream_id) == (ErrorCodes.NO_ERROR, 1)
    await seen.stopped.wait()
    assert not os.path.exists(path)
    await client.aclose()


async def test_shutdown_lets_in_flight_call_finish(nursery: trio.Nursery) -> None:
    path, seen, scope = await _start(nursery)
    client = await RawClient.connect(path)
    sid = await client.start(PREPARE, body("wait"))
    await seen.started.wait()
    scope.cancel()
    await client.until(lambda: client.goaway is not None)
    assert client.goaway is not None
    assert (client.goaway.error_code, client.goaway.last_stream_id) == (ErrorCodes.NO_ERROR, sid)
    assert not client.eof
    seen.release.set()
    await client.until(lambda: client.eof)
    assert client.responses[sid].trailers == GRPC_OK
    await client.aclose()


async def test_shutdown_grace_expires(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    path, seen, scope = await _start(nursery, grace=3.0)
    client = await RawClient.connect(path)
    sid = await client.start(PREPARE, body("block"))
    await seen.started.wait()
    start = trio.current_time()
    scope.cancel()
    await client.until(lambda: client.eof)
    assert trio.current_time() - start == pytest.approx(3.0)
    assert seen.cancelled.is_set()
    assert client.responses[sid].trailers == []
    await client.aclose()


async def test_client_reset_mid_call(nursery: trio.Nursery) -> None:
    path, seen, _ = await _start(nursery)
    client = await RawClient.connect(path)
    sid = await client.start(PREPARE, body("block"))
    await seen.started.wait()
    client.h2.reset_stream(sid, ErrorCodes.CANCEL)
    await client.flush()
    await seen.cancelled.wait()
    resp = await client.call(PREPARE, body("a"))  # the connection keeps serving
    assert resp.trailers == GRPC_OK
    await client.aclose()


async def test_garbage_closes_only_that_connection(nursery: trio.Nursery) -> None:
    path, _, _ = await _start(nursery)
    bad = await trio.open_unix_socket(path)
    await bad.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    received = b""
    while chunk := await bad.receive_some(65536):
        received += chunk
    assert received  # server preface and GOAWAY, then EOF
    await bad.aclose()
    client = await RawClient.connect(path)
    assert (await client.call(PREPARE, body("a"))).trailers == GRPC_OK
    await client.aclose()
