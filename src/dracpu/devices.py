"""Devices and ResourceSlice objects from the topology (behavior.md §6; protocols.md §4).

Pure: a Topology and settings in, an inventory of devices and JSON-ready ResourceSlice
objects out. The inventory also answers prepare's questions (device name → CPU or group).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from dracpu import DRIVER_NAME
from dracpu.cpuset import CPUSet
from dracpu.topology.model import Topology

__all__ = [
    "CAPACITY_CPU",
    "Device",
    "DeviceInventory",
    "DeviceSettings",
    "build_inventory",
    "build_slices",
    "slice_index_prefix",
    "validate_slice",
]

CAPACITY_CPU = "dra.cpu/cpu"
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_LIST_ATTRS = 64
MAX_ATTRS_AND_CAPACITIES = 32
MAX_STRING_ATTR = 64

Attribute = dict[str, Any]  # exactly one of {"int"|"bool"|"string"|"strings": value}


class DeviceSettings(msgspec.Struct, frozen=True, kw_only=True):
    mode: Literal["grouped", "individual"] = "grouped"
    group_by: Literal["numanode", "socket", "machine"] = "numanode"
    reserved: CPUSet = msgspec.field(default_factory=CPUSet)
    expose_pcie_roots: bool = False
    publish_node_allocatable: bool = False


class Device(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """One resource.k8s.io/v1 Device, encoded exactly as the API expects."""

    name: str
    allow_multiple_allocations: bool = False
    capacity: dict[str, dict[str, str]] = msgspec.field(default_factory=dict)
    attributes: dict[str, Attribute] = msgspec.field(default_factory=dict)
    node_allocatable_resources: dict[str, Any] = msgspec.field(default_factory=dict)


@dataclass(frozen=True)
class DeviceInventory:
    """Published devices in order, plus the lookups prepare needs."""

    mode: str
    group_by: str
    devices: tuple[Device, ...]
    allocatable: CPUSet
    cpu_of_device: Mapping[str, int] = field(default_factory=dict)
    group_of_device: Mapping[str, int] = field(default_factory=dict)
    cpus_of_device: Mapping[str, CPUSet] = field(default_factory=dict)

    def cpus_of(self, name: str) -> CPUSet:
        return self.cpus_of_device.get(name, CPUSet())

    def attributes_of(self, name: str) -> dict[str, Attribute] | None:
        for device in self.devices:
            if device.name == name:
                return device.attributes
        return None

    @property
    def has_list_attributes(self) -> bool:
        return any("strings" in a for d in self.devices for a in d.attributes.values())


def _int(v: int) -> Attribute:
    return {"int": v}


def _pcie(topo: Topology, settings: DeviceSettings, cpus: CPUSet) -> dict[str, Attribute]:
    if not settings.expose_pcie_roots:
        return {}
    roots = topo.pcie_roots_of(cpus)
    return {"resource.kubernetes.io/pcieRoot": {"strings": roots}} if roots else {}


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
    groups.sort(key=lambda g: g[0])
    return [cpu for group in groups for cpu in group]


def _individual(topo: Topology, settings: DeviceSettings) -> DeviceInventory:
    devices: list[Device] = []
    cpu_of: dict[str, int] = {}
    cpus_of: dict[str, CPUSet] = {}
    mapping = {"cpu": {"mapping": {"deviceMultiplier": "1"}}}
    for index, cpu in enumerate(individual_order(topo, settings.reserved)):
        info = topo.cpus[cpu]
        name = f"cpudev{index:03d}"
        attributes: dict[str, Attribute] = {
            "resource.kubernetes.io/numaNode": _int(info.numa),
            "dra.cpu/socketID": _int(info.socket),
            "dra.cpu/smtEnabled": {"bool": topo.smt_enabled},
            "dra.cpu/cacheL3ID": _int(info.l3),
            "dra.cpu/coreType": {"string": str(info.core_type)},
            "dra.cpu/coreID": _int(info.core),
            "dra.cpu/cpuID": _int(cpu),
            "dra.cpu/numaNodeID": _int(info.numa),
            "dra.net/numaNode": _int(info.numa),
            **_pcie(topo, settings, CPUSet([cpu])),
        }
        devices.append(
            Device(
                name=name,
                attributes=attributes,
                node_allocatable_resources=mapping if settings.publish_node_allocatable else {},
            )
        )
        cpu_of[name] = cpu
        cpus_of[name] = CPUSet([cpu])
    return DeviceInventory(
        mode="individual",
        group_by=settings.group_by,
        devices=tuple(devices),
        allocatable=topo.all_cpus - settings.reserved,
        cpu_of_device=cpu_of,
        cpus_of_device=cpus_of,
    )


def _grouped_device(
    topo: Topology, settings: DeviceSettings, name: str, cpus: CPUSet, extra: dict[str, Attribute]
) -> Device:
    mapping = {"cpu": {"mapping": {"capacityKey": CAPACITY_CPU, "capacityMultiplier": "1"}}}
    attributes: dict[str, Attribute] = {
        **extra,
        "dra.cpu/numCPUs": _int(len(cpus)),
        "dra.cpu/smtEnabled": {"bool": topo.smt_enabled},
        **_pcie(topo, settings, cpus),
    }
    if "resource.kubernetes.io/numaNode" in extra:
        numa = extra["resource.kubernetes.io/numaNode"]
        attributes["dra.cpu/numaNodeID"] = dict(numa)
        attributes["dra.net/numaNode"] = dict(numa)
    return Device(
        name=name,
        allow_multiple_allocations=True,
        capacity={CAPACITY_CPU: {"value": str(len(cpus))}},
        attributes=attributes,
        node_allocatable_resources=mapping if settings.publish_node_allocatable else {},
    )


def _grouped(topo: Topology, settings: DeviceSettings) -> DeviceInventory:
    reserved = settings.reserved
    devices: list[Device] = []
    group_of: dict[str, int] = {}
    cpus_of: dict[str, CPUSet] = {}
    if settings.group_by == "machine":
        cpus = topo.online - reserved
        devices.append(_grouped_device(topo, settings, "cpudevmachine", cpus, {}))
        cpus_of["cpudevmachine"] = cpus
    else:
        by_numa = settings.group_by == "numanode"
        groups = topo.by_numa if by_numa else topo.by_socket
        prefix = "cpudevnuma" if by_numa else "cpudevsocket"
        for ident, members in groups.items():
            cpus = members - reserved
            if not cpus:
                continue
            name = f"{prefix}{ident:03d}"
            extra: dict[str, Attribute]
            if by_numa:
                extra = {
                    "resource.kubernetes.io/numaNode": _int(ident),
                    "dra.cpu/socketID": _int(topo.cpus[cpus.min()].socket),
                }
            else:
                extra = {"dra.cpu/socketID": _int(ident)}
            devices.append(_grouped_device(topo, settings, name, cpus, extra))
            group_of[name] = ident
            cpus_of[name] = cpus
    return DeviceInventory(
        mode="grouped",
        group_by=settings.group_by,
        devices=tuple(devices),
        allocatable=topo.all_cpus - reserved,
        group_of_device=group_of,
        cpus_of_device=cpus_of,
    )


def build_inventory(topo: Topology, settings: DeviceSettings) -> DeviceInventory:
    if settings.mode == "individual":
        return _individual(topo, settings)
    return _grouped(topo, settings)


def slice_index_prefix(index: int, count: int) -> str:
    """Lowercase hex, zero-padded to max(5, digits of count-1) (behavior.md §6.4)."""
    width = max(5, len(f"{max(count - 1, 0):x}"))
    return f"{index:0{width}x}"


def build_slices(
    inv: DeviceInventory,
    *,
    node_name: str,
    node_uid: str,
    generation: int = 1,
    expose_pcie_roots: bool = False,
) -> list[dict[str, Any]]:
    """ResourceSlice objects for the node's pool; no devices → no slices."""
    if not inv.devices:
        return []
    per_slice = MAX_DEVICES_PER_SLICE_LIST_ATTRS if expose_pcie_roots else MAX_DEVICES_PER_SLICE
    chunks = [inv.devices[i : i + per_slice] for i in range(0, len(inv.devices), per_slice)]
    encoded = msgspec.to_builtins(list(inv.devices))
    slices = []
    offset = 0
    for index, chunk in enumerate(chunks):
        slices.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {
                    "generateName": (
                        f"{slice_index_prefix(index, len(chunks))}-{DRIVER_NAME}-{node_name}-"
                    ),
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
                    "pool": {
                        "name": node_name,
                        "generation": generation,
                        "resourceSliceCount": len(chunks),
                    },
                    "devices": encoded[offset : offset + len(chunk)],
                },
            }
        )
        offset += len(chunk)
    return slices


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _qualified_name_problem(name: str) -> str | None:
    domain, slash, ident = name.rpartition("/")
    if slash and (len(domain) > 63 or not _DNS_SUBDOMAIN.fullmatch(domain)):
        return f"domain {domain!r} must be a DNS subdomain of at most 63 characters"
    if len(ident) > 32 or not _C_IDENTIFIER.fullmatch(ident):
        return f"name {ident!r} must be a C identifier of at most 32 characters"
    return None


def validate_slice(obj: Mapping[str, Any]) -> list[str]:
    """What the API server would reject in a ResourceSlice (protocols.md §4.4)."""
    problems: list[str] = []
    spec = obj.get("spec") or {}
    devices = spec.get("devices") or []
    pool = (spec.get("pool") or {}).get("name", "")
    if not pool or len(pool) > 253:
        problems.append(f"spec.pool.name: must be 1-253 characters, got {len(pool)}")
    has_list = any(
        any(k in attr for k in ("ints", "bools", "strings", "versions"))
        for d in devices
        for attr in (d.get("attributes") or {}).values()
    )
    limit = MAX_DEVICES_PER_SLICE_LIST_ATTRS if has_list else MAX_DEVICES_PER_SLICE
    if len(devices) > limit:
        problems.append(f"spec.devices: must have at most {limit} items, got {len(devices)}")
    for i, device in enumerate(devices):
        where = f"spec.devices[{i}]"
        name = device.get("name", "")
        if len(name) > 63 or not _DNS_LABEL.fullmatch(name):
            problems.append(f"{where}.name: {name!r} must be a DNS label of at most 63 characters")
        attributes = device.get("attributes") or {}
        capacity = device.get("capacity") or {}
        if len(attributes) + len(capacity) > MAX_ATTRS_AND_CAPACITIES:
            problems.append(
                f"{where}: at most {MAX_ATTRS_AND_CAPACITIES} attributes and capacities, "
                f"got {len(attributes) + len(capacity)}"
            )
        for key in (*attributes, *capacity):
            problem = _qualified_name_problem(key)
            if problem:
                problems.append(f"{where}.attributes[{key!r}]: {problem}")
        for key, attr in attributes.items():
            if len(attr) != 1:
                problems.append(f"{where}.attributes[{key!r}]: must have exactly one value")
            value = attr.get("string")
            if isinstance(value, str) and len(value) > MAX_STRING_ATTR:
                problems.append(
                    f"{where}.attributes[{key!r}]: string longer than {MAX_STRING_ATTR} characters"
                )
    return problems
