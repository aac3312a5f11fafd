"""Supervision of `dracpu run` (a child process on the simulated node, xeon-2s-ht fixture):

- ``stop_ms``: SIGTERM to the process's exit, every service stopped in reverse start order
  (the sockets removed), median of ``RUNS``; with ``prepared`` claims held. The target is
  the supervisor's 5 s grace; a healthy stop is far below it.
- ``start_ready_ms``: exec to ``/readyz`` 200, median of ``RUNS`` (the simulated node
  reads ``/readyz`` every 0.1 s, so this is good to ~0.1 s).

Run from a checkout: ``python bench/supervision.py``.
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
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import trio  # noqa: E402

from dracpu_sim.node import SimNode  # noqa: E402

ROOT = str(Path(__file__).resolve().parent.parent / "tests" / "fake_sysfs" / "xeon-2s-ht")
RUNS = 5
CLAIMS = 2  # grouped mode on this fixture: one device per NUMA node, two in all


async def main() -> None:
    workdir = tempfile.mkdtemp(prefix="dsv", dir="/tmp")
    node = SimNode(workdir=workdir, node_cpus="0-79")
    starts: list[float] = []
    stops: list[float] = []
    codes: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        for run in range(RUNS):
            t0 = time.perf_counter()
            daemon = await node.start_daemon(sysfs_root=ROOT)
            starts.append((time.perf_counter() - t0) * 1000)
            if run == 0:  # claims held from here on: every later start restores them
                for i in range(CLAIMS):
                    await node.create(claim(i, 1))
                    await node.create(pod(i))
                while sum(s["phase"] == "Running" for s in node.pod_states().values()) < CLAIMS:
                    await trio.sleep(0.05)
            t0 = time.perf_counter()
            codes.append(await daemon.stop(timeout=10))
            stops.append((time.perf_counter() - t0) * 1000)
        nursery.cancel_scope.cancel()
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"stop_ms: {statistics.median(stops):.0f} ms (target < 5000; {CLAIMS} claims held)")
    print(f"stop_runs_ms: {', '.join(f'{s:.0f}' for s in stops)}")
    print(f"stop_exit_codes: {', '.join(str(c) for c in codes)}")
    print(f"start_ready_ms: {statistics.median(starts):.0f} ms")


if __name__ == "__main__":
    trio.run(main)
