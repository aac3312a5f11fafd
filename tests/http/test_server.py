"""The Trio shell: §15 timeouts and graceful shutdown under MockClock over memory streams,
then real TCP sockets with the stdlib http.client as the client."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Callable

import h11
import pytest
import trio
import trio.testing
from fixed_views import FixedDebug, fixed_readiness
from prometheus_client import CollectorRegistry

from dracpu.http import HTTPApp, HTTPLimits, HTTPServer, parse_bind_address, serve_http
from dracpu.http.server import ListenError
from dracpu.metrics import DriverMetrics
from dracpu.nursery import Readiness


def make_app() -> HTTPApp:
    app = HTTPApp(readiness=fixed_readiness({"nri": True}))
    app.mark_started()
    return app


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


async def read_reply(stream: trio.abc.Stream, conn: h11.Connection | None = None) -> Reply | None:
    """One response parsed with an h11 client; None if the server closed first."""
    conn = conn or h11.Connection(h11.CLIENT)
    response: h11.Response | None = None
    body = b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
            continue
        if isinstance(event, h11.ConnectionClosed):
            return None
        if isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert response is not None
            headers = {k.decode(): v.decode() for k, v in response.headers}
            return Reply(response.status_code, headers, body)


async def read_to_eof(stream: trio.abc.Stream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


GET_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


# -- timeouts (MockClock, memory streams) ---------------------------------------------


async def test_header_timeout_answers_408(autojump_clock: trio.testing.MockClock) -> None:
    client, server_end = trio.testing.memory_stream_pair()
    server = HTTPServer(make_app())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_connection, server_end)
        await trio.sleep(1)
        await client.send_all(b"GET /hea")
        data = await read_to_eof(client)
    assert trio.current_time() == 5.0  # measured from accept, as Go does
    assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert data.endswith(b"408 Request Timeout: timed out reading the request headers\n")


async def test_silent_new_connection_is_closed_after_the_header_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client, server_end = trio.testing.memory_stream_pair()
    server = HTTPServer(make_app())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_connection, server_end)
        assert await read_to_eof(client) == b""
    assert trio.current_time() == 5.0
    assert server.open_connections == 0


async def test_body_read_timeout_is_10s(autojump_clock: trio.testing.MockClock) -> None:
    client, server_end = trio.testing.memory_stream_pair()
    server = HTTPServer(make_app())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_connection, server_end)
        await client.send_all(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
        await trio.sleep(8)
        await client.send_all(b"abc")  # trickling does not extend the deadline
        data = await read_to_eof(client)
    assert trio.current_time() == 10.0
    assert data.endswith(b"408 Request Timeout: timed out reading the request body\n")


async def test_keep_alive_then_idle_timeout(autojump_clock: trio.testing.MockClock) -> None:
    client, server_end = trio.testing.memory_stream_pair()
    server = HTTPServer(make_app())
    conn = h11.Connection(h11.CLIENT)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_connection, server_end)
        for _ in range(3):
            request = h11.Request(method="GET", target="/healthz", headers=[("host", "x")])
            await client.send_all(conn.send(request) + conn.send(h11.EndOfMessage()))
            reply = await read_reply(client, conn)
            assert reply is not None and reply.status == 200
            conn.start_next_cycle()
            await trio.sleep(100)  # below the idle timeout: the connection stays
        # 100 s already idle; the server closes 120 s after the last response.
        assert await read_to_eof(client) == b""
    assert trio.current_time() == 2 * 100 + 120.0
    assert server.connections_served == 1


async def test_write_timeout_drops_a_client_that_does_not_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client, server_end = trio.testing.lockstep_stream_pair()
    server = HTTPServer(make_app())
    ended: list[float] = []

    async def serve() -> None:
        await server.serve_connection(server_end)
        ended.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await trio.sleep(1)
        await client.send_all(GET_HEALTHZ)
        await trio.sleep(30)
    assert ended == [11.0]  # the write began at 1 s and was given 10 s
    assert server.open_connections == 0


async def test_custom_limits(autojump_clock: trio.testing.MockClock) -> None:
    client, server_end = trio.testing.memory_stream_pair()
    server = HTTPServer(make_app(), limits=HTTPLimits(read_header_timeout=1.5))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve_connection, server_end)
        await client.send_all(b"GET")
        await read_to_eof(client)
    assert trio.current_time() == 1.5


# -- graceful shutdown (MockClock, a listener over memory streams) --------------------


class MemoryListener(trio.abc.Listener[trio.abc.Stream]):
    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[trio.abc.Stream](10)
        self.closed = False

    async def connect(
        self, pair: Callable[[], tuple[trio.abc.Stream, trio.abc.Stream]]
    ) -> trio.abc.Stream:
        client, server_end = pair()
        await self._send.send(server_end)
        return client

    async def accept(self) -> trio.abc.Stream:
        return await self._receive.receive()

    async def aclose(self) -> None:
        self.closed = True
        await trio.lowlevel.checkpoint()


async def test_shutdown_finishes_a_response_being_written(
    autojump_clock: trio.testing.MockClock,
) -> None:
    listener = MemoryListener()
    server = HTTPServer(make_app())
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve_on, [listener])
        slow = await listener.connect(trio.testing.lockstep_stream_pair)
        idle = await listener.connect(trio.testing.memory_stream_pair)
        await slow.send_all(GET_HEALTHZ)  # its answer waits for the reader
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True):
            assert await read_to_eof(idle) == b""  # idle connections close at once
            await trio.sleep(2)
            data = await read_to_eof(slow)
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert trio.current_time() == 2.0
    assert listener.closed


async def test_shutdown_gives_up_on_a_stuck_write_after_the_grace_period(
    autojump_clock: trio.testing.MockClock,
) -> None:
    listener = MemoryListener()
    server = HTTPServer(make_app(), grace_period=3.0)
    with trio.move_on_after(1):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve_on, [listener])
            stuck = await listener.connect(trio.testing.lockstep_stream_pair)
            await stuck.send_all(GET_HEALTHZ)
            await trio.sleep_forever()
    # cancelled at 1 s; the write is abandoned 3 s later (before its own 10 s limit)
    assert trio.current_time() == 4.0
    assert server.open_connections == 0


# -- real sockets (stdlib http.client as the client) ----------------------------------


def fetch(
    port: int, path: str, method: str = "GET", host: str = "127.0.0.1"
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


async def test_real_socket_endpoints_and_ephemeral_port() -> None:
    registry = CollectorRegistry()
    metrics = DriverMetrics(registry)
    metrics.set_snapshot(allocated=2, available=10, reserved=0, active=1)
    readiness = Readiness()
    readiness.declare("kubelet-registration").set_ready()
    nri = readiness.declare("nri")
    nri.set_not_ready("")
    app = HTTPApp(registry=registry, readiness=readiness.view())
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_http, "127.0.0.1", 0, app)
        assert port > 0
        status, _, body = await trio.to_thread.run_sync(fetch, port, "/healthz")
        assert (status, body) == (503, b"")
        app.mark_started()
        status, _, body = await trio.to_thread.run_sync(fetch, port, "/healthz")
        assert (status, body) == (200, b"")
        status, headers, body = await trio.to_thread.run_sync(fetch, port, "/metrics")
        assert status == 200
        assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert b"dra_cpu_allocated_cpus 2.0" in body
        status, headers, body = await trio.to_thread.run_sync(fetch, port, "/metrics", "HEAD")
        assert status == 200 and body == b"" and int(headers["content-length"]) > 100
        status, _, body = await trio.to_thread.run_sync(fetch, port, "/readyz")
        assert status == 503
        assert body == b"[+] kubelet-registration ok\n[-] nri: not ready\nreadyz check failed\n"
        nri.set_ready()
        assert (await trio.to_thread.run_sync(fetch, port, "/readyz"))[:3:2] == (200, b"ok")
        assert (await trio.to_thread.run_sync(fetch, port, "/debug/state"))[0] == 404
        assert (await trio.to_thread.run_sync(fetch, port, "/healthz", "POST"))[0] == 405
        nursery.cancel_scope.cancel()
    with pytest.raises(ConnectionRefusedError):
        await trio.to_thread.run_sync(fetch, port, "/healthz")


async def test_keep_alive_over_a_real_socket() -> None:
    server = HTTPServer(make_app())
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, "127.0.0.1", 0)

        def three_requests() -> list[int]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            statuses = []
            for path in ("/healthz", "/readyz", "/nope"):
                conn.request("GET", path)
                response = conn.getresponse()
                response.read()
                statuses.append(response.status)
            conn.close()
            return statuses

        assert await trio.to_thread.run_sync(three_requests) == [200, 200, 404]
        assert server.connections_served == 1
        nursery.cancel_scope.cancel()


async def test_debug_listener_serves_only_debug_state() -> None:
    main = make_app()
    debug = HTTPApp.debug_only(FixedDebug({"sharedPool": "0-3", "claims": {}}))
    async with trio.open_nursery() as nursery:
        main_port = await nursery.start(serve_http, "127.0.0.1", 0, main)
        host, port = parse_bind_address("127.0.0.1:0")
        debug_port = await nursery.start(serve_http, host, port, debug)
        status, headers, body = await trio.to_thread.run_sync(fetch, debug_port, "/debug/state")
        assert status == 200 and headers["content-type"] == "application/json"
        assert body == b'{\n  "sharedPool": "0-3",\n  "claims": {}\n}\n'
        assert (await trio.to_thread.run_sync(fetch, debug_port, "/healthz"))[0] == 404
        assert (await trio.to_thread.run_sync(fetch, main_port, "/debug/state"))[0] == 404
        nursery.cancel_scope.cancel()


async def test_bad_requests_over_a_real_socket_and_the_server_keeps_serving() -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_http, "127.0.0.1", 0, make_app())

        def raw(data: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(data)
                chunks = []
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
                return b"".join(chunks)

        garbage = await trio.to_thread.run_sync(raw, b"\x16\x03\x01 not http\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400 Bad Request\r\n")
        big = b"GET / HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 20000 + b"\r\n\r\n"
        assert (await trio.to_thread.run_sync(raw, big)).startswith(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        )
        body = b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
        reply = await trio.to_thread.run_sync(raw, body)
        assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n")
        assert reply.endswith(b"400 Bad Request: GET requests must not have a body\n")
        assert (await trio.to_thread.run_sync(fetch, port, "/healthz"))[0] == 200
        nursery.cancel_scope.cancel()


async def test_all_interfaces_with_ephemeral_port() -> None:
    host, port = parse_bind_address(":0")
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(serve_http, host, port, make_app())
        assert (await trio.to_thread.run_sync(fetch, bound, "/healthz"))[0] == 200
        if socket.has_ipv6:
            try:
                status = (await trio.to_thread.run_sync(fetch, bound, "/healthz", "GET", "::1"))[0]
            except OSError:
                status = 200  # no IPv6 loopback in this environment
            assert status == 200
        nursery.cancel_scope.cancel()


async def test_port_in_use_is_a_listen_error_caused_by_the_oserror() -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_http, "127.0.0.1", 0, make_app())
        with pytest.raises(ListenError, match=f"cannot listen on 127.0.0.1:{port} ") as info:
            await serve_http("127.0.0.1", port, make_app())
        assert isinstance(info.value.__cause__, OSError)
        assert "Address already in use" in str(info.value.__cause__)
        nursery.cancel_scope.cancel()


async def test_bad_grace_period() -> None:
    with pytest.raises(ValueError, match="grace_period must be >= 0, got -1"):
        await serve_http("127.0.0.1", 0, make_app(), grace_period=-1)
