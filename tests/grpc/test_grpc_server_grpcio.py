"""The Trio server against the official grpcio client (run in a worker thread)."""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import trio
from grpc_harness import (
    GET_INFO,
    NON_ASCII_ERROR,
    PREPARE,
    WATCH,
    Observed,
    all_handlers,
    in_thread,
    prepare_request,
    prepare_stub,
    socket_path,
)

from dracpu.grpc import ServerError, serve_unix
from dracpu.proto.dra.v1 import api_pb2 as dra_v1
from dracpu.proto.health.v1alpha1 import api_pb2 as health
from dracpu.proto.pluginregistration import api_pb2 as reg

MiB = 1024 * 1024


@dataclass
class Served:
    path: str
    seen: Observed
    scope: trio.CancelScope
    stopped: trio.Event

    async def stop(self) -> None:
        self.scope.cancel()
        with trio.fail_after(10):
            await self.stopped.wait()


async def start_server(nursery: trio.Nursery, path: str, pad: int = 0) -> Served:
    served = Served(path, Observed(), trio.CancelScope(), trio.Event())

    async def run(task_status: trio.TaskStatus[None]) -> None:
        try:
            with served.scope:
                await serve_unix(
                    path,
                    all_handlers(served.seen, pad),
                    grace_period=2.0,
                    task_status=task_status,
                )
        finally:
            served.stopped.set()

    await nursery.start(run)
    return served


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[Served]:
    served = await start_server(nursery, socket_path())
    yield served
    await served.stop()


@pytest.fixture
def channel(server: Served) -> Any:
    ch = grpc.insecure_channel(
        "unix:" + server.path, options=[("grpc.max_send_message_length", 16 * MiB)]
    )
    yield ch
    ch.close()


def rpc_error(fn: Any) -> grpc.RpcError:
    try:
        fn()
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("call succeeded")


async def test_unary_call_with_metadata_and_deadline(server: Served, channel: Any) -> None:
    reply = await in_thread(
        lambda: prepare_stub(channel)(
            prepare_request("a", "b"), timeout=30, metadata=[("x-op", "42")]
        )
    )
    assert reply == dra_v1.NodePrepareResourcesResponse(
        claims={
            f"uid-{n}": dra_v1.NodePrepareResourceResponse(
                devices=[
                    dra_v1.Device(
                        pool_name="node-a", device_name=n, cdi_device_ids=[f"x/cpu=uid-{n}"]
                    )
                ]
            )
            for n in ("a", "b")
        }
    )
    assert ("x-op", "42") in server.seen.metadata[0]
    remaining = server.seen.remaining[0]
    assert remaining is not None and 25 < remaining <= 30


async def test_registration_get_info(channel: Any) -> None:
    stub = channel.unary_unary(
        GET_INFO,
        request_serializer=reg.InfoRequest.SerializeToString,
        response_deserializer=reg.PluginInfo.FromString,
    )
    info = await in_thread(lambda: stub(reg.InfoRequest(), timeout=5))
    assert info == reg.PluginInfo(
        type="DRAPlugin",
        name="dracpu.example.com",
        endpoint="/var/lib/kubelet/plugins/dracpu.example.com/dra.sock",
        supported_versions=["v1.DRAPlugin"],
    )


def _watch(channel: Any) -> list[health.NodeWatchResourcesResponse]:
    stub = channel.unary_stream(
        WATCH,
        request_serializer=health.NodeWatchResourcesRequest.SerializeToString,
        response_deserializer=health.NodeWatchResourcesResponse.FromString,
    )
    return list(stub(health.NodeWatchResourcesRequest(), timeout=10))


async def test_server_streaming(channel: Any) -> None:
    snapshots = await in_thread(lambda: _watch(channel))
    assert [s.devices[0].device.device_name for s in snapshots] == ["h0", "h1", "h2"]
    assert snapshots[0].devices[0].health == health.HEALTHY


async def test_server_streaming_beyond_flow_control_window(nursery: trio.Nursery) -> None:
    served = await start_server(nursery, socket_path(), pad=200_000)
    ch = grpc.insecure_channel("unix:" + served.path)
    try:
        snapshots = await in_thread(lambda: _watch(ch))
    finally:
        ch.close()
    assert [len(s.devices[0].device.pool_name) for s in snapshots] == [200_000] * 3
    await served.stop()


async def test_deadline_exceeded_cancels_handler(server: Served, channel: Any) -> None:
    err = await in_thread(
        lambda: rpc_error(lambda: prepare_stub(channel)(prepare_request("block"), timeout=0.3))
    )
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    with trio.fail_after(5):
        await server.seen.cancelled.wait()


async def test_client_cancel_cancels_handler(server: Served, channel: Any) -> None:
    future = prepare_stub(channel).future(prepare_request("block"), timeout=30)
    with trio.fail_after(5):
        await server.seen.started.wait()
    assert future.cancel()
    with trio.fail_after(5):
        await server.seen.cancelled.wait()


@pytest.mark.parametrize(
    ("path", "details"),
    [
        ("/bogus.Svc/Call", "unknown service bogus.Svc"),
        (
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/Nope",
            "unknown method Nope for service k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
        ),
        (
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
            "unknown service k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
        ),
    ],
)
async def test_unknown_method(channel: Any, path: str, details: str) -> None:
    err = await in_thread(lambda: rpc_error(lambda: channel.unary_unary(path)(b"", timeout=5)))
    assert (err.code(), err.details()) == (grpc.StatusCode.UNIMPLEMENTED, details)


async def test_oversized_request_then_next_call(channel: Any) -> None:
    raw = channel.unary_unary(PREPARE)
    err = await in_thread(lambda: rpc_error(lambda: raw(b"\x00" * (4 * MiB + 1), timeout=10)))
    assert (err.code(), err.details()) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "received message larger than max (4194305 vs. 4194304)",
    )
    reply = await in_thread(lambda: prepare_stub(channel)(prepare_request("a"), timeout=5))
    assert list(reply.claims) == ["uid-a"]


async def test_malformed_protobuf_then_next_call(channel: Any) -> None:
    raw = channel.unary_unary(PREPARE)
    err = await in_thread(lambda: rpc_error(lambda: raw(b"\x0a\x05ab", timeout=5)))
    assert err.code() == grpc.StatusCode.INTERNAL
    assert err.details().startswith("failed to decode request message: ")
    reply = await in_thread(lambda: prepare_stub(channel)(prepare_request("a"), timeout=5))
    assert list(reply.claims) == ["uid-a"]


async def test_compressed_request_is_unimplemented(channel: Any) -> None:
    stub = prepare_stub(channel)
    request = prepare_request("a" * 2000)
    err = await in_thread(
        lambda: rpc_error(lambda: stub(request, timeout=5, compression=grpc.Compression.Gzip))
    )
    assert (err.code(), err.details()) == (
        grpc.StatusCode.UNIMPLEMENTED,
        "compressed request messages are not supported",
    )


async def test_non_ascii_status_message_round_trip(channel: Any) -> None:
    err = await in_thread(
        lambda: rpc_error(lambda: prepare_stub(channel)(prepare_request("fail"), timeout=5))
    )
    assert (err.code(), err.details()) == (grpc.StatusCode.FAILED_PRECONDITION, NON_ASCII_ERROR)


async def test_handler_exception_is_unknown(channel: Any) -> None:
    err = await in_thread(
        lambda: rpc_error(lambda: prepare_stub(channel)(prepare_request("crash"), timeout=5))
    )
    assert (err.code(), err.details()) == (grpc.StatusCode.UNKNOWN, "ValueError: boom")


async def test_100_concurrent_calls_on_one_channel(channel: Any) -> None:
    def run() -> list[list[str]]:
        stub = prepare_stub(channel)
        futures = [stub.future(prepare_request(f"c{i}"), timeout=30) for i in range(100)]
        return [list(f.result().claims) for f in futures]

    assert await in_thread(run) == [[f"uid-c{i}"] for i in range(100)]


async def test_socket_file_mode_parent_dir_and_removal(nursery: trio.Nursery) -> None:
    path = os.path.join(os.path.dirname(socket_path()), "new", "dra.sock")
    served = await start_server(nursery, path)
    st = os.lstat(path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o750 & ~_umask()
    await served.stop()
    assert not os.path.exists(path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


async def test_stale_socket_is_replaced(nursery: trio.Nursery) -> None:
    path = socket_path()
    first = await start_server(nursery, path)
    first_inode = os.lstat(path).st_ino
    second = await start_server(nursery, path)  # replaces the first one's file
    assert os.lstat(path).st_ino != first_inode
    await first.stop()
    assert os.path.exists(path)  # the first server leaves the second one's socket alone
    ch = grpc.insecure_channel("unix:" + path)
    reply = await in_thread(lambda: prepare_stub(ch)(prepare_request("a"), timeout=5))
    ch.close()
    assert list(reply.claims) == ["uid-a"]
    await second.stop()
    assert not os.path.exists(path)


async def test_refuses_to_replace_regular_file() -> None:
    path = socket_path()
    with open(path, "w") as f:
        f.write("keep me")
    with pytest.raises(ServerError) as info:
        await serve_unix(path, {})
    assert str(info.value) == f"{path} exists and is not a socket; refusing to remove it"
    with open(path) as f:
        assert f.read() == "keep me"


async def test_rejects_socket_path_over_107_bytes() -> None:
    path = "/tmp/" + "x" * 103
    with pytest.raises(ServerError) as info:
        await serve_unix(path, {})
    assert str(info.value) == f"unix socket path is longer than 107 bytes: {path}"


async def test_graceful_shutdown_finishes_in_flight_call(server: Served, channel: Any) -> None:
    future = prepare_stub(channel).future(prepare_request("wait"), timeout=30)
    with trio.fail_after(5):
        await server.seen.started.wait()
    server.scope.cancel()
    await trio.sleep(0)  # let the server send GOAWAY before the handler finishes
    server.seen.release.set()
    reply = await in_thread(future.result)
    assert list(reply.claims) == ["uid-wait"]
    with trio.fail_after(10):
        await server.stopped.wait()
    assert not os.path.exists(server.path)
    err = await in_thread(
        lambda: rpc_error(lambda: prepare_stub(channel)(prepare_request("a"), timeout=5))
    )
    assert err.code() == grpc.StatusCode.UNAVAILABLE
