"""A simulated node for NRI tests: the runtime simulator and dracpu's session over a real
unix socket, with the plugin's stores at hand."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from dracpu.allocation.store import AllocationStore, ClaimRecord
from dracpu.cdi import write_claim_spec
from dracpu.cpuset import CPUSet
from dracpu.metrics import DriverMetrics
from dracpu.nri.plugin import NRIPlugin
from dracpu.nri.session import NRISession
from dracpu.state import NodeState, NodeView
from dracpu_sim.runtime import RuntimeSimulator


@dataclass
class SimNode:
    sim: RuntimeSimulator
    session: NRISession
    plugin: NRIPlugin
    state: NodeState
    metrics: DriverMetrics
    cdi_dir: str
    nursery: trio.Nursery | None = None

    @property
    def view(self) -> NodeView:
        return self.state.view

    def prepare(self, uid: str, cpus: str) -> None:
        """A prepared claim (restored, as at start-up) with its CDI spec on disk."""
        self.state.restore([ClaimRecord(uid=uid, cpus=CPUSet.parse(cpus))])
        write_claim_spec(self.cdi_dir, uid, CPUSet.parse(cpus))

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
    mems_of: Callable[[CPUSet], str] | None = None,
) -> AsyncIterator[SimNode]:
    socket_path = os.path.join(sock_dir, "nri.sock")
    # Pods without a QoS class of their own get the guaranteed layout
    # (/kubepods/pod<uid>/<id>), which the tests here name; sim_kw may choose another.
    sim_args: dict[str, Any] = {"default_qos": "guaranteed", **(sim_kw or {})}
    sim = RuntimeSimulator(socket_path, str(cgroup_root), node_cpus=node_cpus, **sim_args)
    state = NodeState(AllocationStore(CPUSet.parse(node_cpus), CPUSet()), mems_of=mems_of)
    plugin = NRIPlugin(state)
    cdi_dir = os.path.join(sock_dir, "cdi")
    metrics = DriverMetrics(CollectorRegistry())
    kw: dict[str, Any] = {"reconnect_backoff": (0.01, 0.1)}
    kw.update(session_kw or {})
    session = NRISession(socket_path, plugin, cdi_dir=cdi_dir, metrics=metrics, **kw)
    node = SimNode(sim, session, plugin, state, metrics, cdi_dir)
    async with trio.open_nursery() as nursery:
        node.nursery = nursery
        await nursery.start(sim.run)
        if start_session:
            await nursery.start(session.run)
            await session.wait_synchronized()
            await sim.wait_plugin_ready()
        yield node
        nursery.cancel_scope.cancel()
