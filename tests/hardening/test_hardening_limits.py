"""Every input has a size limit, and who can reach the listeners is narrow by default.

Limits: a gRPC message (4 MiB, grpc-go's), the h2 header list (8 KiB, advertised and
enforced; the encoded block is refused from the frame headers above 8 KiB, before it is
decoded), a grpc-message the server sends (4 KiB encoded), request bytes held per gRPC
connection (16 MiB over all streams), claims per
NodePrepareResources / NodeUnprepareResources call (91,180: as many of the smallest claims a
kubelet sends as fit in one message), a ttrpc frame (4 MiB), and the
HTTP request head (16 KiB). Listeners: the kubelet sockets are 0600 in 0750 directories
whatever the umask; ``/debug/state`` listens on loopback only by default.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest
import trio
from builders import grpc_headers, h2_pair
from fixed_views import FixedDebug
from grpclib.const import Status
from h2.errors import ErrorCodes
from hyperframe.frame import ContinuationFrame, HeadersFrame
from kubelet_harness import (
    claim,
    in_thread,
    make_node,
    prepare_request,
    prepare_stub,
    rpc_error,
    serving,
    short_dir,
    start_plugin,
    unprepare_request,
    unprepare_stub,
)

from dracpu.allocation.prepare import ClaimAllocation
from dracpu.config import DriverConfig
from dracpu.grpc.connection import (
    MAX_CONNECTION_BUFFER,
    MAX_HEADER_BLOCK_SIZE,
    MAX_HEADER_LIST_SIZE,
    ConnectionClosed,
    GRPCServerConnection,
    RequestReceived,
)
from dracpu.grpc.errors import ServerError
from dracpu.grpc.framing import MAX_MESSAGE_SIZE, encode_message
from dracpu.grpc.status import MAX_STATUS_MESSAGE
from dracpu.http import HTTPApp
from dracpu.http.address import parse_bind_address
from dracpu.http.connection import HTTPLimits, ServerConnection
from dracpu.http.server import serve_http
from dracpu.kubelet import HealthService, KubeletPlugin
from dracpu.kubelet.dra import MAX_CLAIMS_PER_CALL, SMALLEST_KUBELET_CLAIM_BYTES
from dracpu.nri.ttrpc import (
    MAX_DATA_LENGTH,
    RequestRejected,
    StatusCode,
    TTRPCServerConnection,
)

GOOD = grpc_headers()


def test_limits_are_the_documented_ones() -> None:
    assert MAX_MESSAGE_SIZE == 4 * 1024 * 1024
    assert MAX_HEADER_LIST_SIZE == 8 * 1024
    assert MAX_HEADER_BLOCK_SIZE == 8 * 1024
    assert MAX_STATUS_MESSAGE == 4 * 1024
    assert MAX_CONNECTION_BUFFER == 16 * 1024 * 1024
    assert MAX_CLAIMS_PER_CALL == 91_180
    assert MAX_DATA_LENGTH == 4 * 1024 * 1024
    assert HTTPLimits().max_header_bytes == 16 * 1024


# -- h2 / gRPC -------------------------------------------------------------------------------


def test_header_list_limit_is_advertised() -> None:
    server = GRPCServerConnection()
    server.initiate()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    events = client.receive_data(server.data_to_send())
    changed = next(e for e in events if isinstance(e, h2.events.RemoteSettingsChanged))
    setting = changed.changed_settings[h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE]
    assert setting.new_value == MAX_HEADER_LIST_SIZE


def test_oversized_header_block_is_refused_before_decoding_with_a_status() -> None:
    server, client = h2_pair()
    # Sent before the client could honour our SETTINGS: refused anyway, from the frame
    # headers. The block is not even valid HPACK: decoding it would be a different error.
    block = b"\xff" * (MAX_HEADER_BLOCK_SIZE + 1)
    client.send_headers(1, GOOD)  # so that the client knows stream 1; what goes out is:
    client.data_to_send()
    head = HeadersFrame(1, flags=("END_STREAM",), data=block[:16000])
    tail = ContinuationFrame(1, flags=("END_HEADERS",), data=block[16000:])
    events = server.receive_data(head.serialize() + tail.serialize())
    assert events == [ConnectionClosed(ErrorCodes.ENHANCE_YOUR_CALM)]
    assert server.closed
    got = client.receive_data(server.data_to_send())
    answer = next(e for e in got if isinstance(e, h2.events.ResponseReceived))
    assert dict(answer.headers)[b"grpc-status"] == b"%d" % Status.RESOURCE_EXHAUSTED.value
    assert dict(answer.headers)[b"grpc-message"] == (
        b"request metadata too large: header block of more than 8192 bytes "
        b"(at least 8193); connection closed"
    )
    goaway = [e for e in got if isinstance(e, h2.events.ConnectionTerminated)]
    assert [(g.error_code, g.last_stream_id, g.additional_data) for g in goaway] == [
        (ErrorCodes.ENHANCE_YOUR_CALM, 1, b"header block of 8193 bytes, max 8192")
    ]
    # Nothing more is read, let alone decoded.
    assert server.receive_data(b"\x00" * 100_000) == []


def test_header_list_over_the_limit_in_a_small_block_ends_the_connection() -> None:
    server, client = h2_pair()
    # Huffman coding packs 'a' into 5 bits: a block under the encoded limit that decodes
    # past the list limit. The HPACK decoder refuses it (ENHANCE_YOUR_CALM).
    big = [*GOOD, (b"x-big", b"a" * MAX_HEADER_LIST_SIZE)]
    client.send_headers(1, big, end_stream=True)
    sent = client.data_to_send()
    assert len(sent) < MAX_HEADER_BLOCK_SIZE
    events = server.receive_data(sent)
    assert events == [ConnectionClosed(ErrorCodes.ENHANCE_YOUR_CALM)]
    assert server.closed
    goaway = [
        e
        for e in client.receive_data(server.data_to_send())
        if isinstance(e, h2.events.ConnectionTerminated)
    ]
    assert [g.error_code for g in goaway] == [ErrorCodes.ENHANCE_YOUR_CALM]


@pytest.mark.parametrize("huffman", [True, False])
def test_header_list_just_under_the_limit_is_served(huffman: bool) -> None:
    server, client = h2_pair()
    if not huffman:
        # Literal strings: the encoded block is then nearly as large as the list.
        plain = hpack.Encoder()
        plain.encode = partial(plain.encode, huffman=False)  # type: ignore[method-assign]
        client.encoder = plain
    used = sum(len(n) + len(v) + 32 for n, v in GOOD) + len(b"x-big") + 32
    client.send_headers(1, [*GOOD, (b"x-big", b"v" * (MAX_HEADER_LIST_SIZE - used))])
    client.send_data(1, encode_message(b"hi"), end_stream=True)
    events = server.receive_data(client.data_to_send())
    assert [type(e) for e in events] == [RequestReceived]


def _trailers(client: h2.connection.H2Connection, data: bytes) -> dict[int, dict[bytes, bytes]]:
    out: dict[int, dict[bytes, bytes]] = {}
    for event in client.receive_data(data):
        if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
            out.setdefault(event.stream_id, {}).update(dict(event.headers))
    return out


def test_request_bytes_held_per_connection_are_capped() -> None:
    server, client = h2_pair(max_message_size=1000, max_connection_buffer=2500)
    partial = encode_message(b"m" * 1000)[:905]  # 5-byte prefix + 900 of 1000 body bytes
    for sid in (1, 3):
        client.send_headers(sid, GOOD)
        client.send_data(sid, partial)
    assert server.receive_data(client.data_to_send()) == []
    assert server.buffered_request_bytes == 2 * 905
    client.send_headers(5, GOOD)
    client.send_data(5, partial)
    assert server.receive_data(client.data_to_send()) == []
    # The third would take the connection past its budget: refused, its bytes dropped.
    assert server.buffered_request_bytes == 2 * 905
    answers = _trailers(client, server.data_to_send())
    assert answers[5][b"grpc-status"] == b"%d" % Status.RESOURCE_EXHAUSTED.value
    assert answers[5][b"grpc-message"] == (
        b"connection holds more than 2500 bytes of unfinished requests"
    )
    # The others go on and complete; finished requests no longer count.
    client.send_data(1, b"m" * 100, end_stream=True)
    events = server.receive_data(client.data_to_send())
    assert [type(e) for e in events] == [RequestReceived]
    assert server.buffered_request_bytes == 905


async def test_grpcio_metadata_over_the_header_limit_fails_only_that_call(
    nursery: trio.Nursery, tmpdirs: Callable[[str], str]
) -> None:
    node = make_node(tmpdirs("cdi."))
    async with serving(nursery, node.service) as (_, channel):
        request = prepare_request("v1")
        err = await in_thread(
            lambda: rpc_error(
                lambda: prepare_stub(channel)(
                    request, timeout=10, metadata=[("x-big", "v" * (2 * MAX_HEADER_LIST_SIZE))]
                )
            )
        )
        # On a fresh connection grpc-core sends before it has read our SETTINGS; the
        # server's HPACK decoder refuses the block and ends the connection with
        # ENHANCE_YOUR_CALM (11). Had the client read the SETTINGS, it would have failed
        # the call itself.
        if err.code() == grpc.StatusCode.UNAVAILABLE:
            assert "GOAWAY received; Error code: 11" in err.debug_error_string()
        else:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
        reply = await in_thread(lambda: prepare_stub(channel)(request, timeout=10))
        assert dict(reply.claims) == {}


# -- claims per call ---------------------------------------------------------------------------


def kubelet_claims(count: int, *, same: bool = False) -> list[ClaimAllocation]:
    """The smallest claims a kubelet sends: a UUID, a one-character namespace and name.
    ``same``: one claim named ``count`` times (two pod entries may name one claim)."""
    uids = [str(uuid.UUID(int=0 if same else i + 1)) for i in range(count)]
    return [claim(uid, name="c", namespace="n") for uid in uids]


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_claim_limit_is_what_one_message_holds_from_a_kubelet(version: str) -> None:
    # The limit is derived from the message size, not chosen: a kubelet request of the
    # smallest claims at the limit fits in one message, one claim more does not.
    at_limit = prepare_request(version, *kubelet_claims(MAX_CLAIMS_PER_CALL))
    assert at_limit.ByteSize() == MAX_CLAIMS_PER_CALL * SMALLEST_KUBELET_CLAIM_BYTES
    assert at_limit.ByteSize() <= MAX_MESSAGE_SIZE
    over = MAX_CLAIMS_PER_CALL + 1
    assert prepare_request(version, *kubelet_claims(over)).ByteSize() > MAX_MESSAGE_SIZE


async def test_too_many_claims_in_one_call_is_refused_whole(
    nursery: trio.Nursery, tmpdirs: Callable[[str], str]
) -> None:
    # Spec files inline, so that a call at the limit takes seconds, not minutes.
    node = make_node(tmpdirs("cdi."), offload_io=False)
    # One claim with no result of ours: preparing it is a no-op that succeeds. A kubelet
    # sends it as often as the pod names it.
    node.claims.put(kubelet_claims(1, same=True)[0])
    # One claim more than the limit only fits in a message as claims smaller than any a
    # kubelet sends; the count refuses them before any claim is read.
    tiny = [claim(f"u{i}", name="c", namespace="n") for i in range(MAX_CLAIMS_PER_CALL + 1)]
    async with serving(nursery, node.service) as (_, channel):
        for stub, build, method in [
            (prepare_stub, prepare_request, "NodePrepareResources"),
            (unprepare_stub, unprepare_request, "NodeUnprepareResources"),
        ]:
            call = stub(channel)
            too_many = build("v1", *tiny)
            err = await in_thread(partial(rpc_error, partial(call, too_many, timeout=60)))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.details() == (
                f"{method}: {MAX_CLAIMS_PER_CALL + 1} claims in one call, more than the "
                f"limit of {MAX_CLAIMS_PER_CALL}"
            )
        assert node.metric("dra_cpu_prepare_claims_total", result="success") == 0
        # Exactly the limit, as a kubelet would send it, is served.
        at_limit = prepare_request("v1", *kubelet_claims(MAX_CLAIMS_PER_CALL, same=True))
        reply = await in_thread(partial(prepare_stub(channel), at_limit, timeout=120))
        assert [r.error for r in reply.claims.values()] == [""]
        assert node.metric("dra_cpu_prepare_claims_total", result="success") == (
            MAX_CLAIMS_PER_CALL
        )
        at_limit = unprepare_request("v1", *kubelet_claims(MAX_CLAIMS_PER_CALL))
        reply = await in_thread(partial(unprepare_stub(channel), at_limit, timeout=120))
        assert len(reply.claims) == MAX_CLAIMS_PER_CALL
        assert all(not r.error for r in reply.claims.values())


# -- ttrpc ---------------------------------------------------------------------------------------


def test_oversized_ttrpc_frame_is_rejected_and_skipped_without_buffering() -> None:
    server = TTRPCServerConnection()
    header = (MAX_DATA_LENGTH + 1).to_bytes(4, "big") + (1).to_bytes(4, "big") + bytes([1, 0])
    events = server.receive_data(header + b"x" * 1000)
    assert len(events) == 1 and isinstance(events[0], RequestRejected)
    assert events[0].status.code == StatusCode.RESOURCE_EXHAUSTED
    assert events[0].status.message == (
        f"message length {MAX_DATA_LENGTH + 1} exceed maximum message size of {MAX_DATA_LENGTH}"
    )
    assert server.pending_bytes == 0
    # The body is skipped as it streams past, never held.
    assert server.receive_data(b"x" * (MAX_DATA_LENGTH + 1 - 1000)) == []
    assert server.pending_bytes == 0


# -- HTTP --------------------------------------------------------------------------------------


def _listening_addresses(port: int) -> set[str]:
    """Local addresses of LISTEN sockets on ``port``, from /proc/net/tcp{,6}."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(address)
    return found


async def test_debug_state_listens_on_loopback_only_by_default() -> None:
    host, port = parse_bind_address(DriverConfig().debugAddress)
    assert (host, port) == ("127.0.0.1", 8081)
    app = HTTPApp.debug_only(FixedDebug({"claims": []}))
    assert app.paths == ("/debug/state",)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(serve_http, host, 0, app)
        assert _listening_addresses(bound) == {"0100007F"}  # 127.0.0.1, nothing else
        stream = await trio.open_tcp_stream("127.0.0.1", bound)
        await stream.send_all(b"GET /debug/state HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := await stream.receive_some():
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200 ")
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1]) == {"claims": []}
        nursery.cancel_scope.cancel()


async def test_oversized_http_request_head_is_431() -> None:
    app = HTTPApp(debug=FixedDebug())
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(serve_http, "127.0.0.1", 0, app)
        stream = await trio.open_tcp_stream("127.0.0.1", bound)
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * (16 * 1024) + b"\r\n\r\n"
        await stream.send_all(head)
        reply = b""
        while chunk := await stream.receive_some():
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
        nursery.cancel_scope.cancel()


# -- kubelet sockets ---------------------------------------------------------------------------


@pytest.fixture
def tmpdirs() -> Iterator[Callable[[str], str]]:
    """Short temp dirs (unix socket paths stay under 107 bytes), removed afterwards."""
    made: list[str] = []

    def make(prefix: str) -> str:
        made.append(short_dir(prefix))
        return made[-1]

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that would leave everything world-writable if the code relied on it."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


async def test_kubelet_sockets_are_0600_in_0750_dirs_whatever_the_umask(
    nursery: trio.Nursery, open_umask: None, tmpdirs: Callable[[str], str]
) -> None:
    root = tmpdirs("k.")
    node = make_node(tmpdirs("cdi."))
    served = await start_plugin(nursery, root, node.service)
    plugin = served.plugin
    try:
        for path in (plugin.dra_socket, plugin.registration_socket):
            st = os.stat(path)
            assert stat.S_ISSOCK(st.st_mode)
            assert stat.S_IMODE(st.st_mode) == 0o600, path
            assert st.st_uid == os.getuid()
            assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o750, path
    finally:
        await served.stop()
    assert not os.path.exists(plugin.dra_socket)


async def test_a_non_socket_at_the_socket_path_is_refused_and_kept(
    tmpdirs: Callable[[str], str],
) -> None:
    root = tmpdirs("k.")
    plugin_dir = os.path.join(root, "plugins", "dra.cpu")
    os.makedirs(plugin_dir)
    victim = os.path.join(plugin_dir, "dra.sock")
    with open(victim, "w") as f:
        f.write("not a socket")
    plugin = KubeletPlugin(
        root, make_node(tmpdirs("cdi.")).service, HealthService(node_name="n", devices=())
    )
    with pytest.raises(BaseException) as info:
        async with trio.open_nursery() as inner:
            await inner.start(plugin.run)
    assert [str(e) for e in _leaves(info.value)] == [
        f"{victim} exists and is not a socket; refusing to remove it"
    ]
    assert all(isinstance(e, ServerError) for e in _leaves(info.value))
    with open(victim) as f:
        assert f.read() == "not a socket"


# -- the DRA socket keeps serving after hostile connections ----------------------------------

HOSTILE = [
    b"\x00" * 64,
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 200,
]
# Preface and SETTINGS, then the header of a 1 MiB frame whose body never comes.
STALLED = (
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    + b"\x10\x00\x00\x01\x04\x00\x00\x00\x01"
)


async def _read_to_eof(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some():
        data += chunk
    return data


async def test_garbage_connections_do_not_stop_the_dra_socket(
    nursery: trio.Nursery, tmpdirs: Callable[[str], str]
) -> None:
    node = make_node(tmpdirs("cdi."))
    async with serving(nursery, node.service) as (served, channel):
        for garbage in HOSTILE:
            stream = await trio.open_unix_socket(served.plugin.dra_socket)
            await stream.send_all(garbage)
            # The server sent its SETTINGS on accept; it closes once it reads the garbage.
            # (The bound only turns a regression into a failure instead of a stuck run.)
            with trio.fail_after(30):
                reply = await _read_to_eof(stream)
            assert reply[3] == 4  # the first frame is our SETTINGS
            await stream.aclose()
        # A connection stalled inside a frame (an oversized one: larger than the 16 KiB
        # the server allows) is closed too; one that is merely slow stays open, as with
        # grpc-go, and does not hold up anyone else.
        stalled = await trio.open_unix_socket(served.plugin.dra_socket)
        await stalled.send_all(STALLED)
        with trio.fail_after(30):
            await _read_to_eof(stalled)
        await stalled.aclose()
        slow = await trio.open_unix_socket(served.plugin.dra_socket)
        await slow.send_all(STALLED[:30])
        reply = await in_thread(partial(prepare_stub(channel), prepare_request("v1"), timeout=10))
        assert dict(reply.claims) == {}
        await slow.aclose()


def test_oversized_frame_is_refused_from_its_header_not_after_buffering_it() -> None:
    server, client = h2_pair()
    header = (2**24 - 1).to_bytes(3, "big") + bytes([0, 0]) + (1).to_bytes(4, "big")
    events = server.receive_data(header + b"\x00" * 1000)
    assert events == [ConnectionClosed(ErrorCodes.FRAME_SIZE_ERROR)]
    assert server.closed
    terminated = [
        e
        for e in client.receive_data(server.data_to_send())
        if isinstance(e, h2.events.ConnectionTerminated)
    ]
    assert [(t.error_code, t.additional_data) for t in terminated] == [
        (ErrorCodes.FRAME_SIZE_ERROR, b"frame of 16777215 bytes, max 16384")
    ]
    # Whatever follows is not read, let alone kept.
    assert server.receive_data(b"\x00" * 100_000) == []


async def test_a_bug_on_one_connection_closes_only_that_connection(
    nursery: trio.Nursery, tmpdirs: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(tmpdirs("cdi."))
    real = GRPCServerConnection.receive_data

    def poisoned(self: GRPCServerConnection, data: bytes, **kw: Any) -> list[object]:
        if b"poison" in data:
            raise RuntimeError("simulated bug in the protocol core")
        return real(self, data, **kw)  # type: ignore[return-value]

    monkeypatch.setattr(GRPCServerConnection, "receive_data", poisoned)
    async with serving(nursery, node.service) as (served, channel):
        stream = await trio.open_unix_socket(served.plugin.dra_socket)
        await stream.send_all(b"poison")
        with trio.fail_after(30):
            await _read_to_eof(stream)  # that connection is closed...
        await stream.aclose()
        # ... and the socket still serves everyone else.
        reply = await in_thread(partial(prepare_stub(channel), prepare_request("v1"), timeout=10))
        assert dict(reply.claims) == {}


async def test_a_bug_on_one_http_connection_closes_only_that_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = ServerConnection.receive_data

    def poisoned(self: ServerConnection, data: bytes) -> None:
        if b"poison" in data:
            raise RuntimeError("simulated bug in the HTTP core")
        real(self, data)

    monkeypatch.setattr(ServerConnection, "receive_data", poisoned)
    app = HTTPApp(debug=FixedDebug())
    app.mark_started()
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(serve_http, "127.0.0.1", 0, app)
        bad = await trio.open_tcp_stream("127.0.0.1", bound)
        await bad.send_all(b"poison")
        with trio.fail_after(30):
            assert await _read_to_eof(bad) == b""
        good = await trio.open_tcp_stream("127.0.0.1", bound)
        await good.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        with trio.fail_after(30):
            assert (await _read_to_eof(good)).startswith(b"HTTP/1.1 200 ")
        nursery.cancel_scope.cancel()
