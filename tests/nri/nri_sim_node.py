"""A simulated node for NRI tests: the runtime simulator and dracpu's session over a real
unix socket, with the plugin's stores at hand."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from dracpu.allocation.store import AllocationStore, ClaimRecord, ClaimTracker, ContainerState
from dracpu.cpuset import CPUSet
from dracpu.messages import CpusetUpdateFailed
from dracpu.metrics import DriverMetrics
from dracpu.nri.plugin import NRIPlugin
from dracpu.nri.session import NRISession
from dracpu.sim.runtime import RuntimeSimulator


@dataclass
class SimNode:
    sim: RuntimeSimulator
    session: NRISession
    plugin: NRIPlugin
    store: AllocationStore
    tracker: ClaimTracker
    containers: ContainerState
    metrics: DriverMetrics
    failed: trio.MemoryReceiveChannel[CpusetUpdateFailed]
    cdi: dict[str, CPUSet] = field(default_factory=dict)
    nursery: trio.Nursery | None = None

    def prepare(self, uid: str, cpus: str) -> None:
        self.store.reserve(ClaimRecord(uid=uid, cpus=CPUSet.parse(cpus)))
        self.cdi[uid] = CPUSet.parse(cpus)

    def start_session(self) -> None:
        assert self.nursery is not None
        self.nursery.start_soon(self.session.run)


def reconnects(metrics: DriverMetrics) -> float:
    return float(metrics.nri_reconnects._value.get())


@asynccontextmanager
async def sim_node(
    sock_dir: str,
    cgroup_root: Path,
    *,
    start_session: bool = True,
    sim_kw: Mapping[str, Any] | None = None,
    session_kw: Mapping[str, Any] | None = None,
    node_cpus: str = "0-7",
    plugin_kw: Mapping[str, Any] | None = None,
) -> AsyncIterator[SimNode]:
    socket_path = os.path.join(sock_dir, "nri.sock")
    sim = RuntimeSimulator(socket_path, str(cgroup_root), node_cpus=node_cpus, **(sim_kw or {}))
    store = AllocationStore(CPUSet.parse(node_cpus), CPUSet())
    tracker = ClaimTracker()
    containers = ContainerState()
    cdi: dict[str, CPUSet] = {}
    plugin = NRIPlugin(
        store=store,
        tracker=tracker,
        containers=containers,
        claim_cpus_from_cdi=lambda: cdi,
        **(plugin_kw or {}),
    )
    send, receive = trio.open_memory_channel[CpusetUpdateFailed](1000)
    metrics = DriverMetrics(CollectorRegistry())
    kw: dict[str, Any] = {"reconnect_backoff": (0.01, 0.1)}
    kw.update(session_kw or {})
    session = NRISession(socket_path, plugin, failed_updates=send, metrics=metrics, **kw)
    node = SimNode(sim, session, plugin, store, tracker, containers, metrics, receive, cdi)
    async with trio.open_nursery() as nursery:
        node.nursery = nursery
        await nursery.start(sim.run)
        if start_session:
            await nursery.start(session.run)
            await session.wait_synchronized()
            await sim.wait_plugin_ready()
        yield node
        nursery.cancel_scope.cancel()
