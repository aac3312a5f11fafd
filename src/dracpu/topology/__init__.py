"""CPU topology: sysfs discovery (with the optional overlay), PCIe roots, and the model."""

from __future__ import annotations

from dracpu.topology.discover import discover_from_root, discover_topology
from dracpu.topology.model import NO_ID, CoreType, CPUInfo, Topology
from dracpu.topology.pcie import PCIeError, discover_pcie_roots, pcie_supported
from dracpu.topology.sysfs import (
    SysfsError,
    SysfsOverlayError,
    SysfsReader,
    TopologyError,
    load_overlay,
)

__all__ = [
    "NO_ID",
    "CPUInfo",
    "CoreType",
    "PCIeError",
    "SysfsError",
    "SysfsOverlayError",
    "SysfsReader",
    "Topology",
    "TopologyError",
    "discover_from_root",
    "discover_pcie_roots",
    "discover_topology",
    "load_overlay",
    "pcie_supported",
]
