"""Latency of one grouped-mode allocation on a 768-CPU machine with half its CPUs taken.

Grouped mode (behavior.md §8.2) calls the allocator with the free CPUs of one NUMA node as
candidates. The machine is the epyc-2s-768 fixture when topology discovery is available,
else an equivalent Topology built in code (2 sockets x 192 cores x 2 threads, one NUMA node
per socket, one L3 per 16 cores).

Run from the repo root: .venv/bin/python bench/allocate.py
"""

from __future__ import annotations

import importlib
import statistics
import sys
import time
from pathlib import Path

from dracpu.allocation import take_cpus
from dracpu.cpuset import CPUSet
from dracpu.topology.model import CPUInfo, Topology

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fake_sysfs" / "epyc-2s-768"
SIZES = (1, 8, 64, 190)
ROUNDS = 400


def built_768() -> Topology:
    cores_per_socket, threads, sockets = 192, 2, 2
    total_cores = cores_per_socket * sockets
    cpus: dict[int, CPUInfo] = {}
    numa_cpus = {
        s: CPUSet(
            t * total_cores + s * cores_per_socket + c
            for t in range(threads)
            for c in range(cores_per_socket)
        )
        for s in range(sockets)
    }
    for g in range(total_cores):
        socket, local = divmod(g, cores_per_socket)
        siblings = CPUSet(t * total_cores + g for t in range(threads))
        for t in range(threads):
            cpu = t * total_cores + g
            cpus[cpu] = CPUInfo(
                cpu=cpu,
                socket=socket,
                core=local,
                numa=socket,
                numa_cpus=numa_cpus[socket],
                l3=g // 16,
                sibling=(siblings - CPUSet([cpu])).min(),
                thread_siblings=siblings,
            )
    return Topology(cpus=dict(sorted(cpus.items())), online=CPUSet(cpus), smt_enabled=True)


def load_topology() -> tuple[Topology, str]:
    # Discovery lands separately; use it only when both it and the fixture exist.
    discover = getattr(importlib.import_module("dracpu.topology"), "discover_from_root", None)
    if discover is not None and FIXTURE.is_dir():
        topo = discover(str(FIXTURE))
        assert isinstance(topo, Topology)
        return topo, "fixture epyc-2s-768"
    return built_768(), "built in code"


def half_taken(topo: Topology) -> CPUSet:
    """A fragmented pattern per 4 cores: both threads, the first, the second, none."""
    taken = 0
    for i, threads in enumerate(topo.by_core_key.values()):
        order = list(threads)
        pick = {0: order, 1: order[:1], 2: order[1:2], 3: []}[i % 4]
        for cpu in pick:
            taken |= 1 << cpu
    return CPUSet.from_mask(taken)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    topo, source = load_topology()
    if topo.num_cpus != 768:
        print(f"expected 768 CPUs, got {topo.num_cpus} ({source})", file=sys.stderr)
        return 1
    free = topo.all_cpus - half_taken(topo)
    numa = min(topo.by_numa)
    candidates = free & topo.by_numa[numa]
    start = time.perf_counter()
    take_cpus(topo, candidates, 1)  # builds and caches the per-topology index
    first_ms = (time.perf_counter() - start) * 1e3
    print(f"# topology: {source}; candidates: {len(candidates)} free CPUs of NUMA {numa}")
    print(f"allocate_768cpu_first_call_ms: {first_ms:.3f}")
    everything: list[float] = []
    for size in SIZES:
        samples = []
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            take_cpus(topo, candidates, size)
            samples.append((time.perf_counter() - t0) * 1e3)
        everything += samples
        print(f"allocate_768cpu_{size}_p50_ms: {statistics.median(samples):.3f}")
        print(f"allocate_768cpu_{size}_p99_ms: {percentile(samples, 0.99):.3f}")
    print(f"allocate_768cpu_p50_ms: {statistics.median(everything):.3f}")
    print(f"allocate_768cpu_p99_ms: {percentile(everything, 0.99):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
