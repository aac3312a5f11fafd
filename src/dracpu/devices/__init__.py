"""Devices and ResourceSlice objects from the topology (behavior.md §6; protocols.md §4).

Pure: a Topology and settings in, an inventory of devices (``inventory``, with the types
of ``model``) and JSON-ready ResourceSlice objects (``slices``) out. What the API server
would reject in a slice is checked by the simulated API server
(``dracpu_sim.apiserver.validation``), which the tests run every built slice through.
"""

from __future__ import annotations

from dracpu.devices.inventory import build_inventory, individual_order
from dracpu.devices.model import (
    CAPACITY_CPU,
    MACHINE_DEVICE,
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_LIST_ATTRS,
    Device,
    DeviceCapacity,
    DeviceInventory,
    DeviceSettings,
    NodeAllocatableMapping,
    NodeAllocatableResource,
    UnknownDeviceError,
)
from dracpu.devices.slices import build_slices, pool_device_names, slice_index_prefix

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
]
