"""Build Topology objects for allocator tests without a sysfs tree.

``from_rows`` takes one row per CPU; ``grid`` lays out a regular machine the way Linux
numbers it (thread t of global core g is CPU ``t * cores + g``; ``core_id`` restarts in
every socket, as real kernels do).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dracpu.cpuset import CPUSet
from dracpu.topology.model import NO_ID, CoreType, CPUInfo, Topology


@dataclass(frozen=True)
class Row:
    cpu: int
    socket: int
    numa: int
    core: int
    l3: int = NO_ID
    cluster: int = NO_ID
    core_type: CoreType = CoreType.STANDARD


def from_rows(rows: Iterable[Row]) -> Topology:
    rows = sorted(rows, key=lambda r: r.cpu)
    by_core: dict[tuple[int, int, int], list[int]] = {}
    by_numa: dict[int, list[int]] = {}
    for r in rows:
        by_core.setdefault((r.socket, r.cluster, r.core), []).append(r.cpu)
        by_numa.setdefault(r.numa, []).append(r.cpu)
    cpus: dict[int, CPUInfo] = {}
    for r in rows:
        threads = by_core[(r.socket, r.cluster, r.core)]
        sibling = NO_ID
        if len(threads) == 2:
            sibling = threads[0] if threads[1] == r.cpu else threads[1]
        cpus[r.cpu] = CPUInfo(
            cpu=r.cpu,
            socket=r.socket,
            core=r.core,
            numa=r.numa,
            cluster=r.cluster,
            numa_cpus=CPUSet(by_numa[r.numa]),
            l3=r.l3,
            core_type=r.core_type,
            sibling=sibling,
            thread_siblings=CPUSet(threads),
        )
    return Topology(
        cpus=cpus,
        online=CPUSet(cpus),
        smt_enabled=len(cpus) > len(by_core),
    )


def grid_rows(
    sockets: int,
    numa_per_socket: int,
    cores_per_numa: int,
    threads: int = 2,
    cores_per_l3: int | None = None,
) -> list[Row]:
    """Rows of a regular machine; ``cores_per_l3=None`` means no L3 information at all."""
    cores_per_socket = numa_per_socket * cores_per_numa
    total_cores = sockets * cores_per_socket
    rows = []
    for g in range(total_cores):
        socket, local = divmod(g, cores_per_socket)
        numa = socket * numa_per_socket + local // cores_per_numa
        l3 = NO_ID if cores_per_l3 is None else g // cores_per_l3
        for t in range(threads):
            rows.append(Row(cpu=t * total_cores + g, socket=socket, numa=numa, core=local, l3=l3))
    return rows


def grid(
    sockets: int,
    numa_per_socket: int,
    cores_per_numa: int,
    threads: int = 2,
    cores_per_l3: int | None = None,
) -> Topology:
    return from_rows(grid_rows(sockets, numa_per_socket, cores_per_numa, threads, cores_per_l3))


def quirk_19_1() -> Topology:
    """behavior.md §19.1: 16 CPUs, core_id repeats in both sockets, SMT siblings c and c+8."""
    rows = []
    for c in range(16):
        socket = (c // 4) % 2
        core = c % 4
        rows.append(Row(cpu=c, socket=socket, numa=socket, core=core, l3=2 * socket + core // 2))
    return from_rows(rows)


def cs(text: str) -> CPUSet:
    return CPUSet.parse(text)
