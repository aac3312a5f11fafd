"""Small Topology objects for device tests, built without a sysfs tree.

``grid`` numbers CPUs the way Linux does on x86: thread t of global core g is CPU
``t * total_cores + g``, and ``core_id`` restarts in every socket. Each NUMA node has its
own L3 id (its index), unless ``l3=False``.
"""

from __future__ import annotations

from collections.abc import Mapping

from dracpu.cpuset import CPUSet
from dracpu.topology.model import NO_ID, CoreType, CPUInfo, Topology


def grid(
    sockets: int,
    numa_per_socket: int,
    cores_per_numa: int,
    *,
    threads: int = 2,
    l3: bool = True,
    online: CPUSet | None = None,
    pcie_roots: Mapping[str, CPUSet] | None = None,
    e_cores: CPUSet | None = None,
) -> Topology:
    cores_per_socket = numa_per_socket * cores_per_numa
    total_cores = sockets * cores_per_socket
    layout: dict[int, tuple[int, int, int]] = {}  # cpu -> (socket, numa, core)
    for g in range(total_cores):
        socket, local = divmod(g, cores_per_socket)
        numa = socket * numa_per_socket + local // cores_per_numa
        for t in range(threads):
            layout[t * total_cores + g] = (socket, numa, local)
    numa_cpus: dict[int, CPUSet] = {}
    core_cpus: dict[tuple[int, int], CPUSet] = {}
    for cpu, (socket, numa, core) in layout.items():
        numa_cpus[numa] = numa_cpus.get(numa, CPUSet()).add(cpu)
        core_cpus[(socket, core)] = core_cpus.get((socket, core), CPUSet()).add(cpu)
    hybrid = e_cores is not None
    cpus: dict[int, CPUInfo] = {}
    for cpu in sorted(layout):
        socket, numa, core = layout[cpu]
        siblings = core_cpus[(socket, core)]
        sibling = NO_ID
        if len(siblings) == 2:
            sibling = (siblings - CPUSet([cpu])).min()
        core_type = CoreType.STANDARD
        if hybrid:
            core_type = CoreType.E_CORE if cpu in (e_cores or CPUSet()) else CoreType.P_CORE
        cpus[cpu] = CPUInfo(
            cpu=cpu,
            socket=socket,
            core=core,
            numa=numa,
            numa_cpus=numa_cpus[numa],
            l3=numa if l3 else NO_ID,
            core_type=core_type,
            sibling=sibling,
            thread_siblings=siblings,
        )
    return Topology(
        cpus=cpus,
        online=CPUSet(cpus) if online is None else online,
        smt_enabled=threads > 1,
        pcie_roots=dict(pcie_roots or {}),
    )
