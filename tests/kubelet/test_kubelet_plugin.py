"""The plugin's sockets, registration and the health stream (behavior.md §7, §14;
protocols.md §2, §3.4), with grpcio over the real sockets where a kubelet would talk."""

from __future__ import annotations

import os
import shutil
import stat
from typing import Any

import grpc
import pytest
import trio
import trio.testing
from kubelet_harness import NODE, in_thread, make_node, rpc_error, start_plugin

from dracpu.kubelet import HealthService, RegistrationError, RegistrationService
from dracpu.proto.health.v1 import api_pb2 as health_v1
from dracpu.proto.health.v1alpha1 import api_pb2 as health_v1alpha1
from dracpu.proto.pluginregistration import api_pb2 as reg

HEALTH = {"v1": health_v1, "v1alpha1": health_v1alpha1}
NOW = 1767225600


@pytest.fixture
def root(short_tmp: str) -> str:
    """The kubelet root: the test's short temp dir (the plugin's sockets go below it)."""
    return short_tmp


def _get_info(path: str) -> Any:
    with grpc.insecure_channel("unix:" + path) as ch:
        stub = ch.unary_unary(
            "/pluginregistration.Registration/GetInfo",
            request_serializer=reg.InfoRequest.SerializeToString,
            response_deserializer=reg.PluginInfo.FromString,
        )
        return stub(reg.InfoRequest(), timeout=5)


def _notify(path: str, registered: bool, error: str = "") -> Any:
    with grpc.insecure_channel("unix:" + path) as ch:
        stub = ch.unary_unary(
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            request_serializer=reg.RegistrationStatus.SerializeToString,
            response_deserializer=reg.RegistrationStatusResponse.FromString,
        )
        return stub(reg.RegistrationStatus(plugin_registered=registered, error=error), timeout=5)


async def test_sockets_dirs_and_cleanup(nursery: trio.Nursery, root: str, cdi_dir: str) -> None:
    node = make_node(cdi_dir)
    served = await start_plugin(nursery, root, node.service)
    plugin = served.plugin
    assert plugin.dra_socket == f"{root}/plugins/dra.cpu/dra.sock"
    assert plugin.registration_socket == f"{root}/plugins_registry/dra.cpu-reg.sock"
    for path in (plugin.dra_socket, plugin.registration_socket):
        st = os.lstat(path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o750
    await served.stop()
    assert not os.path.exists(plugin.dra_socket)
    assert not os.path.exists(plugin.registration_socket)
    shutil.rmtree(node.cdi_dir)


async def test_registration_over_the_socket(nursery: trio.Nursery, root: str, cdi_dir: str) -> None:
    node = make_node(cdi_dir)
    served = await start_plugin(nursery, root, node.service)
    plugin = served.plugin
    info = await in_thread(lambda: _get_info(plugin.registration_socket))
    assert info == reg.PluginInfo(
        type="DRAPlugin",
        name="dra.cpu",
        endpoint=f"{root}/plugins/dra.cpu/dra.sock",
        supported_versions=[
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth",
            "v1.DRAResourceHealth",
        ],
    )
    err = await in_thread(
        lambda: rpc_error(lambda: _notify(plugin.registration_socket, False, "bad versions"))
    )
    assert (err.code(), err.details()) == (
        grpc.StatusCode.UNKNOWN,
        "failed registration process: bad versions",
    )
    assert (plugin.registration.registered, plugin.registration.last_error) == (
        False,
        "bad versions",
    )
    reply = await in_thread(lambda: _notify(plugin.registration_socket, True))
    assert reply == reg.RegistrationStatusResponse()
    assert plugin.registration.registered
    with trio.fail_after(5):
        await plugin.registration.wait_registered(timeout=1)
    # GetInfo keeps answering the same for the plugin's whole life.
    assert await in_thread(lambda: _get_info(plugin.registration_socket)) == info
    await served.stop()
    shutil.rmtree(node.cdi_dir)


async def test_wait_registered_never(autojump_clock: trio.testing.MockClock) -> None:
    service = RegistrationService(endpoint="/x/dra.sock", registrar_dir="/k/plugins_registry")
    start = trio.current_time()
    with pytest.raises(RegistrationError) as info:
        await service.wait_registered()
    assert trio.current_time() - start == pytest.approx(30)
    assert str(info.value) == (
        "kubelet never reported a registration status, check that it watches "
        "/k/plugins_registry: context deadline exceeded"
    )


async def test_wait_registered_rejected(autojump_clock: trio.testing.MockClock) -> None:
    service = RegistrationService(endpoint="/x/dra.sock")
    service.record_status(False, "old reason")
    service.record_status(False, 'new "reason"')
    with pytest.raises(RegistrationError) as info:
        await service.wait_registered(timeout=5)
    assert str(info.value) == (
        'kubelet did not register the plugin, last rejection was "new \\"reason\\"": '
        "context deadline exceeded"
    )


async def test_wait_registered_no_reason(autojump_clock: trio.testing.MockClock) -> None:
    service = RegistrationService(endpoint="/x/dra.sock")
    service.record_status(False, "")
    with pytest.raises(RegistrationError) as info:
        await service.wait_registered(timeout=5)
    assert str(info.value) == (
        "kubelet did not register the plugin and reported no reason: context deadline exceeded"
    )


# -- health ------------------------------------------------------------------------------------


def _watch(path: str, version: str, count: int, box: dict[str, Any]) -> None:
    pb = HEALTH[version]
    with grpc.insecure_channel("unix:" + path) as ch:
        stub = ch.unary_stream(
            f"/{version}.DRAResourceHealth/NodeWatchResources",
            request_serializer=pb.NodeWatchResourcesRequest.SerializeToString,
            response_deserializer=pb.NodeWatchResourcesResponse.FromString,
        )
        call = stub(pb.NodeWatchResourcesRequest(), timeout=30)
        box["got"] = [next(call) for _ in range(count)]
        box["rest"] = list(call)  # ends when the server ends the stream
        box["code"] = call.code()


async def _until(check: Any) -> None:
    with trio.fail_after(10):
        while not check():
            await trio.sleep(0.01)


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
async def test_health_stream(nursery: trio.Nursery, root: str, cdi_dir: str, version: str) -> None:
    pb = HEALTH[version]
    node = make_node(cdi_dir)
    health = HealthService(
        node_name=NODE, devices=["cpudevnuma000", "cpudevnuma001"], wall_clock=lambda: NOW
    )
    served = await start_plugin(nursery, root, node.service, health)
    box: dict[str, Any] = {}
    async with trio.open_nursery() as clients:
        clients.start_soon(in_thread, lambda: _watch(served.plugin.dra_socket, version, 2, box))
        await _until(lambda: health.subscribers == 1)
        health.set_devices(["cpudevnuma000"])  # a change goes out at once
        await _until(lambda: "got" in box)
        await served.stop()  # the stream ends cleanly with the plugin
    first, second = box["got"]

    def device(name: str) -> Any:
        return pb.DeviceHealth(
            device=pb.DeviceIdentifier(pool_name=NODE, device_name=name),
            health=pb.HEALTHY,
            last_updated_time=NOW,
            health_check_timeout_seconds=20,
            message="device initialized",
        )

    assert first == pb.NodeWatchResourcesResponse(
        devices=[device("cpudevnuma000"), device("cpudevnuma001")]
    )
    assert second == pb.NodeWatchResourcesResponse(devices=[device("cpudevnuma000")])
    assert box["rest"] == []
    assert box["code"] == grpc.StatusCode.OK
    shutil.rmtree(node.cdi_dir)


class FakeStream:
    """A server stream that records messages; ``block`` makes every send hang."""

    def __init__(self, block: bool = False) -> None:
        self.sent: list[Any] = []
        self.block = block
        self.sending = trio.Event()

    async def recv_message(self) -> Any:
        return health_v1.NodeWatchResourcesRequest()

    async def send_message(self, message: Any) -> None:
        self.sending.set()
        if self.block:
            await trio.sleep_forever()
        self.sent.append(message)


async def test_health_resend_every_10s_and_clean_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    health = HealthService(
        node_name=NODE, devices=["d0"], wall_clock=lambda: NOW + trio.current_time()
    )
    stream = FakeStream()
    ended = trio.Event()

    async def watch() -> None:
        await health._watch(stream, health_v1)
        ended.set()

    async with trio.open_nursery() as streams:  # like a server connection: not cancelled
        async with trio.open_nursery() as service:
            await service.start(health.run)
            start = trio.current_time()
            streams.start_soon(watch)
            await trio.sleep(35)
            service.cancel_scope.cancel()
        with trio.fail_after(1):
            await ended.wait()  # the stream ended on its own (status OK)
    times = [m.devices[0].last_updated_time - NOW - int(start) for m in stream.sent]
    assert times == [0, 10, 20, 30]
    assert health.subscribers == 0


async def test_health_queue_of_four_drops_when_full(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    health = HealthService(node_name=NODE, devices=["d0"])
    stuck = FakeStream(block=True)
    nursery.start_soon(health._watch, stuck, health_v1)
    await stuck.sending.wait()
    for _ in range(6):
        health.publish()
    assert health.dropped == 2


async def test_health_unknown_stream_after_close() -> None:
    health = HealthService(node_name=NODE, devices=["d0"])
    health.close()
    stream = FakeStream()
    await health._watch(stream, health_v1)
    assert stream.sent == []


@pytest.mark.parametrize("how", ["socket", "directory"])
async def test_a_removed_registration_socket_is_created_again(
    nursery: trio.Nursery, root: str, cdi_dir: str, how: str
) -> None:
    """The kubelet deregisters a plugin whose registration socket disappears; dracpu binds
    it again (inotify for the file, a periodic look when the whole directory went)."""
    node = make_node(cdi_dir)
    served = await start_plugin(nursery, root, node.service)
    plugin = served.plugin
    if how == "socket":
        os.unlink(plugin.registration_socket)
        limit = 2.0
    else:
        shutil.rmtree(plugin.registrar_dir)
        limit = 10.0  # the 5 s look-again covers a removed directory
    with trio.fail_after(limit):
        while not os.path.exists(plugin.registration_socket):
            await trio.sleep(0.01)
    assert plugin.registration_recreated == 1  # (a new socket may reuse the inode number)
    info = await in_thread(lambda: _get_info(plugin.registration_socket))
    assert info.name == "dra.cpu"
    await served.stop()
    assert not os.path.exists(plugin.registration_socket)
    shutil.rmtree(node.cdi_dir)
