"""Devices and ResourceSlice objects from the topology (behavior.md §6; protocols.md §4).

Pure: a Topology and settings in, an inventory of devices and JSON-ready ResourceSlice
objects out. The inventory also answers prepare's questions (device name → CPU or group).
Devices are computed once; they never change while the process runs (§19.3).

Attribute order inside a device follows the examples of §6.4 and §20: the standard
``resource.kubernetes.io/*`` attributes first (numaNode, then pcieRoot), then the
``dra.cpu/*`` ones, then the two legacy NUMA duplicates. The API treats the map as
unordered; the fixed order only keeps output stable and diffable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Literal, TypeGuard

import msgspec

from dracpu import DRIVER_NAME
from dracpu.cpuset import CPUSet
from dracpu.topology.model import Topology

__all__ = [
    "CAPACITY_CPU",
    "MACHINE_DEVICE",
    "MAX_DEVICES_PER_SLICE",
    "MAX_DEVICES_PER_SLICE_LIST_ATTRS",
    "Device",
    "DeviceCapacity",
    "DeviceInventory",
    "DeviceSettings",
    "NodeAllocatableMapping",
    "NodeAllocatableResource",
    "UnknownDeviceError",
    "build_inventory",
    "build_slices",
    "individual_order",
    "pool_device_names",
    "slice_index_prefix",
    "validate_slice",
]

CAPACITY_CPU = "dra.cpu/cpu"
MACHINE_DEVICE = "cpudevmachine"

ATTR_NUMA = "resource.kubernetes.io/numaNode"
ATTR_PCIE = "resource.kubernetes.io/pcieRoot"
ATTR_SOCKET = "dra.cpu/socketID"
ATTR_SMT = "dra.cpu/smtEnabled"
ATTR_NUM_CPUS = "dra.cpu/numCPUs"
ATTR_CPU = "dra.cpu/cpuID"
ATTR_CORE = "dra.cpu/coreID"
ATTR_CORE_TYPE = "dra.cpu/coreType"
ATTR_L3 = "dra.cpu/cacheL3ID"
ATTR_NUMA_LEGACY = "dra.cpu/numaNodeID"
ATTR_NUMA_NET = "dra.net/numaNode"

# protocols.md §4.4.
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_LIST_ATTRS = 64
MAX_ATTRS_AND_CAPACITIES = 32
MAX_LIST_ATTR_VALUES = 48
MAX_STRING_ATTR = 64
MAX_POOL_NAME = 253
MAX_DRIVER_NAME = 63
MAX_DNS_LABEL = 63

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
_PER_DEVICE = {
    "cpu": NodeAllocatableResource(mapping=NodeAllocatableMapping(device_multiplier="1"))
}
# One device = a pool of CPUs; the consumed dra.cpu/cpu capacity is the CPU count (§6.3).
_PER_CAPACITY = {
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
        return any(a.keys() & _LIST_KIND_SET for d in self.devices for a in d.attributes.values())


# -- building devices --------------------------------------------------------------------------


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
    allocatable_resources = _PER_DEVICE if settings.publish_node_allocatable else {}
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
    return Device(
        name=name,
        allow_multiple_allocations=True,
        capacity={CAPACITY_CPU: DeviceCapacity(value=str(len(cpus)))},
        attributes=attributes,
        node_allocatable_resources=dict(_PER_CAPACITY) if settings.publish_node_allocatable else {},
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


# -- slices ------------------------------------------------------------------------------------


def slice_index_prefix(index: int, count: int) -> str:
    """Lowercase hex, zero-padded to max(5, digits of count-1) (behavior.md §6.4)."""
    width = max(5, len(f"{max(count - 1, 0):x}"))
    return f"{index:0{width}x}"


def _slice(
    *,
    index: int,
    count: int,
    node_name: str,
    node_uid: str,
    generation: int,
    devices: list[Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "generateName": f"{slice_index_prefix(index, count)}-{DRIVER_NAME}-{node_name}-",
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node_name,
                    "uid": node_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "driver": DRIVER_NAME,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        },
    }


def build_slices(
    inv: DeviceInventory,
    *,
    node_name: str,
    node_uid: str,
    generation: int = 1,
    expose_pcie_roots: bool,
) -> list[dict[str, Any]]:
    """The node's pool as ResourceSlice objects; no devices → no slices (§6.4).

    The chunk size follows the flag, not whether a root was found: a slice that may carry
    list attributes is held to the smaller limit either way.
    """
    if not inv.devices:
        return []
    per_slice = MAX_DEVICES_PER_SLICE_LIST_ATTRS if expose_pcie_roots else MAX_DEVICES_PER_SLICE
    # One encode for all devices: fresh plain dicts the caller may keep or mutate.
    encoded: list[Any] = msgspec.to_builtins(list(inv.devices))
    count = -(-len(encoded) // per_slice)
    return [
        _slice(
            index=index,
            count=count,
            node_name=node_name,
            node_uid=node_uid,
            generation=generation,
            devices=encoded[index * per_slice : (index + 1) * per_slice],
        )
        for index in range(count)
    ]


# -- validation (what the API server would reject; protocols.md §4.1, §4.4) ---------------------

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?")
_SCALAR_KINDS = ("int", "bool", "string", "version")
_LIST_KINDS = ("ints", "bools", "strings", "versions")
_LIST_KIND_SET = frozenset(_LIST_KINDS)
_NODE_SELECTION = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _is_dns_subdomain(value: object, limit: int) -> bool:
    return isinstance(value, str) and len(value) <= limit and bool(_DNS_SUBDOMAIN.fullmatch(value))


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _qualified_name_problem(name: str) -> str | None:
    domain, slash, ident = name.rpartition("/")
    if slash and not _is_dns_subdomain(domain, 63):
        return f"domain {domain!r} must be a DNS subdomain of at most 63 characters"
    if len(ident) > 32 or not _C_IDENTIFIER.fullmatch(ident):
        return f"name {ident!r} must be a C identifier of at most 32 characters"
    return None


def _scalar_problem(kind: str, value: object) -> str | None:
    if kind in ("int", "ints"):
        if not _is_int(value) or not INT64_MIN <= value <= INT64_MAX:
            return f"{kind} value {value!r} must be a 64-bit integer"
    elif kind in ("bool", "bools"):
        if not isinstance(value, bool):
            return f"{kind} value {value!r} must be a boolean"
    elif not isinstance(value, str):
        return f"{kind} value {value!r} must be a string"
    elif len(value) > MAX_STRING_ATTR:
        return f"{kind} value longer than {MAX_STRING_ATTR} characters ({len(value)})"
    return None


def _attribute_problems(where: str, attr: object) -> tuple[list[str], int]:
    """Problems of one attribute value, and how many list values it holds."""
    if not isinstance(attr, Mapping) or len(attr) != 1:
        kinds = ", ".join(_SCALAR_KINDS + _LIST_KINDS)
        return [f"{where}: must have exactly one of {kinds}"], 0
    ((kind, value),) = attr.items()
    if kind in _SCALAR_KINDS:
        problem = _scalar_problem(kind, value)
        return ([f"{where}: {problem}"] if problem else []), 0
    if kind not in _LIST_KINDS:
        return [f"{where}: unknown value kind {kind!r}"], 0
    if not isinstance(value, list):
        return [f"{where}: {kind} must be a list"], 0
    problems = [f"{where}: {p}" for p in (_scalar_problem(kind, v) for v in value) if p]
    return problems, len(value)


def _device_problems(where: str, device: object) -> list[str]:
    if not isinstance(device, Mapping):
        return [f"{where}: must be an object"]
    problems: list[str] = []
    name = device.get("name")
    if not isinstance(name, str) or len(name) > MAX_DNS_LABEL or not _DNS_LABEL.fullmatch(name):
        problems.append(f"{where}.name: {name!r} must be a DNS label of at most 63 characters")
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if not isinstance(attributes, Mapping) or not isinstance(capacity, Mapping):
        return [*problems, f"{where}: attributes and capacity must be objects"]
    if len(attributes) + len(capacity) > MAX_ATTRS_AND_CAPACITIES:
        problems.append(
            f"{where}: at most {MAX_ATTRS_AND_CAPACITIES} attributes and capacities, "
            f"got {len(attributes) + len(capacity)}"
        )
    list_values = 0
    for key, attr in attributes.items():
        at = f"{where}.attributes[{key!r}]"
        problem = _qualified_name_problem(key)
        if problem:
            problems.append(f"{at}: {problem}")
        attr_problems, values = _attribute_problems(at, attr)
        problems.extend(attr_problems)
        list_values += values
    if list_values > MAX_LIST_ATTR_VALUES:
        problems.append(
            f"{where}.attributes: at most {MAX_LIST_ATTR_VALUES} list values, got {list_values}"
        )
    for key, cap in capacity.items():
        at = f"{where}.capacity[{key!r}]"
        problem = _qualified_name_problem(key)
        if problem:
            problems.append(f"{at}: {problem}")
        value = cap.get("value") if isinstance(cap, Mapping) else None
        if not isinstance(value, str) or not _QUANTITY.fullmatch(value):
            problems.append(f"{at}.value: {value!r} must be a quantity string")
    return problems


def _pool_problems(pool: object) -> list[str]:
    if not isinstance(pool, Mapping):
        return ["spec.pool: must be an object"]
    problems: list[str] = []
    name = pool.get("name")
    if (
        not isinstance(name, str)
        or not name
        or len(name) > MAX_POOL_NAME
        or not all(_is_dns_subdomain(part, MAX_POOL_NAME) for part in name.split("/"))
    ):
        problems.append(
            f"spec.pool.name: {name!r} must be DNS subdomains joined by '/', "
            f"at most {MAX_POOL_NAME} characters"
        )
    generation = pool.get("generation")
    if not _is_int(generation) or generation < 0:
        problems.append(f"spec.pool.generation: {generation!r} must be a non-negative integer")
    count = pool.get("resourceSliceCount")
    if not _is_int(count) or count <= 0:
        problems.append(f"spec.pool.resourceSliceCount: {count!r} must be a positive integer")
    return problems


def _devices_problems(devices: object) -> list[str]:
    if not isinstance(devices, list):
        return ["spec.devices: must be a list"]
    problems: list[str] = []
    has_list = any(
        isinstance(d, Mapping)
        and isinstance(d.get("attributes"), Mapping)
        and any(
            isinstance(a, Mapping) and a.keys() & _LIST_KIND_SET for a in d["attributes"].values()
        )
        for d in devices
    )
    limit = MAX_DEVICES_PER_SLICE_LIST_ATTRS if has_list else MAX_DEVICES_PER_SLICE
    if len(devices) > limit:
        why = " (list attributes present)" if has_list else ""
        problems.append(f"spec.devices: must have at most {limit} items{why}, got {len(devices)}")
    seen: set[str] = set()
    for i, device in enumerate(devices):
        where = f"spec.devices[{i}]"
        problems.extend(_device_problems(where, device))
        name = device.get("name") if isinstance(device, Mapping) else None
        if isinstance(name, str):
            if name in seen:
                problems.append(f"{where}.name: duplicate device name {name!r}")
            seen.add(name)
    return problems


def validate_slice(obj: Mapping[str, Any]) -> list[str]:
    """What the API server would reject in a ResourceSlice, one message per problem.

    Checks the limits of protocols.md §4.4 that a device-publishing driver can break; an
    empty list means the object passes. Uses only the stdlib so any server shell can reuse it.
    """
    problems: list[str] = []
    if obj.get("apiVersion") != "resource.k8s.io/v1":
        problems.append(f"apiVersion: must be 'resource.k8s.io/v1', got {obj.get('apiVersion')!r}")
    if obj.get("kind") != "ResourceSlice":
        problems.append(f"kind: must be 'ResourceSlice', got {obj.get('kind')!r}")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return [*problems, "spec: must be an object"]
    driver = spec.get("driver")
    if not _is_dns_subdomain(driver, MAX_DRIVER_NAME):
        problems.append(
            f"spec.driver: {driver!r} must be a DNS subdomain of at most {MAX_DRIVER_NAME} "
            "characters"
        )
    problems.extend(_pool_problems(spec.get("pool")))
    selected = [key for key in _NODE_SELECTION if spec.get(key) not in (None, "", False)]
    if len(selected) != 1:
        problems.append(
            f"spec: exactly one of {', '.join(_NODE_SELECTION)} must be set, got {selected}"
        )
    problems.extend(_devices_problems(spec.get("devices", [])))
    return problems


def pool_device_names(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every device name of a pool, in slice order (for tests and introspection)."""
    return [d["name"] for s in slices for d in s["spec"]["devices"]]
