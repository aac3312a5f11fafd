"""Topology + settings → the devices this node publishes (behavior.md §6.2, §6.3).

Devices are computed once; they never change while the process runs (§19.3).

Attribute order inside a device follows the examples of §6.4 and §20: the standard
``resource.kubernetes.io/*`` attributes first (numaNode, then pcieRoot), then the
``dra.cpu/*`` ones, then the two legacy NUMA duplicates. The API treats the map as
unordered; the fixed order only keeps output stable and diffable.
"""

from __future__ import annotations

from types import MappingProxyType

from dracpu.cpuset import CPUSet
from dracpu.devices.model import (
    ATTR_CORE,
    ATTR_CORE_TYPE,
    ATTR_CPU,
    ATTR_ISOLATED,
    ATTR_ISOLATED_CPUS,
    ATTR_L3,
    ATTR_NOHZ_FULL,
    ATTR_NOHZ_FULL_CPUS,
    ATTR_NUM_CPUS,
    ATTR_NUMA,
    ATTR_NUMA_LEGACY,
    ATTR_NUMA_NET,
    ATTR_PCIE,
    ATTR_SMT,
    ATTR_SOCKET,
    CAPACITY_CPU,
    MACHINE_DEVICE,
    PER_CAPACITY_ALLOCATABLE,
    PER_DEVICE_ALLOCATABLE,
    Attribute,
    Device,
    DeviceCapacity,
    DeviceInventory,
    DeviceSettings,
)
from dracpu.topology.model import Topology

__all__ = ["build_inventory", "individual_order"]


def _int(value: int) -> Attribute:
    return {"int": value}


def _pcie(topo: Topology, settings: DeviceSettings, cpus: CPUSet) -> dict[str, Attribute]:
    """The pcieRoot attribute: sorted union of the roots local to ``cpus``, or nothing (§5)."""
    if not settings.expose_pcie_roots or not topo.pcie_roots:
        return {}
    roots = topo.pcie_roots_of(cpus)
    return {ATTR_PCIE: {"strings": roots}} if roots else {}


def individual_order(topo: Topology, reserved: CPUSet) -> list[int]:
    """CPUs in device order: SMT siblings get consecutive names (behavior.md §6.2)."""
    placed: set[int] = set()
    groups: list[list[int]] = []
    for cpu in sorted(topo.cpus):
        if cpu in reserved or cpu in placed:
            continue
        sibling = topo.cpus[cpu].sibling
        if sibling < 0 or sibling in reserved or sibling not in topo.cpus:
            groups.append([cpu])
            placed.add(cpu)
        else:
            groups.append([cpu, sibling])
            placed.update((cpu, sibling))
    # Already ordered by first CPU; the sort states the rule rather than relying on the walk.
    groups.sort(key=lambda group: group[0])
    return [cpu for group in groups for cpu in group]


def _individual(topo: Topology, settings: DeviceSettings) -> DeviceInventory:
    devices: list[Device] = []
    cpu_of: dict[str, int] = {}
    cpus_of: dict[str, CPUSet] = {}
    allocatable_resources = PER_DEVICE_ALLOCATABLE if settings.publish_node_allocatable else {}
    smt = {"bool": topo.smt_enabled}
    for index, cpu in enumerate(individual_order(topo, settings.reserved)):
        info = topo.cpus[cpu]
        name = f"cpudev{index:03d}"
        attributes: dict[str, Attribute] = {
            ATTR_NUMA: _int(info.numa),
            **_pcie(topo, settings, CPUSet.from_mask(1 << cpu)),
            ATTR_SOCKET: _int(info.socket),
            ATTR_SMT: dict(smt),
            ATTR_L3: _int(info.l3),
            ATTR_CORE_TYPE: {"string": str(info.core_type)},
            ATTR_CORE: _int(info.core),
            ATTR_CPU: _int(cpu),
            ATTR_NUMA_LEGACY: _int(info.numa),
            ATTR_NUMA_NET: _int(info.numa),
        }
        if topo.isolated or topo.nohz_full:
            attributes[ATTR_ISOLATED] = {"bool": cpu in topo.isolated}
            attributes[ATTR_NOHZ_FULL] = {"bool": cpu in topo.nohz_full}
        devices.append(
            Device(
                name=name,
                attributes=attributes,
                node_allocatable_resources=dict(allocatable_resources),
            )
        )
        cpu_of[name] = cpu
        cpus_of[name] = CPUSet.from_mask(1 << cpu)
    return DeviceInventory(
        mode="individual",
        group_by=settings.group_by,
        devices=tuple(devices),
        allocatable=topo.all_cpus - settings.reserved,
        machine_cpus=topo.online - settings.reserved,
        cpu_of_device=MappingProxyType(cpu_of),
        cpus_of_device=MappingProxyType(cpus_of),
    )


def _grouped_device(
    topo: Topology,
    settings: DeviceSettings,
    name: str,
    cpus: CPUSet,
    *,
    numa: int | None = None,
    socket: int | None = None,
) -> Device:
    attributes: dict[str, Attribute] = {}
    if numa is not None:
        attributes[ATTR_NUMA] = _int(numa)
    attributes.update(_pcie(topo, settings, cpus))
    if socket is not None:
        attributes[ATTR_SOCKET] = _int(socket)
    attributes[ATTR_NUM_CPUS] = _int(len(cpus))
    attributes[ATTR_SMT] = {"bool": topo.smt_enabled}
    if numa is not None:
        attributes[ATTR_NUMA_LEGACY] = _int(numa)
        attributes[ATTR_NUMA_NET] = _int(numa)
    if topo.isolated or topo.nohz_full:
        attributes[ATTR_ISOLATED_CPUS] = _int(len(cpus & topo.isolated))
        attributes[ATTR_NOHZ_FULL_CPUS] = _int(len(cpus & topo.nohz_full))
    allocatable = PER_CAPACITY_ALLOCATABLE if settings.publish_node_allocatable else {}
    return Device(
        name=name,
        allow_multiple_allocations=True,
        capacity={CAPACITY_CPU: DeviceCapacity(value=str(len(cpus)))},
        attributes=attributes,
        node_allocatable_resources=dict(allocatable),
    )


def _grouped(topo: Topology, settings: DeviceSettings) -> DeviceInventory:
    reserved = settings.reserved
    machine_cpus = topo.online - reserved
    devices: list[Device] = []
    group_of: dict[str, int] = {}
    cpus_of: dict[str, CPUSet] = {}
    if settings.group_by == "machine":
        # Published even when empty, with capacity 0 [quirk, §6.3].
        devices.append(_grouped_device(topo, settings, MACHINE_DEVICE, machine_cpus))
        cpus_of[MACHINE_DEVICE] = machine_cpus
    else:
        by_numa = settings.group_by == "numanode"
        groups = topo.by_numa if by_numa else topo.by_socket
        prefix = "cpudevnuma" if by_numa else "cpudevsocket"
        for ident, members in groups.items():
            cpus = members - reserved
            if not cpus:
                continue
            name = f"{prefix}{ident:03d}"  # the NUMA / socket id itself, not an index
            if by_numa:
                # "The socket of an arbitrary allocatable CPU": the lowest one, for stability.
                socket = topo.cpus[cpus.min()].socket
                device = _grouped_device(topo, settings, name, cpus, numa=ident, socket=socket)
            else:
                device = _grouped_device(topo, settings, name, cpus, socket=ident)
            devices.append(device)
            group_of[name] = ident
            cpus_of[name] = cpus
    return DeviceInventory(
        mode="grouped",
        group_by=settings.group_by,
        devices=tuple(devices),
        allocatable=topo.all_cpus - reserved,
        machine_cpus=machine_cpus,
        group_of_device=MappingProxyType(group_of),
        cpus_of_device=MappingProxyType(cpus_of),
    )


def build_inventory(topo: Topology, settings: DeviceSettings) -> DeviceInventory:
    """Every device this node publishes, in publication order (§6.2, §6.3)."""
    if settings.mode == "individual":
        return _individual(topo, settings)
    return _grouped(topo, settings)
