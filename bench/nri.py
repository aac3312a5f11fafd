"""NRI: CreateContainer round trips and a 1,000-container shared-pool update.

dracpu's `NRISession` and the `RuntimeSimulator` run in one Trio process and talk over a
real unix socket with the real wire format. `create_container_*` times the simulator's
whole container creation: the CreateContainer call to the plugin, its decision, the reply,
and the cgroup writes of the adjustment. `pool_update_1000_ms` times computing the updates
for 1,000 running shared containers and sending them with UpdateContainers until the
runtime has applied them (1,000 cpuset.cpus writes) and answered; median of 7 runs.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import trio

from dracpu.allocation.store import AllocationStore, ClaimRecord
from dracpu.cpuset import CPUSet
from dracpu.nri.plugin import NRIPlugin
from dracpu.nri.session import NRISession
from dracpu.sim.runtime import RuntimeSimulator
from dracpu.state import NodeState

WARMUP = 200
CREATES = 2000
SHARED = 1000
POOL_RUNS = 7


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _main(sock_dir: str, cgroup_root: str) -> None:
    cpus = CPUSet.parse("0-63")
    store = AllocationStore(cpus, CPUSet())
    plugin = NRIPlugin(NodeState(store))
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
        nursery.cancel_scope.cancel()


def main() -> None:
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
