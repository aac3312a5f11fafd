"""The whole daemon (`dracpu run` as a child process) on the simulated node, 768-CPU fixture:

- ``start_ready_ms``: from exec to ``/readyz`` 200 (registered with the kubelet, synchronized
  with the runtime, slices published), individual mode (768 devices, 6 slices); median of 3.
  ``python_startup_ms`` is the same interpreter importing nothing but starting, for scale.
- ``rss_mb``: the daemon's resident memory with 200 prepared claims in running pods and
  2,000 containers in all, after the work settled; ``rss_idle_mb`` before any workload.
- ``pods_per_s``: how fast the 200 claim pods went from created to running (scheduler,
  kubelet prepare over gRPC, NRI CreateContainer, cgroup writes).
"""

from __future__ import annotations

import os
import sys

# Imported while bench/ is still on sys.path (taken off below).
from shared.sim_workload import claim, pod

# bench/grpc.py shadows the grpcio package that the simulated kubelet imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import trio  # noqa: E402

from dracpu_sim.node import SimNode  # noqa: E402

ROOT = str(Path(__file__).resolve().parent.parent / "tests" / "fake_sysfs" / "epyc-2s-768")
CLAIMS = 200
CONTAINERS = 2000
STARTS = 3


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def main() -> None:
    workdir = tempfile.mkdtemp(prefix="drb", dir="/tmp")
    node = SimNode(workdir=workdir, node_cpus="0-767", node_mems="0-1")
    extra = ["--cpu-device-mode=individual"]
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        starts = []
        for _ in range(STARTS):
            t0 = time.perf_counter()
            daemon = await node.start_daemon(sysfs_root=ROOT, extra_args=extra)
            starts.append((time.perf_counter() - t0) * 1000)
            if len(starts) < STARTS:
                await daemon.stop()
        assert node.daemon is not None
        pid = node.daemon.process.pid
        idle = rss_mb(pid)
        t0 = time.perf_counter()
        for i in range(CLAIMS):
            await node.create(claim(i, 2))
            await node.create(pod(i))
        while True:
            states = node.pod_states()
            if sum(1 for s in states.values() if s["phase"] == "Running") == CLAIMS:
                break
            await trio.sleep(0.1)
        pods_s = CLAIMS / (time.perf_counter() - t0)
        assert node.runtime is not None
        for i in range(CONTAINERS - CLAIMS):
            if i % 10 == 0:
                pod_uid = f"bench-{i}"
                await node.runtime.create_pod(pod_uid, f"plain-{i}")
            await node.runtime.create_container(pod_uid, f"c{i % 10}")
        await trio.sleep(2)
        state = await node.debug_state()
        assert len(state["claims"]) == CLAIMS, len(state["claims"])
        assert len(state["containers"]) == CONTAINERS, len(state["containers"])
        loaded = rss_mb(pid)
        nursery.cancel_scope.cancel()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    python_ms = (time.perf_counter() - t0) * 1000
    print(f"start_ready_ms: {statistics.median(starts):.0f} ms (target < 1500)")
    print(f"start_ready_runs_ms: {', '.join(f'{s:.0f}' for s in starts)}")
    print(f"python_startup_ms: {python_ms:.0f} ms")
    print(f"rss_idle_mb: {idle:.1f} MB")
    print(f"rss_mb: {loaded:.1f} MB (target < 80; {CLAIMS} claims, {CONTAINERS} containers)")
    print(f"pods_per_s: {pods_s:.1f} pods/s")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    trio.run(main)
