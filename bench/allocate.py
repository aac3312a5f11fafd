"""Allocator latency on a 768-CPU and a 2,048-CPU machine with half their CPUs taken.

768 CPUs, grouped mode (behavior.md §8.2): the allocator gets the free CPUs of one NUMA node
as candidates. The machine is the epyc-2s-768 fixture when topology discovery is available,
else an equivalent Topology built in code (2 sockets x 192 cores x 2 threads, one NUMA node
per socket, one L3 per 16 cores).

2,048 CPUs, machine mode: the candidates are every free CPU of a machine built in code
(8 sockets x 128 cores x 2 threads, one NUMA node per socket, one L3 per 8 cores: 128 L3
groups), and the sizes include the whole-machine request (every free CPU), which walks
every step of the packed algorithm on every L3 group. The same whole-machine request on the
768-CPU machine gives the scaling ratio: linear growth is 2048/768 = 2.67.

Times are wall clock; the ``_p99_cpu_ms`` lines give the same p99 in this thread's CPU time,
which leaves out the time other processes held the CPU (on a shared machine a sample that
is preempted once gains a whole scheduler tick, a few ms).

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
WHOLE_ROUNDS = 100


def built_grid(sockets: int, cores_per_socket: int, cores_per_l3: int) -> Topology:
    """2 threads per core, one NUMA node per socket; CPU t * cores + g as Linux numbers it."""
    threads = 2
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
                l3=g // cores_per_l3,
                sibling=(siblings - CPUSet([cpu])).min(),
                thread_siblings=siblings,
            )
    return Topology(cpus=dict(sorted(cpus.items())), online=CPUSet(cpus), smt_enabled=True)


def load_768() -> tuple[Topology, str]:
    # Discovery lands separately; use it only when both it and the fixture exist.
    discover = getattr(importlib.import_module("dracpu.topology"), "discover_from_root", None)
    if discover is not None and FIXTURE.is_dir():
        topo = discover(str(FIXTURE))
        assert isinstance(topo, Topology)
        return topo, "fixture epyc-2s-768"
    return built_grid(2, 192, 16), "built in code"


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


def timed(
    topo: Topology, candidates: CPUSet, size: int, rounds: int
) -> tuple[list[float], list[float]]:
    """Wall-clock and thread-CPU milliseconds of ``rounds`` calls."""
    wall, cpu = [], []
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.thread_time()
        take_cpus(topo, candidates, size)
        c1, t1 = time.thread_time(), time.perf_counter()
        wall.append((t1 - t0) * 1e3)
        cpu.append((c1 - c0) * 1e3)
    return wall, cpu


def first_call_ms(topo: Topology, candidates: CPUSet) -> float:
    start = time.perf_counter()
    take_cpus(topo, candidates, 1)  # builds and caches the per-topology index
    return (time.perf_counter() - start) * 1e3


def report(prefix: str, topo: Topology, candidates: CPUSet, sizes: tuple[int, ...]) -> None:
    """Per-size p50/p99 lines and the p50/p99 over every sample of every size."""
    print(f"{prefix}_first_call_ms: {first_call_ms(topo, candidates):.3f}")
    everything: list[float] = []
    everything_cpu: list[float] = []
    for size in sizes:
        name = "whole" if size == len(candidates) else str(size)
        wall, cpu = timed(topo, candidates, size, ROUNDS if name != "whole" else WHOLE_ROUNDS)
        everything += wall
        everything_cpu += cpu
        print(f"{prefix}_{name}_p50_ms: {statistics.median(wall):.3f}")
        print(f"{prefix}_{name}_p99_ms: {percentile(wall, 0.99):.3f}")
    print(f"{prefix}_p50_ms: {statistics.median(everything):.3f}")
    print(f"{prefix}_p99_ms: {percentile(everything, 0.99):.3f}")
    print(f"{prefix}_p99_cpu_ms: {percentile(everything_cpu, 0.99):.3f}")


def main() -> int:
    topo, source = load_768()
    if topo.num_cpus != 768:
        print(f"expected 768 CPUs, got {topo.num_cpus} ({source})", file=sys.stderr)
        return 1
    free = topo.all_cpus - half_taken(topo)
    numa = min(topo.by_numa)
    candidates = free & topo.by_numa[numa]
    print(f"# 768: {source}; candidates: {len(candidates)} free CPUs of NUMA {numa}")
    report("allocate_768cpu", topo, candidates, SIZES)
    # The ratio compares thread-CPU medians: other processes' time would only add noise.
    whole_768 = statistics.median(timed(topo, free, len(free), WHOLE_ROUNDS)[1])
    print(f"allocate_768cpu_machine_whole_p50_cpu_ms: {whole_768:.3f}")

    big = built_grid(8, 128, 8)
    big_free = big.all_cpus - half_taken(big)
    print(f"# 2048: built in code; candidates: all {len(big_free)} free CPUs")
    report("allocate_2048cpu", big, big_free, (*SIZES, len(big_free)))
    whole_2048 = statistics.median(timed(big, big_free, len(big_free), WHOLE_ROUNDS)[1])
    print(f"allocate_whole_machine_2048_over_768_ratio: {whole_2048 / whole_768:.2f} (linear 2.67)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
