"""The shared pool's floor: CPUs no claim can take, so containers without one always run.

A claim that took the last shared CPUs would leave every container without a claim (and
every pod sandbox) either on the claimed CPUs or unable to start. The kubelet's CPU
Manager avoids that by refusing a zero CPU reservation (its static policy fails to start
with "the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than
zero", pkg/kubelet/cm/cpumanager/cpu_manager.go) and keeping the reserved CPUs in its
shared pool. dracpu does the same with ``reservedCPUs``, and when that holds no usable CPU
of this node (the default is empty) it keeps one whole physical core itself: the core of
the lowest-numbered online CPU that is not isolated. Either way the floor is never
published as devices, never allocated, and always in the shared pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from dracpu.cpuset import CPUSet
from dracpu.topology.model import Topology

__all__ = ["SharedFloor", "shared_floor", "unpublished_cpus"]


@dataclass(frozen=True, slots=True)
class SharedFloor:
    """``cpus`` always stay shared; ``kept`` says dracpu chose them (no usable
    ``reservedCPUs``)."""

    cpus: CPUSet
    kept: bool

    def describe(self) -> str:
        """One line for the start-up log."""
        if not self.kept:
            return f"reservedCPUs {self.cpus.format()} stay in the shared pool"
        if not self.cpus:
            return (
                "reservedCPUs holds no usable CPU of this node and every core is isolated or "
                "held by a claim: nothing keeps the shared pool from emptying but the refusal "
                "of prepares that would empty it; set reservedCPUs"
            )
        return (
            f"reservedCPUs holds no usable CPU of this node: CPUs {self.cpus.format()} (one "
            "core) stay in the shared pool and are not published, so containers without a "
            "claim always have a CPU; set reservedCPUs to choose others"
        )


def shared_floor(topo: Topology, reserved: CPUSet, held: CPUSet | None = None) -> SharedFloor:
    """Pure: the reserved CPUs this node has, online or not (isolated ones cannot be
    shared), else the core of the lowest usable online CPU that no claim in ``held`` uses
    (claims an earlier dracpu prepared keep their CPUs). Empty when no such core exists."""
    isolated = topo.isolated
    mine = reserved & ((topo.all_cpus | topo.present) - isolated)
    if mine:
        return SharedFloor(cpus=mine, kept=False)
    usable = topo.all_cpus - isolated
    taken = held or CPUSet()
    for cpu in usable:
        core = (topo.cpus[cpu].thread_siblings | CPUSet([cpu])) & usable
        if not core & taken:
            return SharedFloor(cpus=core, kept=True)
    return SharedFloor(cpus=CPUSet(), kept=True)


def unpublished_cpus(
    topo: Topology,
    reserved: CPUSet,
    floor: SharedFloor | None = None,
    *,
    publish_isolated: bool,
) -> CPUSet:
    """Pure: CPUs of this node that are neither devices nor allocatable: the reserved
    ones, the floor (``shared_floor`` of these when not given), and the isolated ones
    unless ``publishIsolatedCPUs`` is on."""
    if floor is None:
        floor = shared_floor(topo, reserved)
    kept = (reserved & (topo.all_cpus | topo.present)) | floor.cpus
    return kept if publish_isolated else kept | topo.isolated
