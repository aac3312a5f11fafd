"""The daemon in-process: start order, readiness, /debug/state, prepare through the kubelet
socket with the official grpcio client, pinning through the NRI runtime simulator, the pool
pushed to shared containers, and start-up errors."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import grpc
import pytest
import trio
import trio.testing
from builders import allocation, device_result, fetch, no_signals, resource_claim

from dracpu.allocation.store import ClaimRecord
from dracpu.config import DriverConfig
from dracpu.cpuset import CPUSet
from dracpu.daemon.app import Daemon
from dracpu.k8s.client import KubeClient
from dracpu.messages import ClaimEvent
from dracpu.nursery import Supervisor
from dracpu.proto.dra.v1 import api_pb2 as dra_pb
from dracpu.proto.pluginregistration import api_pb2 as reg_pb
from dracpu_sim.apiserver import SimAPIServer
from dracpu_sim.runtime.simulator import RuntimeSimulator

FIXTURES = Path(__file__).parents[1] / "fake_sysfs"


def register(socket_path: str) -> reg_pb.PluginInfo:
    with grpc.insecure_channel("unix:" + socket_path) as ch:
        info = ch.unary_unary(
            "/pluginregistration.Registration/GetInfo",
            request_serializer=reg_pb.InfoRequest.SerializeToString,
            response_deserializer=reg_pb.PluginInfo.FromString,
        )(reg_pb.InfoRequest(), timeout=5)
        ch.unary_unary(
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            request_serializer=reg_pb.RegistrationStatus.SerializeToString,
            response_deserializer=reg_pb.RegistrationStatusResponse.FromString,
        )(reg_pb.RegistrationStatus(plugin_registered=True), timeout=5)
    return info


def dra_call(socket_path: str, method: str, request: Any, reply: Any) -> Any:
    with grpc.insecure_channel("unix:" + socket_path) as ch:
        return ch.unary_unary(
            f"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=reply.FromString,
        )(request, timeout=10)


class Node:
    """A loopback API server and NRI runtime in a short temp dir, and a daemon config."""

    def __init__(self, directory: str, fixture: str = "xeon-2s-ht", **config: Any) -> None:
        self.dir = directory
        self.api = SimAPIServer()
        self.runtime = RuntimeSimulator(self.path("nri.sock"), self.path("cg"), node_cpus="0-79")
        settings: dict[str, Any] = dict(
            kubeconfig=self.path("kubeconfig"),
            hostnameOverride="node-a",
            bindAddress="127.0.0.1:0",
            debugAddress="127.0.0.1:0",
            sysfsRoot=str(FIXTURES / fixture),
            kubeletRootDir=self.path("k"),
            nriSocket=self.path("nri.sock"),
            cdiDir=self.path("cdi"),
            cgroupRoot=self.path("cg"),
            stateDir=self.path("state"),
        )
        self.config = DriverConfig(**{**settings, **config})

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    async def start(self, nursery: trio.Nursery) -> None:
        await nursery.start(self.api.serve)
        self.api.write_kubeconfig(self.path("kubeconfig"))
        self.api.create(
            "nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}
        )
        await nursery.start(self.runtime.run)

    def daemon(self, **options: Any) -> Daemon:
        kube = KubeClient.from_kubeconfig(self.path("kubeconfig"))
        return Daemon(
            self.config, kube=kube, node_name="node-a", proc_root=self.path("proc"), **options
        )

    def allocated_claim(self, name: str, device: str, cpus: int) -> str:
        """Create a claim allocated on ``device``; returns the UID the API server gave it."""
        self.api.create("resourceclaims", resource_claim(name))
        claim = self.api.get("resourceclaims", name, "default")
        claim["status"] = {"allocation": allocation(device_result(device, cpus))}
        self.api.update("resourceclaims", claim, subresource="status")
        return str(claim["metadata"]["uid"])

    async def register_until_ready(self, daemon: Daemon) -> reg_pb.PluginInfo:
        """Register the started daemon as the kubelet would; returns once every service
        reports ready."""
        reg = os.path.join(self.config.kubeletRootDir, "plugins_registry", "dra.cpu-reg.sock")
        info = await trio.to_thread.run_sync(register, reg)
        assert daemon.supervisor is not None
        with trio.fail_after(10):
            await daemon.supervisor.readiness.wait_ready()  # woken by the last report
        return info

    async def prepare_claim(
        self, endpoint: str, cpus: int
    ) -> tuple[str, dra_pb.NodePrepareResourcesResponse]:
        """Claim c1, allocated ``cpus`` CPUs of cpudevnuma001, prepared over real gRPC; its
        UID and the kubelet's reply."""
        uid = self.allocated_claim("c1", "cpudevnuma001", cpus)
        request = dra_pb.NodePrepareResourcesRequest(
            claims=[dra_pb.Claim(namespace="default", uid=uid, name="c1")]
        )
        reply = await trio.to_thread.run_sync(
            dra_call, endpoint, "NodePrepareResources", request, dra_pb.NodePrepareResourcesResponse
        )
        return uid, reply


async def test_daemon_starts_in_order_pins_and_pushes_the_pool(short_tmp: str) -> None:
    node = Node(short_tmp)
    seen: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        daemon = node.daemon()
        sup = Supervisor()

        async def drive(s: Supervisor) -> None:
            await daemon.startup(s)
            assert daemon.http_port is not None and daemon.debug_port is not None
            seen["before"] = await trio.to_thread.run_sync(fetch, daemon.http_port, "/readyz")
            seen["healthz"] = await trio.to_thread.run_sync(fetch, daemon.http_port, "/healthz")
            info = seen["info"] = await node.register_until_ready(daemon)
            seen["after"] = await trio.to_thread.run_sync(fetch, daemon.http_port, "/readyz")
            # A shared container first, then a claim prepared over real gRPC.
            await node.runtime.create_pod("p-shared", "shared")
            shared_id = await node.runtime.create_container("p-shared", "app")
            seen["shared_before"] = node.runtime.cpuset_of(shared_id)
            seen["uid"], seen["prepare"] = await node.prepare_claim(info.endpoint, 4)
            # The shared container follows the smaller pool without any CreateContainer.
            with trio.fail_after(10):
                while node.runtime.cpuset_of(shared_id) == seen["shared_before"]:
                    await trio.sleep(0.05)
            seen["shared_after"] = node.runtime.cpuset_of(shared_id)
            status, body = await trio.to_thread.run_sync(fetch, daemon.debug_port, "/debug/state")
            seen["debug"] = (status, json.loads(body))
            s.request_stop("test done")

        code = await sup.run_until_signal(drive, signal_receiver=no_signals)
        assert code == 0, sup.fatal_error
        nursery.cancel_scope.cancel()
    assert seen["healthz"] == (200, b"")
    assert seen["before"][0] == 503
    assert b"[-] kubelet-registration: waiting for the kubelet" in seen["before"][1]
    assert seen["after"] == (200, b"ok")
    assert seen["info"].name == "dra.cpu"
    uid = seen["uid"]
    result = seen["prepare"].claims[uid]
    assert result.error == ""
    assert [d.device_name for d in result.devices] == ["cpudevnuma001"]
    status, state = seen["debug"]
    assert status == 200
    [claim] = state["claims"]
    assert claim["uid"] == uid and claim["name"] == "c1"
    cpus = claim["cpus"]
    assert seen["shared_before"] == "0-79"
    assert state["sharedPool"] == seen["shared_after"]
    assert set(state["ready"].values()) == {True}
    assert state["services"]["nri"]["state"] == "running"
    assert state["summary"]["cpus"] == 80
    # The checkpoint holds the claim; the CDI spec carries its env.
    checkpoint = json.loads(Path(node.path("state"), "checkpoint.json").read_text())
    assert [(c["uid"], c["cpus"]) for c in checkpoint["claims"]] == [(uid, cpus)]
    spec = json.loads(Path(node.path("cdi"), f"dra.k8s.io-cpu_claim-{uid}.json").read_text())
    assert spec["devices"][0]["containerEdits"]["env"] == [f"DRA_CPUSET_{uid}={cpus}"]
    assert len(CPUSet.parse(cpus)) == 4 and CPUSet.parse(cpus) <= CPUSet.parse("20-39,60-79")


async def test_no_devices_publishes_nothing_and_keeps_old_slices(short_tmp: str) -> None:
    node = Node(short_tmp, reservedCPUs="0-79")
    stale = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "old-slice"},
        "spec": {
            "driver": "dra.cpu",
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        node.api.create("resourceslices", stale)
        daemon = node.daemon()
        sup = Supervisor()

        async def drive(s: Supervisor) -> None:
            await daemon.startup(s)
            with trio.fail_after(10):
                await s.readiness.wait_component("slices")
            await trio.sleep(0.3)
            s.request_stop("done")

        code = await sup.run_until_signal(drive, signal_receiver=no_signals)
        assert code == 0, sup.fatal_error
        assert [s["metadata"]["name"] for s in node.api.list("resourceslices")] == ["old-slice"]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"bindAddress": "8080"}, 'invalid bind address "8080": missing port in address'),
        ({"sysfsRoot": "/nonexistent-sysfs"}, "driver failed to initialize: "),
        ({"reservedCPUs": "x"}, "driver failed to initialize: failed to parse reserved CPUs"),
    ],
)
async def test_startup_errors_fail_the_daemon_with_the_step(
    config: dict[str, Any], message: str, caplog: pytest.LogCaptureFixture, short_tmp: str
) -> None:
    node = Node(short_tmp, **config)
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        sup = Supervisor()
        code = await sup.run_until_signal(node.daemon().startup, signal_receiver=no_signals)
        nursery.cancel_scope.cancel()
    assert code == 1
    assert sup.fatal_error is not None and message in sup.fatal_error


async def test_no_registration_is_logged_and_readyz_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, short_tmp: str
) -> None:
    """No kubelet: dracpu keeps serving, /readyz names what it waits for, and the log says
    why every REGISTRATION_WAIT (upstream would exit after 30 s)."""
    import dracpu.daemon.app as app

    monkeypatch.setattr(app, "REGISTRATION_WAIT", 0.3)
    node = Node(short_tmp)
    seen: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        daemon = node.daemon()
        sup = Supervisor()

        async def drive(s: Supervisor) -> None:
            await daemon.startup(s)
            await trio.sleep(1.0)
            assert daemon.http_port is not None
            seen["readyz"] = await trio.to_thread.run_sync(fetch, daemon.http_port, "/readyz")
            s.request_stop("done")

        code = await sup.run_until_signal(drive, signal_receiver=no_signals)
        assert code == 0, sup.fatal_error
        nursery.cancel_scope.cancel()
    status, body = seen["readyz"]
    assert status == 503
    assert b"[-] kubelet-registration: waiting for the kubelet" in body
    assert b"[+] nri ok" in body
    warnings = [r for r in caplog.records if r.getMessage() == "plugin not registered yet"]
    assert len(warnings) >= 2
    err = getattr(warnings[0], "dracpu_kv", {}).get("err", "")
    assert err.startswith("kubelet never reported a registration status, check that it watches ")


async def test_align_memory_pins_mems_to_the_claims_numa_nodes(short_tmp: str) -> None:
    node = Node(short_tmp, alignMemory=True)
    node.runtime.node_mems = "0-1"
    seen: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        daemon = node.daemon()
        sup = Supervisor()

        async def drive(s: Supervisor) -> None:
            await daemon.startup(s)
            reg = os.path.join(node.config.kubeletRootDir, "plugins_registry", "dra.cpu-reg.sock")
            info = await trio.to_thread.run_sync(register, reg)
            uid, _ = await node.prepare_claim(info.endpoint, 2)
            cpus = daemon.state.view.cpus_of(uid).format()  # type: ignore[union-attr]
            await node.runtime.create_pod("p1", "pinned")
            ctr = await node.runtime.create_container("p1", "app", [f"DRA_CPUSET_{uid}={cpus}"])
            await node.runtime.create_pod("p2", "shared")
            shared = await node.runtime.create_container("p2", "app")
            seen.update(
                cpus=cpus,
                got=node.runtime.cpuset_of(ctr),
                mems=node.runtime.mems_of(ctr),
                shared_mems=node.runtime.mems_of(shared),
            )
            s.request_stop("done")

        code = await sup.run_until_signal(drive, signal_receiver=no_signals)
        assert code == 0, sup.fatal_error
        nursery.cancel_scope.cancel()
    assert seen["got"] == seen["cpus"]
    assert CPUSet.parse(seen["cpus"]) <= CPUSet.parse("20-39,60-79")  # NUMA node 1
    assert seen["mems"] == "1"
    assert seen["shared_mems"] == "0-1"  # shared containers keep the runtime's default


async def test_no_cpuset_hierarchy_is_one_startup_warning_and_a_metric(
    short_tmp: str, caplog: pytest.LogCaptureFixture
) -> None:
    empty = os.path.join(short_tmp, "no-cgroups")
    os.makedirs(empty)
    node = Node(short_tmp, cgroupRoot=empty)
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        daemon = node.daemon()
        sup = Supervisor()

        async def drive(s: Supervisor) -> None:
            await daemon.startup(s)
            await trio.sleep(0.3)
            s.request_stop("done")

        with caplog.at_level(logging.WARNING):
            code = await sup.run_until_signal(drive, signal_receiver=no_signals)
        assert code == 0, sup.fatal_error
        nursery.cancel_scope.cancel()
    lines = [r for r in caplog.records if "cpusets cannot be verified" in r.getMessage()]
    assert len(lines) == 1
    err = getattr(lines[0], "dracpu_kv", {}).get("err", "")
    assert err.startswith(f"no cpuset cgroup hierarchy under '{empty}'")
    assert f"{empty}/cgroup.controllers" in err and f"{empty}/cpuset" in err
    found = daemon.registry.get_sample_value("dracpu_cgroup_cpuset_hierarchy_found")
    assert found == 0


@pytest.mark.parametrize("publish", [True, False])
async def test_isolated_cpus_never_join_the_shared_pool(short_tmp: str, publish: bool) -> None:
    """isolated-rt boots with isolcpus=2-7,10-15: shared containers run on 0-1,8-9 only."""
    node = Node(short_tmp, fixture="isolated-rt", publishIsolatedCPUs=publish)
    node.runtime = RuntimeSimulator(node.path("nri.sock"), node.path("cg"), node_cpus="0-15")
    seen: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        daemon = node.daemon()
        sup = Supervisor()

        async def drive(s: Supervisor) -> None:
            await daemon.startup(s)
            assert daemon.session is not None
            with trio.fail_after(10):
                await daemon.session.wait_synchronized()
            await node.runtime.create_pod("p-shared", "shared")
            shared_id = await node.runtime.create_container("p-shared", "app")
            seen["cpuset"] = node.runtime.cpuset_of(shared_id)
            assert daemon.debug_port is not None
            status, body = await trio.to_thread.run_sync(fetch, daemon.debug_port, "/debug/state")
            assert status == 200
            seen["state"] = json.loads(body)
            s.request_stop("done")

        code = await sup.run_until_signal(drive, signal_receiver=no_signals)
        assert code == 0, sup.fatal_error
        nursery.cancel_scope.cancel()
    assert seen["cpuset"] == "0-1,8-9"
    state = seen["state"]
    assert state["sharedPool"] == "0-1,8-9"
    assert state["topology"]["isolated"] == "2-7,10-15"
    assert state["topology"]["nohzFull"] == "4-7,12-15"
    # Published isolated CPUs can be claimed; unpublished ones are not dracpu's at all.
    assert state["isolated"] == ("2-7,10-15" if publish else "")


def set_online(sysfs: Path, cpu: int, online: bool, everything: CPUSet) -> CPUSet:
    """Take a CPU offline (or back) in a sysfs tree as the kernel would show it."""
    cpu_dir = sysfs / "devices/system/cpu"
    (cpu_dir / f"cpu{cpu}" / "online").write_text("1\n" if online else "0\n")
    now = CPUSet.parse((cpu_dir / "online").read_text().strip())
    now = (now | CPUSet([cpu])) if online else (now - CPUSet([cpu]))
    (cpu_dir / "online").write_text(f"{now.format()}\n")
    return now & everything


async def test_a_claimed_cpu_taken_offline_and_back(short_tmp: str, tmp_path: Path) -> None:
    """Issue #16: offlining a claimed CPU makes its device UNHEALTHY within 5 s, keeps the
    claim in the checkpoint and republishes the slices without the CPU; onlining it
    restores all three."""
    sysfs = tmp_path / "sys"
    shutil.copytree(FIXTURES / "xeon-2s-ht", sysfs)
    node = Node(short_tmp, sysfsRoot=str(sysfs))
    seen: dict[str, Any] = {}

    def capacity() -> str:
        (numa1,) = [
            d
            for s in node.api.list("resourceslices")
            for d in s["spec"]["devices"]
            if d["name"] == "cpudevnuma001"
        ]
        return str(numa1["capacity"]["dra.cpu/cpu"]["value"])

    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        daemon = node.daemon(hotplug_interval=0.1)
        sup = Supervisor()

        async def drive(s: Supervisor) -> None:
            await daemon.startup(s)
            info = await node.register_until_ready(daemon)
            uid, _ = await node.prepare_claim(info.endpoint, 4)
            seen["uid"] = uid
            assert daemon.state is not None and daemon.kubelet is not None
            cpus = daemon.state.view.cpus_of(uid)
            assert cpus is not None
            victim = seen["victim"] = cpus.max()
            seen["capacity_before"] = capacity()
            set_online(sysfs, victim, False, CPUSet.parse("0-79"))
            with trio.fail_after(5):
                while not daemon.kubelet.health.report().unhealthy:
                    await trio.sleep(0.05)
            seen["unhealthy"] = daemon.kubelet.health.report().unhealthy
            with trio.fail_after(5):
                while capacity() == seen["capacity_before"]:
                    await trio.sleep(0.05)
            seen["capacity_offline"] = capacity()
            seen["pool_offline"] = daemon.state.shared_pool
            seen["gauge"] = daemon.registry.get_sample_value("dracpu_claims_on_offline_cpus")
            checkpoint = json.loads(Path(node.path("state"), "checkpoint.json").read_text())
            seen["checkpoint"] = [(c["uid"], c["cpus"]) for c in checkpoint["claims"]]
            seen["cpus"] = cpus.format()
            set_online(sysfs, victim, True, CPUSet.parse("0-79"))
            with trio.fail_after(5):
                while daemon.kubelet.health.report().unhealthy or capacity() != "40":
                    await trio.sleep(0.05)
            seen["pool_back"] = daemon.state.shared_pool
            s.request_stop("done")

        code = await sup.run_until_signal(drive, signal_receiver=no_signals)
        assert code == 0, sup.fatal_error
        nursery.cancel_scope.cancel()
    victim, uid = seen["victim"], seen["uid"]
    ((device, why),) = seen["unhealthy"]
    assert device == "cpudevnuma001"
    assert why == f"claim default/c1 holds CPU(s) {victim}, which are offline"
    assert (seen["capacity_before"], seen["capacity_offline"]) == ("40", "39")
    assert seen["checkpoint"] == [(uid, seen["cpus"])]  # the claim is kept
    assert seen["gauge"] == 1
    assert victim not in seen["pool_offline"]
    assert seen["pool_back"] == seen["pool_offline"]  # the victim is the claim's, not the pool's


def test_a_restart_keeps_a_claim_whose_cpu_is_offline(short_tmp: str, tmp_path: Path) -> None:
    """The checkpoint's claim holds CPU 79, offline when the daemon starts: it is kept (not
    dropped as 'no longer allocatable'), and CPU 79 stays out of the shared pool."""
    sysfs = tmp_path / "sys"
    shutil.copytree(FIXTURES / "xeon-2s-ht", sysfs)
    set_online(sysfs, 79, False, CPUSet.parse("0-79"))
    node = Node(short_tmp, sysfsRoot=str(sysfs))

    def daemon() -> Daemon:  # start-up steps only: no API server needed
        return Daemon(node.config, kube=None, node_name="node-a")  # type: ignore[arg-type]

    first = daemon()
    first._build_node()
    assert first.checkpoint is not None and first.state is not None
    first.state.restore([ClaimRecord(uid="u1", cpus=CPUSet.parse("39,79"), name="c")])
    first.checkpoint.write()
    second = daemon()
    second._build_node()
    second._restore()
    assert second.state is not None
    assert second.state.view.cpus_of("u1") == CPUSet.parse("39,79")
    assert second.state.view.offline == CPUSet([79])
    assert 79 not in second.state.shared_pool and 79 not in second.state.view.free


async def test_receivers_of_the_owner_end_on_their_own_when_the_daemon_stops(
    short_tmp: str,
) -> None:
    """Stopping the daemon closes the owner's channels (its "state" service): a subscriber
    of claim events gets what was committed, then its loop ends without being cancelled."""
    node = Node(short_tmp)
    received: list[ClaimEvent] = []
    ended = trio.Event()

    async def subscriber(inbox: trio.MemoryReceiveChannel[ClaimEvent]) -> None:
        async for event in inbox:
            received.append(event)
        ended.set()

    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        daemon = node.daemon()
        sup = Supervisor()
        uids: list[str] = []

        async def drive(s: Supervisor) -> None:
            await daemon.startup(s)
            assert daemon.state is not None
            nursery.start_soon(subscriber, daemon.state.claim_events())
            info = await node.register_until_ready(daemon)
            uid, reply = await node.prepare_claim(info.endpoint, 2)
            assert reply.claims[uid].error == ""
            uids.append(uid)
            await trio.testing.wait_all_tasks_blocked()
            assert not ended.is_set()  # running: the subscriber waits for more
            s.request_stop("test done")

        code = await sup.run_until_signal(drive, signal_receiver=no_signals)
        assert code == 0, sup.fatal_error
        with trio.fail_after(10):
            await ended.wait()
        nursery.cancel_scope.cancel()
    assert [(type(e).__name__, e.uid) for e in received] == [("ClaimPrepared", uids[0])]
    assert sup.status()["state"].state == "stopped"
