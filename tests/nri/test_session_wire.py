"""The session and the simulator against hand-driven peers: registration order, paging,
unknown methods, golden bytes, and the runtime's deadlines (protocols.md 5-6)."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from builders import nri_container, nri_pod

from dracpu.allocation.store import AllocationStore, ClaimRecord
from dracpu.cpuset import CPUSet
from dracpu.nri.handlers import EVENT_MASK, PluginHandlers
from dracpu.nri.mux import Multiplexer, MuxData
from dracpu.nri.peer import PLUGIN_SERVICE, RUNTIME_SERVICE, CallFailed, MuxPeer
from dracpu.nri.plugin import NRIPlugin
from dracpu.nri.session import NRI_API_VERSION, NRISession
from dracpu.nri.ttrpc import RequestReceived, StatusCode, TTRPCClientConnection
from dracpu.nursery.backoff import restart_delay
from dracpu.proto.nri import api_pb2
from dracpu.state import NodeState
from dracpu_sim.runtime import RuntimeSimulator


def make_plugin() -> tuple[NRIPlugin, NodeState]:
    state = NodeState(AllocationStore(CPUSet.parse("0-7"), CPUSet()))
    return NRIPlugin(state), state


class RawRuntime:
    """A runtime written by hand on MuxPeer, so tests decide what happens when."""

    def __init__(self) -> None:
        self.requests: list[RequestReceived] = []
        self.peer: MuxPeer | None = None
        self.register = trio.Event()

    async def on_request(self, request: RequestReceived) -> None:
        self.requests.append(request)
        if request.method == "RegisterPlugin":
            self.register.set()  # the reply is sent by the test, when it chooses

    async def call(self, method: str, message: object, service: str = PLUGIN_SERVICE) -> bytes:
        assert self.peer is not None
        payload = message if isinstance(message, bytes) else message.SerializeToString()  # type: ignore[attr-defined]
        return await self.peer.call(service, method, payload, timeout=2.0)


@asynccontextmanager
async def raw_runtime(
    sock_dir: str,
) -> AsyncIterator[tuple[RawRuntime, NRISession, NodeState]]:
    path = os.path.join(sock_dir, "nri.sock")
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(1)
    runtime = RawRuntime()
    plugin, state = make_plugin()
    session = NRISession(path, plugin, reconnect_backoff=(0.01, 0.05))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.run)
        conn, _ = await sock.accept()
        stream = trio.SocketStream(conn)
        runtime.peer = MuxPeer(stream, serve_conn=2, call_conn=1, on_request=runtime.on_request)
        nursery.start_soon(runtime.peer.run)
        await runtime.register.wait()
        yield runtime, session, state
        nursery.cancel_scope.cancel()
    sock.close()


async def test_configure_and_paged_synchronize_before_register_reply(short_tmp: str) -> None:
    async with raw_runtime(short_tmp) as (runtime, session, state):
        [reg] = runtime.requests
        assert (reg.service, reg.method) == (RUNTIME_SERVICE, "RegisterPlugin")
        body = api_pb2.RegisterPluginRequest.FromString(reg.payload)
        assert (body.plugin_name, body.plugin_idx) == ("dra.cpu", "00")

        reply = api_pb2.ConfigureResponse.FromString(
            await runtime.call("Configure", api_pb2.ConfigureRequest(runtime_name="raw"))
        )
        assert reply.events == EVENT_MASK == 0x060F
        first = api_pb2.SynchronizeRequest(
            pods=[nri_pod("p1")], containers=[nri_container("p1", "c1")], more=True
        )
        page = api_pb2.SynchronizeResponse.FromString(await runtime.call("Synchronize", first))
        assert page.more and not page.update
        assert not session.is_synchronized
        last = api_pb2.SynchronizeRequest(
            pods=[nri_pod("p2")], containers=[nri_container("p2", "c2")]
        )
        final = api_pb2.SynchronizeResponse.FromString(await runtime.call("Synchronize", last))
        assert not final.more
        assert [
            (u.container_id, u.linux.resources.cpu.cpus, u.ignore_failure) for u in final.update
        ] == [
            ("c1", "0-7", True),
            ("c2", "0-7", True),
        ]
        assert session.is_synchronized
        assert len(state.view.containers()) == 2
        # Only now does the RegisterPlugin reply arrive.
        assert runtime.peer is not None
        await runtime.peer.respond(reg.stream_id, b"")


@pytest.mark.parametrize(
    ("service", "method", "payload", "code", "message"),
    [
        (PLUGIN_SERVICE, "StartContainer", b"", StatusCode.UNIMPLEMENTED, "method StartContainer"),
        ("nri.Other", "Configure", b"", StatusCode.UNIMPLEMENTED, "service nri.Other"),
        (
            PLUGIN_SERVICE,
            "CreateContainer",
            b"\x0a\x05ab",
            StatusCode.INVALID_ARGUMENT,
            "undecodable CreateContainer request",
        ),
    ],
)
async def test_bad_requests_get_clear_errors_and_the_session_keeps_serving(
    short_tmp: str, service: str, method: str, payload: bytes, code: int, message: str
) -> None:
    async with raw_runtime(short_tmp) as (runtime, _session, _):
        with pytest.raises(CallFailed) as err:
            await runtime.call(method, payload, service=service)
        assert err.value.status.code == code
        assert err.value.status.message.startswith(message)
        reply = await runtime.call("Configure", api_pb2.ConfigureRequest())
        assert api_pb2.ConfigureResponse.FromString(reply).events == EVENT_MASK


async def test_shutdown_only_logs(short_tmp: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dracpu.nri")
    async with raw_runtime(short_tmp) as (runtime, _session, _):
        assert await runtime.call("Shutdown", b"") == b""
    assert "runtime shutting down" in caplog.text


async def test_plugin_error_is_an_unknown_status(short_tmp: str) -> None:
    async with raw_runtime(short_tmp) as (runtime, _session, state):
        request = api_pb2.CreateContainerRequest(
            pod=nri_pod("p1"), container=nri_container("p1", "c1", "DRA_CPUSET_A=1")
        )
        with pytest.raises(CallFailed) as err:
            await runtime.call("CreateContainer", request)
        assert err.value.status.code == StatusCode.UNKNOWN
        assert err.value.status.message == 'claim "A" is not prepared by this driver'
        assert len(state.view.containers()) == 0


async def test_configure_reply_golden_bytes(short_tmp: str) -> None:
    """The whole Configure exchange as raw socket bytes (protocols.md 5.5, events 0x60f)."""
    path = os.path.join(short_tmp, "nri.sock")
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(1)
    plugin, _ = make_plugin()
    session = NRISession(path, plugin)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.run)
        conn, _ = await sock.accept()
        client = TTRPCClientConnection()
        client.send_request(PLUGIN_SERVICE, "Configure", b"", timeout_nano=2_000_000_000)
        mux = Multiplexer()
        for message in client.messages_to_send():
            mux.send(1, message)
        await conn.send(mux.data_to_send())
        wire = b""
        conn1 = b""
        while len(conn1) < 15:
            data = await conn.recv(4096)
            assert data
            wire += data
            conn1 += b"".join(
                e.payload
                for e in mux.receive_data(data)
                if isinstance(e, MuxData) and e.conn_id == 1
            )
        golden = bytes.fromhex("00000005 00000001 0200 1203 108f0c".replace(" ", ""))
        assert conn1 == golden
        assert bytes.fromhex("00000001 0000000f".replace(" ", "")) + golden in wire
        nursery.cancel_scope.cancel()
    sock.close()


async def test_register_plugin_request_golden_bytes(short_tmp: str) -> None:
    """RegisterPlugin announces the NRI API level, so containerd logs `with NRI version
    v0.12.2` instead of `unknown` (issue 24)."""
    async with raw_runtime(short_tmp) as (runtime, _session, _):
        [reg] = runtime.requests
        assert reg.payload == bytes.fromhex(
            "0a07 6472612e637075"  # 1 plugin_name "dra.cpu"
            "1202 3030"  # 2 plugin_idx "00"
            "1a07 76302e31322e32"  # 3 nri_version "v0.12.2"
        )
        assert api_pb2.RegisterPluginRequest.FromString(reg.payload).nri_version == (
            NRI_API_VERSION
        )


@pytest.mark.parametrize(
    ("announced", "logged"),
    [
        ("v0.12.3", "the runtime speaks NRI v0.12.3; dracpu announces v0.12.2"),
        ("", "the runtime did not announce its NRI version"),
    ],
)
async def test_the_runtime_nri_version_from_configure_is_logged_and_kept(
    short_tmp: str, caplog: pytest.LogCaptureFixture, announced: str, logged: str
) -> None:
    caplog.set_level(logging.INFO, logger="dracpu.nri")
    async with raw_runtime(short_tmp) as (runtime, session, _):
        configure = api_pb2.ConfigureRequest(runtime_name="raw", nri_version=announced)
        await runtime.call("Configure", configure)
        assert logged in caplog.text
        assert session.runtime_nri_version == announced
        assert session.describe()["runtime_nri_version"] == announced


def test_session_refuses_bad_names() -> None:
    plugin, _ = make_plugin()
    with pytest.raises(ValueError, match="plugin name"):
        NRISession("/x", plugin, plugin_name="dra cpu")
    with pytest.raises(ValueError, match="plugin index"):
        NRISession("/x", plugin, plugin_idx="1")
    with pytest.raises(ValueError, match="backoff"):
        NRISession("/x", plugin, reconnect_backoff=(2.0, 1.0))


def test_reconnect_delay_grows_caps_and_jitters() -> None:
    def reconnect_delay(attempt: int, *, rand: Callable[[], float]) -> float:
        # The session's reconnect schedule: doubling from 0.5 s, capped at 4 s, jittered
        # into [50 %, 100 %].
        return restart_delay(attempt + 1, initial=0.5, factor=2.0, cap=4.0, jitter=0.5, rand=rand)

    delays = [reconnect_delay(a, rand=lambda: 1.0) for a in range(6)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert reconnect_delay(2, rand=lambda: 0.0) == 1.0
    assert reconnect_delay(10_000, rand=lambda: 0.5) == 3.0


# -- the simulator's deadlines ------------------------------------------------------------------


RequestHandler = Callable[[MuxPeer, RequestReceived, trio.Nursery], Awaitable[None]]


@asynccontextmanager
async def raw_plugin(
    sim: RuntimeSimulator, handle_create: RequestHandler | None
) -> AsyncIterator[trio.Event]:
    """A plugin written by hand: registers, subscribes to CreateContainer, syncs with no
    updates, and lets the test decide about CreateContainer. Yields its "closed" event."""
    stream = await trio.open_unix_socket(sim.socket_path)
    closed = trio.Event()
    async with trio.open_nursery() as nursery:
        holder: list[MuxPeer] = []

        async def on_request(request: RequestReceived) -> None:
            peer = holder[0]
            if request.method == "Configure":
                reply = api_pb2.ConfigureResponse(events=0x8).SerializeToString()
                await peer.respond(request.stream_id, reply)
            elif request.method == "Synchronize":
                await peer.respond(request.stream_id, b"")
            elif request.method == "CreateContainer" and handle_create is not None:
                await handle_create(peer, request, nursery)

        peer = MuxPeer(stream, serve_conn=1, call_conn=2, on_request=on_request)
        holder.append(peer)

        async def read() -> None:
            await peer.run()
            closed.set()

        nursery.start_soon(read)
        register = api_pb2.RegisterPluginRequest(plugin_name="raw", plugin_idx="50")
        await peer.call(RUNTIME_SERVICE, "RegisterPlugin", register.SerializeToString(), timeout=5)
        await sim.wait_plugin_ready()
        yield closed
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def running_sim(sock_dir: str, tmp_path: Path) -> AsyncIterator[RuntimeSimulator]:
    sim = RuntimeSimulator(os.path.join(sock_dir, "nri.sock"), str(tmp_path / "cg"))
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run)
        await sim.create_pod("p1", "pod")
        yield sim
        nursery.cancel_scope.cancel()


async def test_plugin_missing_the_2s_deadline_is_dropped(
    short_tmp: str, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async def never_answer(peer: MuxPeer, request: RequestReceived, nursery: trio.Nursery) -> None:
        return None

    async with running_sim(short_tmp, tmp_path) as sim, raw_plugin(sim, never_answer) as closed:
        start = trio.current_time()
        cid = await sim.create_container("p1", "app")
        assert trio.current_time() - start == pytest.approx(2.0)
        assert sim.cpuset_of(cid) == "0-7"  # created unadjusted
        assert sim.dropped_reasons == ["CreateContainer: context deadline exceeded"]
        await closed.wait()
        assert not sim.plugin_ready


async def test_update_containers_inside_a_request_deadlocks_like_containerd(
    short_tmp: str, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    outcome: list[str] = []

    async def update_first(peer: MuxPeer, request: RequestReceived, nursery: trio.Nursery) -> None:
        async def work() -> None:
            try:
                await peer.call(RUNTIME_SERVICE, "UpdateContainers", b"", timeout=5.0)
                outcome.append("answered")
            except Exception as exc:
                outcome.append(type(exc).__name__)

        nursery.start_soon(work)

    async with running_sim(short_tmp, tmp_path) as sim, raw_plugin(sim, update_first) as closed:
        start = trio.current_time()
        await sim.create_container("p1", "app")
        assert trio.current_time() - start == pytest.approx(2.0)
        assert sim.dropped_reasons == ["CreateContainer: context deadline exceeded"]
        await closed.wait()
    assert outcome == ["PeerClosed"]


async def test_plugin_that_never_registers_is_closed(
    short_tmp: str, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_sim(short_tmp, tmp_path) as sim:
        stream = await trio.open_unix_socket(sim.socket_path)
        start = trio.current_time()
        assert await stream.receive_some(100) == b""
        assert trio.current_time() - start == pytest.approx(5.0)
        assert sim.dropped_reasons == ["plugin registration timed out"]
        await stream.aclose()


def test_create_container_reply_golden_bytes() -> None:
    """The CreateContainer reply payload, byte for byte (protocols.md 6.8 field numbers)."""
    plugin, state = make_plugin()
    handlers = PluginHandlers(plugin)
    shared = api_pb2.CreateContainerRequest(pod=nri_pod("p0"), container=nri_container("p0", "s1"))
    assert handlers.handle("CreateContainer", shared.SerializeToString()) == bytes.fromhex(
        # adjust(1) { linux(6) { resources(2) { cpu(2) { cpus(6) = "0-7" } } } }
        "0a0b 3209 1207 1205 3203 302d37".replace(" ", "")
    )
    state.restore([ClaimRecord(uid="A", cpus=CPUSet.parse("0-3"))])
    guaranteed = api_pb2.CreateContainerRequest(
        pod=nri_pod("p1"), container=nri_container("p1", "g1", "DRA_CPUSET_A=0-3")
    )
    assert handlers.handle("CreateContainer", guaranteed.SerializeToString()) == bytes.fromhex(
        "0a0b 3209 1207 1205 3203 302d33"  # adjust: cpus "0-3"
        # update(2) { container_id(1) "s1", linux(2) { resources(1) { cpu(2) {
        #   cpus(6) "4-7" } } }, ignore_failure(3) true }
        "1211 0a02 7331 1209 0a07 1205 3203 342d37 1801".replace(" ", "")
    )


def test_synchronize_page_reply_golden_bytes() -> None:
    plugin, _ = make_plugin()
    handlers = PluginHandlers(plugin)
    page = api_pb2.SynchronizeRequest(pods=[nri_pod("p1")], more=True)
    assert handlers.sync_chunk(page.SerializeToString()) is None
    assert bytes.fromhex("1001") == PluginHandlers.MORE  # more(2)
    final = handlers.sync_chunk(b"")
    assert final is not None and [p.uid for p in final.pods] == ["p1"]
    assert handlers.finish_sync(final, {}) == b""  # final chunk, nothing to update


async def test_large_reply_is_sent_as_4096_bytes_then_the_rest(short_tmp: str) -> None:
    """The Go reader's 4096-byte buffer rule (protocols.md 6.2) on a real Synchronize reply."""
    path = os.path.join(short_tmp, "nri.sock")
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(1)
    plugin, _ = make_plugin()
    session = NRISession(path, plugin)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.run)
        conn, _ = await sock.accept()
        sync = api_pb2.SynchronizeRequest(
            pods=[nri_pod("p1")], containers=[nri_container("p1", f"c{i:04d}") for i in range(300)]
        )
        client = TTRPCClientConnection()
        client.send_request(PLUGIN_SERVICE, "Synchronize", sync.SerializeToString())
        mux = Multiplexer()
        for message in client.messages_to_send():
            mux.send(1, message)
        await conn.send(mux.data_to_send())
        frames: list[tuple[int, int]] = []
        wire = b""
        while sum(n for c, n in frames if c == 1) < 4096 + 1:
            data = await conn.recv(65536)
            assert data
            wire += data
            while len(wire) >= 8:
                conn_id, length = int.from_bytes(wire[:4]), int.from_bytes(wire[4:8])
                if len(wire) < 8 + length:
                    break
                frames.append((conn_id, length))
                wire = wire[8 + length :]
        replies = [n for c, n in frames if c == 1]
        assert replies[0] == 4096
        assert len(replies) == 2
        nursery.cancel_scope.cancel()
    sock.close()
