"""What this node publishes: device settings, the Device object, the inventory.

Attribute names and the Device encoding follow protocols.md §4; the inventory answers
prepare's questions (device name → CPU or group). Pure data, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import msgspec

from dracpu import DRIVER_NAME
from dracpu.cpuset import CPUSet

__all__ = [
    "CAPACITY_CPU",
    "MACHINE_DEVICE",
    "MAX_DEVICES_PER_SLICE",
    "MAX_DEVICES_PER_SLICE_LIST_ATTRS",
    "Attribute",
    "Device",
    "DeviceCapacity",
    "DeviceInventory",
    "DeviceSettings",
    "GroupBy",
    "Mode",
    "NodeAllocatableMapping",
    "NodeAllocatableResource",
    "UnknownDeviceError",
]

# Capacity and attribute names are resource.k8s.io QualifiedNames, "<domain>/<C identifier>";
# the driver's own have its name as their domain (a name without one is taken as the driver's).
CAPACITY_CPU = f"{DRIVER_NAME}/cpu"
MACHINE_DEVICE = "cpudevmachine"

ATTR_NUMA = "resource.kubernetes.io/numaNode"
ATTR_PCIE = "resource.kubernetes.io/pcieRoot"
ATTR_SOCKET = f"{DRIVER_NAME}/socketID"
ATTR_SMT = f"{DRIVER_NAME}/smtEnabled"
ATTR_NUM_CPUS = f"{DRIVER_NAME}/numCPUs"
ATTR_CPU = f"{DRIVER_NAME}/cpuID"
ATTR_CORE = f"{DRIVER_NAME}/coreID"
ATTR_CORE_TYPE = f"{DRIVER_NAME}/coreType"
ATTR_L3 = f"{DRIVER_NAME}/cacheL3ID"
ATTR_NUMA_LEGACY = f"{DRIVER_NAME}/numaNodeID"
ATTR_NUMA_NET = "dra.net/numaNode"
# dracpu's own, published only on nodes that isolate CPUs (isolcpus=, nohz_full=), so the
# devices of every other node stay exactly upstream's.
ATTR_ISOLATED = f"{DRIVER_NAME}/isolated"
ATTR_NOHZ_FULL = f"{DRIVER_NAME}/nohzFull"
ATTR_ISOLATED_CPUS = f"{DRIVER_NAME}/isolatedCPUs"
ATTR_NOHZ_FULL_CPUS = f"{DRIVER_NAME}/nohzFullCPUs"
# What the device metadata adds to a device's attributes: its consumed capacity (§10.3).
ATTR_ALLOCATED_NUM_CPUS = f"{DRIVER_NAME}/allocatedNumCPUs"

# protocols.md §4.4: a slice holds at most 128 devices, 64 when one has a list attribute.
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_LIST_ATTRS = 64
LIST_KINDS = frozenset(("ints", "bools", "strings", "versions"))

Attribute = dict[str, Any]  # exactly one of {"int"|"bool"|"string"|"strings": value}

Mode = Literal["grouped", "individual"]
GroupBy = Literal["numanode", "socket", "machine"]
_MODES = ("grouped", "individual")
_GROUP_BYS = ("numanode", "socket", "machine")


class UnknownDeviceError(LookupError):
    """A device name this node never published (e.g. from a stale or foreign claim)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"device {name!r} is not published by this node")


class DeviceSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The part of the driver config that shapes the published devices (§3, §6)."""

    mode: Mode = "grouped"
    group_by: GroupBy = "numanode"
    reserved: CPUSet = msgspec.field(default_factory=CPUSet)
    expose_pcie_roots: bool = False
    publish_node_allocatable: bool = False

    def __post_init__(self) -> None:
        # The constructor does not type-check Literals; a typo must not silently pick a mode.
        if self.mode not in _MODES:
            raise ValueError(f"cpuDeviceMode must be one of {list(_MODES)}, got {self.mode!r}")
        if self.group_by not in _GROUP_BYS:
            raise ValueError(f"groupBy must be one of {list(_GROUP_BYS)}, got {self.group_by!r}")


class DeviceCapacity(msgspec.Struct, frozen=True, kw_only=True):
    value: str  # a Kubernetes quantity


class NodeAllocatableMapping(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"
):
    """Either ``deviceMultiplier`` or ``capacityKey`` + ``capacityMultiplier``."""

    capacity_key: str | None = None
    capacity_multiplier: str | None = None
    device_multiplier: str | None = None


class NodeAllocatableResource(msgspec.Struct, frozen=True, kw_only=True):
    mapping: NodeAllocatableMapping


class Device(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """One resource.k8s.io/v1 Device, encoded exactly as the API expects."""

    name: str
    allow_multiple_allocations: bool = False
    capacity: dict[str, DeviceCapacity] = msgspec.field(default_factory=dict)
    attributes: dict[str, Attribute] = msgspec.field(default_factory=dict)
    node_allocatable_resources: dict[str, NodeAllocatableResource] = msgspec.field(
        default_factory=dict
    )


# One device = one CPU; the scheduler's device count is the CPU count (§6.2).
PER_DEVICE_ALLOCATABLE = {
    "cpu": NodeAllocatableResource(mapping=NodeAllocatableMapping(device_multiplier="1"))
}
# One device = a pool of CPUs; the consumed dra.cpu/cpu capacity is the CPU count (§6.3).
PER_CAPACITY_ALLOCATABLE = {
    "cpu": NodeAllocatableResource(
        mapping=NodeAllocatableMapping(capacity_key=CAPACITY_CPU, capacity_multiplier="1")
    )
}


@dataclass(frozen=True)
class DeviceInventory:
    """Published devices in publication order, plus the lookups prepare needs.

    ``cpu_of_device`` is filled in individual mode, ``group_of_device`` (NUMA or socket id)
    in grouped numanode/socket mode; both are empty otherwise. ``allocatable`` is the
    topology CPUs minus reserved; ``machine_cpus`` is online minus reserved, what the
    machine device counts (it may include CPUs discovery skipped, §4.5 quirk).
    """

    mode: Mode
    group_by: GroupBy
    devices: tuple[Device, ...]
    allocatable: CPUSet
    machine_cpus: CPUSet
    cpu_of_device: Mapping[str, int] = field(default_factory=dict)
    group_of_device: Mapping[str, int] = field(default_factory=dict)
    cpus_of_device: Mapping[str, CPUSet] = field(default_factory=dict)

    @cached_property
    def _by_name(self) -> Mapping[str, Device]:
        return {device.name: device for device in self.devices}

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def device(self, name: str) -> Device:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownDeviceError(name) from None

    def cpus_of(self, name: str) -> CPUSet:
        """The CPUs behind a device: its one CPU, or the group's allocatable CPUs."""
        try:
            return self.cpus_of_device[name]
        except KeyError:
            raise UnknownDeviceError(name) from None

    def attributes_of(self, name: str) -> dict[str, Attribute]:
        """A fresh copy of the device's attributes (callers add e.g. allocatedNumCPUs)."""
        attributes: dict[str, Attribute] = msgspec.to_builtins(self.device(name).attributes)
        return attributes

    @property
    def has_list_attributes(self) -> bool:
        """True when some device holds a list attribute (the 64-device slice limit applies)."""
        return any(a.keys() & LIST_KINDS for d in self.devices for a in d.attributes.values())
