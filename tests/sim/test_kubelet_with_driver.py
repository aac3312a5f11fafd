"""The simulated scheduler and kubelet against dracpu's own kubelet plugin: the real
registration and DRA sockets, the real claim reader over the loopback API server, real
CDI specs, and CPUs chosen by the real allocator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import builders
import pytest
import trio
from builders import NODE, device_class, machine, resource_claim
from prometheus_client import CollectorRegistry

from dracpu.allocation.store import AllocationStore
from dracpu.cpuset import CPUSet
from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.k8s.client import KubeClient
from dracpu.kubelet import DRAService, HealthService, KubeletPlugin
from dracpu.kubelet.claims import ApiClaimSource
from dracpu.metrics import DriverMetrics
from dracpu.state import NodeState
from dracpu_sim.apiserver import SimAPIServer
from dracpu_sim.kubelet import MemoryRuntime, SimKubelet
from dracpu_sim.scheduler import Scheduler


@dataclass
class World:
    server: SimAPIServer
    api: KubeClient
    store: AllocationStore
    scheduler: Scheduler
    kubelet: SimKubelet
    runtime: MemoryRuntime

    def claim(self, name: str, cpus: int) -> dict[str, object]:
        return self.server.create("resourceclaims", resource_claim(name, cpus))

    def pod(self, name: str, claim: str) -> dict[str, object]:
        return self.server.create("pods", builders.pod(name, claim))


@pytest.fixture
async def world(nursery: trio.Nursery, tmp_path: Path, short_tmp: str) -> AsyncIterator[World]:
    root = short_tmp
    server = SimAPIServer(seed=5)
    await nursery.start(server.serve)
    api = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    topo = machine("epyc-nps4")  # 4 NUMA nodes of 32 CPUs
    inventory = build_inventory(topo, DeviceSettings())
    server.create("deviceclasses", device_class())
    for obj in build_slices(inventory, node_name=NODE, node_uid="u", expose_pcie_roots=False):
        server.create("resourceslices", obj)
    store = AllocationStore(topo.all_cpus, CPUSet())
    cdi_dir = str(tmp_path / "cdi")
    dra = DRAService(
        claims=ApiClaimSource(api, pool=NODE),
        state=NodeState(store),
        inventory=inventory,
        topology=topo,
        online=topo.online,
        cdi_dir=cdi_dir,
        metrics=DriverMetrics(CollectorRegistry()),
        node_name=NODE,
    )
    plugin = KubeletPlugin(root, dra, HealthService(node_name=NODE, devices=[]), grace_period=1.0)
    runtime = MemoryRuntime()
    world = World(
        server,
        api,
        store,
        Scheduler(api, NODE),
        SimKubelet(root, api, runtime, NODE, cdi_dir=cdi_dir),
        runtime,
    )
    scope = trio.CancelScope()
    await nursery.start(run_plugin, scope, plugin)
    yield world
    scope.cancel()
    api.close()


async def run_plugin(
    scope: trio.CancelScope,
    plugin: KubeletPlugin,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with scope:
        await plugin.run(task_status=task_status)


async def wait_registered(world: World) -> None:
    with trio.fail_after(10):
        while "dra.cpu" not in world.kubelet.plugins:
            await world.kubelet.sync_plugins()
            await trio.sleep(0.01)


async def test_pod_with_a_claim_runs_with_its_exclusive_cpus(world: World) -> None:
    await wait_registered(world)
    registered = world.kubelet.plugins["dra.cpu"]
    assert registered.service == "v1.DRAPlugin"
    claim = world.claim("pinned", 4)
    pod = world.pod("web", "pinned")
    [outcome] = await world.scheduler.schedule_once()
    assert outcome.kind == "Scheduled"
    await world.kubelet.sync_pods()
    st = world.kubelet.pods[str(pod["metadata"]["uid"])]  # type: ignore[index]
    assert st.errors == []
    [env] = [c.env for c in st.containers.values()]
    uid = claim["metadata"]["uid"]  # type: ignore[index]
    [entry] = [e for e in env if e.startswith("DRA_CPUSET_")]
    name, cpus = entry.split("=")
    assert name == f"DRA_CPUSET_{uid}"
    assert len(CPUSet.parse(cpus)) == 4
    # The driver's store agrees with what the container got.
    assert store_cpus(world, str(uid)) == CPUSet.parse(cpus)

    world.server.delete("pods", "web", "default")
    await world.kubelet.sync_pods()
    assert world.kubelet.prepared == {}
    assert store_cpus(world, str(uid)) is None
    # ... and the scheduler hands the capacity back.
    [freed] = await world.scheduler.schedule_once()
    assert freed.kind == "Deallocated"


async def test_an_impossible_claim_never_reaches_the_driver(world: World) -> None:
    await wait_registered(world)
    world.claim("huge", 64)
    world.pod("huge", "huge")
    [outcome] = await world.scheduler.schedule_once()
    assert outcome.message == (
        'claim default/huge: request "cpus": no device in class dra.cpu on node-a has '
        "64 dra.cpu/cpu capacity left (largest: 32)"
    )
    await world.kubelet.sync_pods()
    assert world.kubelet.pods == {}


def store_cpus(world: World, uid: str) -> CPUSet | None:
    for record in world.store.records():
        if record.uid == uid:
            return record.cpus
    return None
