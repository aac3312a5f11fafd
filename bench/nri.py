"""NRI: CreateContainer round trips and a 1,000-container shared-pool update.

dracpu's `NRISession` and the `RuntimeSimulator` run in one Trio process and talk over a
real unix socket with the real wire format. `create_container_*` times the simulator's
whole container creation: the CreateContainer call to the plugin, its decision, the reply,
and the cgroup writes of the adjustment. `pool_update_1000_ms` times computing the updates
for 1,000 running shared containers and sending them with UpdateContainers until the
runtime has applied them (1,000 cpuset.cpus writes) and answered; median of 7 runs.

`pool_convergence_1000_ms` is the same pool change with the simulator in containerd-drop
mode (the runtime says yes and applies nothing): from the state owner's SharedPoolChanged
through the pool pusher and the verifier's read-back to the last of the 1,000 cgroups
written by dracpu itself; median of 5 runs. `reconnect_after_socket_ms` is a runtime
restart: from the runtime binding its socket again to the session synchronized; median of
5 restarts.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import trio

from dracpu.allocation.prepare import ClaimPlan
from dracpu.allocation.store import AllocationStore, ClaimRecord, PreparedDevice
from dracpu.cgroupfs.verify import Verifier
from dracpu.cgroupfs.writer import CgroupWriter
from dracpu.cpuset import CPUSet
from dracpu.messages import VerifyCpusets
from dracpu.nri.plugin import NRIPlugin
from dracpu.nri.pusher import PoolPusher
from dracpu.nri.session import NRISession
from dracpu.sim.runtime import RuntimeSimulator
from dracpu.state import NodeState

WARMUP = 200
CREATES = 2000
SHARED = 1000
POOL_RUNS = 7
CONVERGE_RUNS = 5
RECONNECT_RUNS = 5
DEVICE = (PreparedDevice(pool_name="bench", device_name="cpudev008"),)


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _main(sock_dir: str, cgroup_root: str) -> None:
    cpus = CPUSet.parse("0-63")
    store = AllocationStore(cpus, CPUSet())
    state = NodeState(store)
    plugin = NRIPlugin(state)
    socket_path = os.path.join(sock_dir, "nri.sock")
    sim = RuntimeSimulator(socket_path, cgroup_root, node_cpus="0-63")
    session = NRISession(socket_path, plugin)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run)
        await nursery.start(session.run)
        await sim.wait_plugin_ready()
        await sim.create_pod("bench", "bench")

        store.reserve(ClaimRecord(uid="A", cpus=CPUSet.parse("0-3")))
        samples: list[float] = []
        for i in range(WARMUP + CREATES):
            env = ["DRA_CPUSET_A=0-3"] if i % 2 else []
            start = time.perf_counter()
            cid = await sim.create_container("bench", f"c{i % 2}", env)
            elapsed = time.perf_counter() - start
            if i >= WARMUP:
                samples.append(elapsed)
            await sim.remove_container(cid)
        store.release("A")
        print(f"create_container_p50_ms: {_percentile(samples, 0.50) * 1000:.3f}")
        print(f"create_container_p99_ms: {_percentile(samples, 0.99) * 1000:.3f}")

        await sim.create_pod("shared", "shared")
        for i in range(SHARED):
            await sim.create_container("shared", f"s{i}")
        runs: list[float] = []
        for run in range(POOL_RUNS):
            if run % 2 == 0:
                store.reserve(ClaimRecord(uid="B", cpus=CPUSet.parse("0-7")))
            else:
                store.release("B")
            start = time.perf_counter()
            failed = await session.update_containers(plugin.shared_pool_updates())
            runs.append(time.perf_counter() - start)
            assert not failed, failed
        print(f"pool_update_1000_ms: {statistics.median(runs) * 1000:.3f}")
        converge = await _pool_convergence(nursery, sim, state, plugin, session, cgroup_root)
        print(f"pool_convergence_1000_ms: {converge * 1000:.3f}")
        reconnect = await _reconnect(sim, session)
        print(f"reconnect_after_socket_ms: {reconnect * 1000:.3f}")
        nursery.cancel_scope.cancel()


async def _pool_convergence(
    nursery: trio.Nursery,
    sim: RuntimeSimulator,
    state: NodeState,
    plugin: NRIPlugin,
    session: NRISession,
    cgroup_root: str,
) -> float:
    verify_send, verify_recv = trio.open_memory_channel[VerifyCpusets](math.inf)
    verifier = _SignallingVerifier(CgroupWriter(cgroup_root), plugin.intents)
    pusher = PoolPusher(state.pool_changes(), plugin, session, verify=verify_send)
    await nursery.start(verifier.run, verify_recv)
    await nursery.start(pusher.run)
    sim.set_update_mode("containerd-drop")
    shared = [c.id for c in sim.containers if c.pod_uid == "shared"]
    runs: list[float] = []
    for run in range(CONVERGE_RUNS):
        plan = ClaimPlan(
            record=ClaimRecord(uid=f"C{run}", cpus=CPUSet.parse("8-15"), devices=DEVICE)
        )
        if run % 2 == 0:
            state.begin_prepare(plan)
            state.finish_prepare(plan)
        else:
            state.begin_unprepare(f"C{run - 1}")
            state.finish_unprepare(f"C{run - 1}")
        want = state.shared_pool.format()
        start = time.perf_counter()
        # Woken by the verifier's pass itself: a polling loop here would take the GIL
        # from the verifier's worker thread a thousand times a second.
        while verifier.rewritten < len(shared) * (run + 1):
            await verifier.wait_pass()
        runs.append(time.perf_counter() - start)
        assert all(sim.cpuset_of(c) == want for c in shared), "a cgroup did not converge"
    sim.set_update_mode("apply")
    return statistics.median(runs)


class _SignallingVerifier(Verifier):
    """The verifier, telling the bench when each pass is over."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._passed = trio.Event()

    async def verify(self, message: VerifyCpusets) -> list[str]:
        written = await super().verify(message)
        self._passed.set()
        return written

    async def wait_pass(self) -> None:
        await self._passed.wait()
        self._passed = trio.Event()


async def _reconnect(sim: RuntimeSimulator, session: NRISession) -> float:
    runs: list[float] = []
    for _ in range(RECONNECT_RUNS):
        await sim.restart(downtime=0.05)  # returns once the socket is bound again
        start = time.perf_counter()
        await sim.wait_plugin_ready()
        await session.wait_synchronized()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    # The restarts log a warning each; the figures are the output.
    logging.basicConfig(level=logging.ERROR)
    sock_dir = tempfile.mkdtemp(dir="/tmp", prefix="nri-bench-")
    # cgroupfs lives in memory: keep the simulated tree on tmpfs when there is one.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    cgroup_root = tempfile.mkdtemp(prefix="nri-bench-cg-", dir=shm)
    try:
        trio.run(_main, sock_dir, cgroup_root)
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
        shutil.rmtree(cgroup_root, ignore_errors=True)


if __name__ == "__main__":
    main()
