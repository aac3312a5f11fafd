"""Pod sandboxes in the runtime simulator: cgroup names for both drivers and every QoS class,
sandbox cgroups on cgroup v1 and v2, and how containerd reports sandboxes to a plugin
(Synchronize's pods; RunPodSandbox, StopPodSandbox and RemovePodSandbox only when subscribed).

The plugin here is a bare one over the real wire format, so the event mask is the test's.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from dracpu.cgroupfs.paths import detect_layout, resolve
from dracpu.cpuset import CPUSet
from dracpu.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN
from dracpu.nri.peer import PLUGIN_SERVICE, RUNTIME_SERVICE, MuxPeer
from dracpu.nri.ttrpc import RequestReceived, Status, StatusCode, unimplemented_method
from dracpu.proto.nri import api_pb2
from dracpu_sim.runtime import (
    CgroupLayoutError,
    PodSandboxError,
    RuntimeSimulator,
    container_cgroups_path,
    pod_cgroup_parent,
)

FLAVORS = [(1, "cgroupfs"), (1, "systemd"), (2, "cgroupfs"), (2, "systemd")]
UID = "1a2b-3c"


@pytest.mark.parametrize(
    ("driver", "qos", "parent"),
    [
        ("cgroupfs", "guaranteed", f"/kubepods/pod{UID}"),
        ("cgroupfs", "burstable", f"/kubepods/burstable/pod{UID}"),
        ("cgroupfs", "besteffort", f"/kubepods/besteffort/pod{UID}"),
        ("systemd", "guaranteed", "/kubepods.slice/kubepods-pod1a2b_3c.slice"),
        (
            "systemd",
            "burstable",
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b_3c.slice",
        ),
        (
            "systemd",
            "besteffort",
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b_3c.slice",
        ),
    ],
)
def test_pod_cgroup_names(driver: str, qos: str, parent: str) -> None:
    assert pod_cgroup_parent(driver, qos, UID) == parent
    path = container_cgroups_path(parent, "c1")
    if driver == "cgroupfs":
        assert path == f"{parent}/c1"
    else:
        assert path == f"{parent.rsplit('/', 1)[1]}:cri-containerd:c1"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: pod_cgroup_parent("cgroupfs", "gold", UID), "QoS class must be one of"),
        (lambda: pod_cgroup_parent("cgroupfs", "burstable", "../x"), "cannot name a cgroup"),
        (lambda: RuntimeSimulator("s", "r", cgroup_version=3), "cgroup version must be 1 or 2"),
        (lambda: RuntimeSimulator("s", "r", cgroup_driver="x"), "cgroup driver must be one of"),
        (lambda: RuntimeSimulator("s", "r", default_qos="x"), "QoS class must be one of"),
    ],
)
def test_bad_layout_choices_are_one_clear_error(call: object, message: str) -> None:
    with pytest.raises(CgroupLayoutError) as err:
        call()  # type: ignore[operator]
    assert message in str(err.value)


# -- sandboxes without a plugin -------------------------------------------------------------


@pytest.mark.parametrize(("version", "driver"), FLAVORS)
@pytest.mark.parametrize("qos", ["guaranteed", "burstable", "besteffort"])
async def test_sandbox_cgroup_where_the_daemon_resolves_it(
    short_tmp: str, tmp_path: Path, version: int, driver: str, qos: str
) -> None:
    root = tmp_path / "cg"
    sim = RuntimeSimulator(
        os.path.join(short_tmp, "nri.sock"),
        str(root),
        node_cpus="0-7",
        cgroup_version=version,
        cgroup_driver=driver,
    )
    sandbox_id = await sim.create_pod(UID, "web", "ns", qos=qos)
    pod = sim.pod(UID)
    assert (pod.id, pod.qos) == (sandbox_id, qos)
    assert pod.cgroup_parent == pod_cgroup_parent(driver, qos, UID)
    assert pod.cgroups_path == container_cgroups_path(pod.cgroup_parent, sandbox_id)
    layout = detect_layout(str(root))
    assert layout.version == version
    sandbox_dir = Path(resolve(layout, pod.cgroups_path))
    assert sandbox_dir.is_dir()
    if version == 1:
        # runc copied the parent's sets into the new cgroup.
        assert (sandbox_dir / "cpuset.cpus").read_text() == "0-7\n"
    else:
        assert (sandbox_dir / "cpuset.cpus").read_text() == ""  # the parent's
    assert sim.sandbox_cpuset_of(UID) == "0-7"
    ctr = await sim.create_container(UID, "app")
    assert Path(resolve(layout, sim.container(ctr).cgroups_path)).parent == sandbox_dir.parent
    assert sim.cpuset_of(ctr) == "0-7"
    await sim.remove_pod(UID)
    assert not sandbox_dir.exists()
    assert not sandbox_dir.parent.exists()  # the pod's cgroup went with it
    assert sandbox_dir.parent.parent.is_dir()  # the QoS level (or kubepods) stays
    assert sim.pods == []


# -- a bare plugin --------------------------------------------------------------------------


@dataclass
class BarePlugin:
    """Registers with ``events``, answers Synchronize empty and records every call."""

    events: int
    unimplemented: frozenset[str] = frozenset()
    fail: frozenset[str] = frozenset()
    calls: list[tuple[str, bytes]] = field(default_factory=list)
    synced: trio.Event = field(default_factory=trio.Event)
    peer: MuxPeer | None = None

    def of(self, method: str) -> list[bytes]:
        return [payload for name, payload in self.calls if name == method]

    async def on_request(self, request: RequestReceived) -> None:
        assert self.peer is not None
        assert request.service == PLUGIN_SERVICE
        self.calls.append((request.method, request.payload))
        reply: bytes | Status = b""
        if request.method == "Configure":
            reply = api_pb2.ConfigureResponse(events=self.events).SerializeToString()
        elif request.method in self.unimplemented:
            reply = unimplemented_method(request.method)
        elif request.method in self.fail:
            reply = Status(StatusCode.UNKNOWN, f"{request.method} refused")
        await self.peer.respond(request.stream_id, reply)
        if request.method == "Synchronize":
            self.synced.set()


def mask(*events: int) -> int:
    out = 0
    for event in events:
        out |= 1 << (event - 1)
    return out


@asynccontextmanager
async def runtime_with(
    short_tmp: str,
    tmp_path: Path,
    plugin: BarePlugin,
    *,
    version: int = 2,
    driver: str = "systemd",
    before: tuple[str, ...] = (),
) -> AsyncIterator[RuntimeSimulator]:
    socket_path = os.path.join(short_tmp, "nri.sock")
    sim = RuntimeSimulator(
        socket_path, str(tmp_path / "cg"), cgroup_version=version, cgroup_driver=driver
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run)
        for uid in before:
            await sim.create_pod(uid, f"pod-{uid}")
        stream = await trio.open_unix_socket(socket_path)
        peer = MuxPeer(
            stream,
            serve_conn=PLUGIN_SERVICE_CONN,
            call_conn=RUNTIME_SERVICE_CONN,
            on_request=plugin.on_request,
        )
        plugin.peer = peer
        nursery.start_soon(peer.run)
        register = api_pb2.RegisterPluginRequest(plugin_name="bare", plugin_idx="10")
        await peer.call(RUNTIME_SERVICE, "RegisterPlugin", register.SerializeToString(), timeout=5)
        with trio.fail_after(5):
            await plugin.synced.wait()
            await sim.wait_plugin_ready()
        yield sim
        nursery.cancel_scope.cancel()


SANDBOX_EVENTS = mask(api_pb2.RUN_POD_SANDBOX, api_pb2.STOP_POD_SANDBOX, api_pb2.REMOVE_POD_SANDBOX)


async def test_synchronize_reports_sandboxes_with_both_cgroup_fields(
    short_tmp: str, tmp_path: Path
) -> None:
    plugin = BarePlugin(events=mask(api_pb2.CREATE_CONTAINER))
    async with runtime_with(short_tmp, tmp_path, plugin, before=("u1", "u2")) as sim:
        [payload] = plugin.of("Synchronize")
        pods = {p.uid: p for p in api_pb2.SynchronizeRequest.FromString(payload).pods}
        assert set(pods) == {"u1", "u2"}
        for uid, pod in pods.items():
            want = sim.pod(uid)
            assert pod.id == want.id
            assert pod.linux.cgroup_parent == (
                f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice"
            )
            assert pod.linux.cgroups_path == (
                f"kubepods-burstable-pod{uid}.slice:cri-containerd:{want.id}"
            )


async def test_sandbox_events_reach_a_subscribed_plugin_in_order(
    short_tmp: str, tmp_path: Path
) -> None:
    plugin = BarePlugin(events=SANDBOX_EVENTS)
    async with runtime_with(short_tmp, tmp_path, plugin, version=1, driver="cgroupfs") as sim:
        sandbox_id = await sim.create_pod("u1", "web", qos="guaranteed")
        await sim.create_container("u1", "app")  # not subscribed: no CreateContainer
        await sim.remove_pod("u1")
        names = [name for name, _ in plugin.calls if name not in ("Configure", "Synchronize")]
        assert names == ["RunPodSandbox", "StopPodSandbox", "RemovePodSandbox"]
        run = api_pb2.RunPodSandboxRequest.FromString(plugin.of("RunPodSandbox")[0]).pod
        assert (run.id, run.uid, run.name) == (sandbox_id, "u1", "web")
        assert run.linux.cgroup_parent == "/kubepods/podu1"
        assert run.linux.cgroups_path == f"/kubepods/podu1/{sandbox_id}"
        removed = api_pb2.RemovePodSandboxRequest.FromString(plugin.of("RemovePodSandbox")[0])
        assert removed.pod.id == sandbox_id


async def test_an_unsubscribed_plugin_hears_no_sandbox_event(
    short_tmp: str, tmp_path: Path
) -> None:
    plugin = BarePlugin(events=mask(api_pb2.CREATE_CONTAINER, api_pb2.REMOVE_CONTAINER))
    async with runtime_with(short_tmp, tmp_path, plugin) as sim:
        await sim.create_pod("u1", "web")
        await sim.create_container("u1", "app")
        await sim.remove_pod("u1")
        names = [name for name, _ in plugin.calls if name not in ("Configure", "Synchronize")]
        assert names == ["CreateContainer", "RemoveContainer"]


async def test_a_plugin_without_the_methods_gets_state_changes(
    short_tmp: str, tmp_path: Path
) -> None:
    methods = frozenset({"RunPodSandbox", "StopPodSandbox", "RemovePodSandbox"})
    plugin = BarePlugin(events=SANDBOX_EVENTS, unimplemented=methods)
    async with runtime_with(short_tmp, tmp_path, plugin) as sim:
        await sim.create_pod("u1", "web")
        await sim.remove_pod("u1")
        events = [api_pb2.StateChangeEvent.FromString(p) for p in plugin.of("StateChange")]
        assert [e.event for e in events] == [
            api_pb2.RUN_POD_SANDBOX,
            api_pb2.STOP_POD_SANDBOX,
            api_pb2.REMOVE_POD_SANDBOX,
        ]
        assert {e.pod.uid for e in events} == {"u1"}


async def test_a_failed_run_pod_sandbox_fails_the_pod_and_leaves_nothing(
    short_tmp: str, tmp_path: Path
) -> None:
    plugin = BarePlugin(events=SANDBOX_EVENTS, fail=frozenset({"RunPodSandbox"}))
    async with runtime_with(short_tmp, tmp_path, plugin) as sim:
        with pytest.raises(PodSandboxError) as err:
            await sim.create_pod("u1", "web")
        assert str(err.value) == "NRI RunPodSandbox failed: RunPodSandbox refused"
        assert sim.pods == []
        burstable = tmp_path / "cg" / "kubepods.slice" / "kubepods-burstable.slice"
        assert [p.name for p in burstable.iterdir() if p.is_dir()] == []
        # A stop or remove failure is only logged, as containerd does.
        plugin.fail = frozenset({"StopPodSandbox", "RemovePodSandbox"})
        await sim.create_pod("u2", "web")
        await sim.remove_pod("u2")
        assert sim.pods == []


async def test_sandbox_effective_cpus_follow_the_pod_cgroup_on_v2(
    short_tmp: str, tmp_path: Path
) -> None:
    sim = RuntimeSimulator(
        os.path.join(short_tmp, "nri.sock"), str(tmp_path / "cg"), cgroup_version=2
    )
    await sim.create_pod("u1", "web")
    pod = sim.pod("u1")
    # Someone narrows the pod's cgroup (as a writer on a node might): the sandbox,
    # which names no CPUs of its own, follows.
    sim.tree.write(pod.cgroup_parent, cpus="2-3")
    assert sim.sandbox_cpuset_of("u1") == "2-3"
    assert sim.tree.effective_cpus(pod.cgroups_path) == CPUSet.parse("2-3")
