"""A node for the kubelet tests: real topology fixtures, a real store and inventory, claims
in memory, the plugin on real unix sockets, and grpcio stubs for both DRA API versions.

Claims come from ``builders.claim`` and ``builders.result``; ``claim``, ``result`` and
``short_dir`` are importable from here too, for the tests that import them with the rest of
the harness (``tests/hardening``)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import grpc
import trio
from builders import NODE, machine, short_dir
from builders import claim as claim
from builders import result as result
from prometheus_client import CollectorRegistry

from dracpu.allocation.prepare import ClaimAllocation
from dracpu.allocation.store import AllocationStore
from dracpu.atomicfile import atomic_write
from dracpu.cpuset import CPUSet
from dracpu.devices import DeviceInventory, DeviceSettings, build_inventory
from dracpu.kubelet import (
    DRAService,
    HealthService,
    KubeletPlugin,
    MemoryClaimSource,
    RegistrationService,
)
from dracpu.messages import SharedPoolChanged
from dracpu.metrics import DriverMetrics
from dracpu.proto.dra.v1 import api_pb2 as dra_v1
from dracpu.proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from dracpu.state import CheckpointFile, NodeState, NodeView
from dracpu.topology.model import Topology

VERSIONS: dict[str, ModuleType] = {"v1": dra_v1, "v1beta1": dra_v1beta1}


@dataclass
class Node:
    topology: Topology
    inventory: DeviceInventory
    state: NodeState
    metrics: DriverMetrics
    registry: CollectorRegistry
    claims: MemoryClaimSource
    cdi_dir: str
    service: DRAService
    pool: trio.MemoryReceiveChannel[SharedPoolChanged]
    published: list[str] = field(default_factory=list)

    @property
    def view(self) -> NodeView:
        return self.state.view

    @property
    def changes(self) -> list[str]:
        """Every shared pool the state owner published so far."""
        while True:
            try:
                self.published.append(self.pool.receive_nowait().cpus)
            except trio.WouldBlock:
                return self.published

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    async def start_checkpoint(
        self,
        nursery: trio.Nursery,
        state_dir: str,
        write_file: Callable[..., None] = atomic_write,
    ) -> CheckpointFile:
        """Run the real checkpoint writer for this node (``write_file`` may wrap the write)."""
        checkpoint = CheckpointFile(
            self.state, state_dir, boot_id="boot", config_fingerprint="fp", write_file=write_file
        )
        await nursery.start(checkpoint.run, self.state.claims_changes())
        return checkpoint

    def restart(self, store: AllocationStore | None = None, **options: Any) -> DRAService:
        """A new service over ``store`` (default: this one), like a restarted daemon;
        ``options`` are more ``DRAService`` arguments (``plugin_data_dir=...``)."""
        if store is not None:
            self.state = NodeState(store, metrics=self.metrics)
        self.service = DRAService(
            claims=self.claims,
            state=self.state,
            inventory=self.inventory,
            topology=self.topology,
            online=self.topology.online,
            cdi_dir=self.cdi_dir,
            metrics=self.metrics,
            node_name=NODE,
            **options,
        )
        return self.service


def make_node(
    cdi_dir: str,
    *,
    fixture: str = "epyc-nps4",
    mode: str = "grouped",
    group_by: str = "numanode",
    reserved: str = "",
    offload_io: bool | None = None,
) -> Node:
    topo = machine(fixture)
    reserved_set = CPUSet.parse(reserved)
    settings = DeviceSettings(mode=mode, group_by=group_by, reserved=reserved_set)  # type: ignore[arg-type]
    inventory = build_inventory(topo, settings)
    # As the daemon: reserved CPUs of the node are the shared pool's floor. (Without a
    # reservation the daemon would keep a core; the harness keeps every CPU publishable and
    # relies on the store's refusal to empty the pool instead.)
    store = AllocationStore(
        topo.all_cpus - reserved_set, reserved_set, floor=reserved_set & topo.all_cpus
    )
    registry = CollectorRegistry()
    metrics = DriverMetrics(registry)
    claims = MemoryClaimSource()
    state = NodeState(store, metrics=metrics)
    pool = state.pool_changes()
    service = DRAService(
        claims=claims,
        state=state,
        inventory=inventory,
        topology=topo,
        online=topo.online,
        cdi_dir=cdi_dir,
        metrics=metrics,
        node_name=NODE,
        offload_io=offload_io,
    )
    return Node(topo, inventory, state, metrics, registry, claims, cdi_dir, service, pool)


# -- the plugin on real sockets ----------------------------------------------------------------


@dataclass
class Served:
    plugin: KubeletPlugin
    scope: trio.CancelScope
    stopped: trio.Event

    async def stop(self) -> None:
        self.scope.cancel()
        with trio.fail_after(10):
            await self.stopped.wait()


async def start_plugin(
    nursery: trio.Nursery,
    root: str,
    service: DRAService,
    health: HealthService | None = None,
    registration: RegistrationService | None = None,
) -> Served:
    plugin = KubeletPlugin(
        root,
        service,
        health or HealthService(node_name=NODE, devices=()),
        registration,
        grace_period=2.0,
    )
    served = Served(plugin, trio.CancelScope(), trio.Event())

    async def run(task_status: trio.TaskStatus[None]) -> None:
        try:
            with served.scope:
                await plugin.run(task_status=task_status)
        finally:
            served.stopped.set()

    await nursery.start(run)
    return served


@asynccontextmanager
async def serving(
    nursery: trio.Nursery, service: DRAService, health: HealthService | None = None
) -> AsyncIterator[tuple[Served, grpc.Channel]]:
    root = short_dir("k.")
    served = await start_plugin(nursery, root, service, health)
    channel = grpc.insecure_channel("unix:" + served.plugin.dra_socket)
    try:
        yield served, channel
    finally:
        channel.close()
        await served.stop()
        shutil.rmtree(root, ignore_errors=True)


def dra_path(version: str, method: str) -> str:
    return f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/{method}"


def prepare_stub(channel: grpc.Channel, version: str = "v1") -> Any:
    pb = VERSIONS[version]
    return channel.unary_unary(
        dra_path(version, "NodePrepareResources"),
        request_serializer=pb.NodePrepareResourcesRequest.SerializeToString,
        response_deserializer=pb.NodePrepareResourcesResponse.FromString,
    )


def unprepare_stub(channel: grpc.Channel, version: str = "v1") -> Any:
    pb = VERSIONS[version]
    return channel.unary_unary(
        dra_path(version, "NodeUnprepareResources"),
        request_serializer=pb.NodeUnprepareResourcesRequest.SerializeToString,
        response_deserializer=pb.NodeUnprepareResourcesResponse.FromString,
    )


def prepare_request(version: str, *claims: ClaimAllocation) -> Any:
    pb = VERSIONS[version]
    return pb.NodePrepareResourcesRequest(
        claims=[pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
    )


def unprepare_request(version: str, *claims: ClaimAllocation) -> Any:
    pb = VERSIONS[version]
    return pb.NodeUnprepareResourcesRequest(
        claims=[pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
    )


async def in_thread(fn: Callable[[], Any]) -> Any:
    return await trio.to_thread.run_sync(fn)


def rpc_error(fn: Callable[[], Any]) -> grpc.RpcError:
    try:
        fn()
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("call succeeded")
