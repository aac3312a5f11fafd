"""What the allocator sees of the published ResourceSlices on one node, and what other
claims already hold (pure).

Pools are gathered the way kube-scheduler does: only the newest generation of a pool
counts, and a pool whose slices at that generation are not all there yet (fewer than
``resourceSliceCount``) is incomplete and its devices are not handed out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any

from celpy import celtypes

from dracpu.allocation.quantity import QuantityError, parse_quantity
from dracpu_sim.scheduler.cel import device_value, qualify

__all__ = [
    "AllocatedDevices",
    "AttributeElement",
    "DeviceKey",
    "NodeDevices",
    "PublishedDevice",
    "attribute_key",
    "attribute_values",
    "gather_devices",
]

DeviceKey = tuple[str, str, str]  # (driver, pool, device)


def attribute_key(name: str, driver: str) -> str:
    """The fully qualified ``domain/name`` spelling of an attribute or capacity name."""
    domain, ident = qualify(name, driver)
    return f"{domain}/{ident}"


# One element of an attribute's value: (type, value). Typed, so that an int 1 and a bool
# true (equal in Python) or an int 1 and a string "1" never match.
AttributeElement = tuple[str, object]
_SCALAR_KINDS = ("int", "bool", "string", "version")
_LIST_KINDS = {"ints": "int", "bools": "bool", "strings": "string", "versions": "version"}


def attribute_values(attr: Mapping[str, Any]) -> frozenset[AttributeElement]:
    """An attribute's value as the set constraints compare (KEP-5491, list-type attributes):
    a scalar is a one-element set, a list (``ints``, ``strings``, ...) the set of its
    entries, each tagged with its type. Versions compare as strings, as the structured
    allocator does: semver 2.0.0 values are in their minimal form. Empty for a value of
    no known type (which then matches nothing)."""
    for kind in _SCALAR_KINDS:
        if kind in attr:
            return frozenset({(kind, attr[kind])})
    for kind, element in _LIST_KINDS.items():
        if kind in attr and isinstance(attr[kind], list):
            return frozenset((element, value) for value in attr[kind])
    return frozenset()


@dataclass(eq=False)
class PublishedDevice:
    """One device of a complete pool, in allocation order (``order``)."""

    key: DeviceKey
    order: int
    spec: Mapping[str, Any]
    shareable: bool
    # Fully qualified capacity name -> total, and -> the name as published.
    capacity: dict[str, Fraction]
    capacity_names: dict[str, str]
    policies: dict[str, Mapping[str, Any]]
    # Fully qualified attribute name -> its value set (``attribute_values``).
    attributes: dict[str, frozenset[AttributeElement]]
    _cel: celtypes.MapType | None = field(default=None, repr=False)

    @property
    def driver(self) -> str:
        return self.key[0]

    @property
    def name(self) -> str:
        return self.key[2]

    @cached_property
    def fingerprint(self) -> str:
        """The device's identity and content, as a key for remembered selector results."""
        return json.dumps([self.key, self.spec], sort_keys=True, separators=(",", ":"))

    def cel(self) -> celtypes.MapType:
        """The CEL ``device`` variable, built on first use."""
        if self._cel is None:
            self._cel = device_value(self.driver, self.spec)
        return self._cel

    def describe(self) -> str:
        return "/".join(self.key)


@dataclass
class NodeDevices:
    """Devices usable on one node, plus the pools that could not be used and why."""

    devices: list[PublishedDevice]
    unusable_pools: dict[tuple[str, str], str]


def _device_on_node(entry: Mapping[str, Any], node_name: str) -> bool:
    return entry.get("nodeName") == node_name or entry.get("allNodes") is True


def _published(
    driver: str, pool: str, order: int, device: Mapping[str, Any]
) -> PublishedDevice | None:
    capacity: dict[str, Fraction] = {}
    names: dict[str, str] = {}
    policies: dict[str, Mapping[str, Any]] = {}
    try:
        for name, cap in (device.get("capacity") or {}).items():
            full = attribute_key(name, driver)
            capacity[full] = parse_quantity(str(cap["value"]))
            names[full] = name
            if cap.get("requestPolicy"):
                policies[full] = cap["requestPolicy"]
    except (QuantityError, KeyError, TypeError):
        return None  # the API server would not have accepted it; never allocate it
    return PublishedDevice(
        key=(driver, pool, str(device["name"])),
        order=order,
        spec=device,
        shareable=bool(device.get("allowMultipleAllocations", False)),
        capacity=capacity,
        capacity_names=names,
        policies=policies,
        attributes={
            attribute_key(name, driver): attribute_values(attr)
            for name, attr in (device.get("attributes") or {}).items()
        },
    )


def gather_devices(slices: Sequence[Mapping[str, Any]], node_name: str) -> NodeDevices:
    """The devices of complete pools reachable from ``node_name``, in allocation order:
    pools by (driver, name), slices by object name, devices as listed."""
    pools: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        if not (_device_on_node(spec, node_name) or spec.get("perDeviceNodeSelection")):
            continue
        pool = spec.get("pool") or {}
        pools.setdefault((str(spec.get("driver")), str(pool.get("name"))), []).append(obj)
    devices: list[PublishedDevice] = []
    unusable: dict[tuple[str, str], str] = {}
    for (driver, pool_name), members in sorted(pools.items()):
        generation = max(int(m["spec"]["pool"].get("generation", 0)) for m in members)
        current = [m for m in members if int(m["spec"]["pool"].get("generation", 0)) == generation]
        wanted = int(current[0]["spec"]["pool"].get("resourceSliceCount", 1))
        if len(current) < wanted:
            unusable[(driver, pool_name)] = (
                f"resource pool {driver}/{pool_name} is being updated "
                f"({len(current)} of {wanted} slices at generation {generation})"
            )
            continue
        current.sort(key=lambda m: str((m.get("metadata") or {}).get("name", "")))
        seen: set[str] = set()
        pool_devices: list[PublishedDevice] = []
        for member in current:
            per_device = bool(member["spec"].get("perDeviceNodeSelection"))
            for device in member["spec"].get("devices") or []:
                if per_device and not _device_on_node(device, node_name):
                    continue
                name = str(device.get("name"))
                if name in seen:
                    unusable[(driver, pool_name)] = (
                        f"resource pool {driver}/{pool_name} is invalid: "
                        f"device {name} is listed twice"
                    )
                    break
                seen.add(name)
                published = _published(driver, pool_name, len(devices) + len(pool_devices), device)
                if published is not None:
                    pool_devices.append(published)
        if (driver, pool_name) not in unusable:
            devices.extend(pool_devices)
    return NodeDevices(devices=devices, unusable_pools=unusable)


@dataclass
class AllocatedDevices:
    """What existing allocations hold: whole devices, and consumed capacity of shared
    ones (by fully qualified capacity name)."""

    exclusive: set[DeviceKey] = field(default_factory=set)
    consumed: dict[DeviceKey, dict[str, Fraction]] = field(default_factory=dict)

    @classmethod
    def from_claims(cls, claims: Iterable[Mapping[str, Any]]) -> AllocatedDevices:
        state = cls()
        for claim in claims:
            allocation = (claim.get("status") or {}).get("allocation")
            if allocation:
                state.add(allocation)
        return state

    def add(self, allocation: Mapping[str, Any]) -> None:
        """Count one ``status.allocation`` as held."""
        for result in (allocation.get("devices") or {}).get("results") or []:
            key = (str(result["driver"]), str(result["pool"]), str(result["device"]))
            if result.get("adminAccess"):
                continue  # admin access never takes a device away from others
            if result.get("shareID") is None:
                self.exclusive.add(key)
                continue
            used = self.consumed.setdefault(key, {})
            for name, quantity in (result.get("consumedCapacity") or {}).items():
                full = attribute_key(name, key[0])
                used[full] = used.get(full, Fraction(0)) + parse_quantity(str(quantity))

    def copy(self) -> AllocatedDevices:
        return AllocatedDevices(
            exclusive=set(self.exclusive),
            consumed={k: dict(v) for k, v in self.consumed.items()},
        )

    def remaining(self, device: PublishedDevice) -> dict[str, Fraction]:
        used = self.consumed.get(device.key, {})
        return {
            name: total - used.get(name, Fraction(0)) for name, total in device.capacity.items()
        }
