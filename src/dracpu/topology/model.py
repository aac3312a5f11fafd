"""The discovered CPU topology: plain immutable data plus the queries the allocator needs.

Ids are taken from sysfs verbatim. ``core`` is the raw ``core_id``, which a real kernel
repeats in every socket; ``core_key`` is the machine-unique identity of a physical core.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from dracpu.cpuset import CPUSet

__all__ = ["NO_ID", "CPUInfo", "CoreType", "Topology"]

NO_ID = -1


class CoreType(enum.StrEnum):
    STANDARD = "standard"
    P_CORE = "p-core"
    E_CORE = "e-core"


@dataclass(frozen=True, slots=True, kw_only=True)
class CPUInfo:
    """One online CPU that discovery kept."""

    cpu: int
    socket: int
    core: int
    numa: int
    die: int = 0
    cluster: int = NO_ID
    numa_cpus: CPUSet = field(default_factory=CPUSet)
    l3: int = NO_ID
    core_type: CoreType = CoreType.STANDARD
    # The other hardware thread of a 2-way SMT core, NO_ID otherwise (upstream semantics).
    sibling: int = NO_ID
    # Every kept CPU of the same physical core (socket, cluster, core), this one included.
    thread_siblings: CPUSet = field(default_factory=CPUSet)

    @property
    def core_key(self) -> tuple[int, int, int]:
        return (self.socket, self.cluster, self.core)


def _group(cpus: Iterable[CPUInfo], attr: str) -> dict[int, CPUSet]:
    masks: dict[int, int] = {}
    for info in cpus:
        key = getattr(info, attr)
        masks[key] = masks.get(key, 0) | 1 << info.cpu
    return {key: CPUSet.from_mask(m) for key, m in sorted(masks.items())}


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Kept CPUs by id (ascending), the online set, and the machine-wide SMT flag."""

    cpus: Mapping[int, CPUInfo]
    online: CPUSet
    smt_enabled: bool
    # PCIe root name -> local CPUs; empty unless PCIe discovery ran and found roots.
    pcie_roots: Mapping[str, CPUSet] = field(default_factory=dict)
    # Kept CPUs the kernel isolates from load balancing (isolcpus=) and from its tick
    # (nohz_full=); never in the shared pool.
    isolated: CPUSet = field(default_factory=CPUSet)
    nohz_full: CPUSet = field(default_factory=CPUSet)
    # CPUs that exist, online or not (``present``); a hotplugged-off CPU is here but not
    # in ``online``.
    present: CPUSet = field(default_factory=CPUSet)

    # -- sets ---------------------------------------------------------------------------
    @cached_property
    def all_cpus(self) -> CPUSet:
        return CPUSet(self.cpus)

    @cached_property
    def by_socket(self) -> dict[int, CPUSet]:
        return _group(self.cpus.values(), "socket")

    @cached_property
    def by_numa(self) -> dict[int, CPUSet]:
        return _group(self.cpus.values(), "numa")

    @cached_property
    def by_l3(self) -> dict[int, CPUSet]:
        """L3 id -> CPUs; CPUs without an L3 (id NO_ID) are left out."""
        groups = _group(self.cpus.values(), "l3")
        groups.pop(NO_ID, None)
        return groups

    @cached_property
    def by_core_id(self) -> dict[int, CPUSet]:
        """Raw core_id -> CPUs (spans sockets, as upstream's allocator sees cores)."""
        return _group(self.cpus.values(), "core")

    @cached_property
    def by_core_key(self) -> dict[tuple[int, int, int], CPUSet]:
        masks: dict[tuple[int, int, int], int] = {}
        for info in self.cpus.values():
            masks[info.core_key] = masks.get(info.core_key, 0) | 1 << info.cpu
        return {key: CPUSet.from_mask(m) for key, m in sorted(masks.items())}

    # -- counters (behavior.md §4.4) -----------------------------------------------------
    @property
    def num_cpus(self) -> int:
        return len(self.cpus)

    @property
    def num_cores(self) -> int:
        return len(self.by_core_key)

    @property
    def num_sockets(self) -> int:
        return len(self.by_socket)

    @property
    def num_numa_nodes(self) -> int:
        return len(self.by_numa)

    @property
    def num_uncore_caches(self) -> int:
        return len(self.by_l3)

    @property
    def cpus_per_core(self) -> int:
        return self.num_cpus // self.num_cores if self.num_cores else 0

    @property
    def cpus_per_socket(self) -> int:
        return self.num_cpus // self.num_sockets if self.num_sockets else 0

    @property
    def cpus_per_uncore(self) -> int:
        return self.num_cpus // self.num_uncore_caches if self.num_uncore_caches else 0

    def pcie_roots_of(self, cpus: CPUSet) -> list[str]:
        """Sorted names of the PCIe roots local to any of ``cpus`` (behavior.md §5)."""
        return sorted(name for name, local in self.pcie_roots.items() if not local.isdisjoint(cpus))
