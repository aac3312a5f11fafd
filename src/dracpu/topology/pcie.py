"""PCIe root complexes and the CPUs local to each (behavior.md §5).

A root is a ``devices/pciDDDD:BB`` entry (lowercase hex only); its local CPUs come from
``devices/pciDDDD:BB/pci_bus/DDDD:BB/cpulistaffinity``. Any failure to list or read them is
fatal, as upstream's start-up is. Upstream scans only on amd64 builds; ``pcie_supported``
reproduces that, and tests pass ``supported=True`` to scan fixtures anywhere.
"""

from __future__ import annotations

import logging
import platform
import re

from dracpu.cpuset import CPUSet, CPUSetParseError
from dracpu.topology.sysfs import SysfsError, SysfsReader, TopologyError

__all__ = ["PCIeError", "cpus_not_local", "discover_pcie_roots", "pcie_supported"]

log = logging.getLogger(__name__)

_ROOT_NAME = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")
# Upstream wraps the scan error twice; the driver adds "driver failed to initialize: ".
_PREFIX = "failed to list PCIe domains: failed to list PCIe domains: "


class PCIeError(TopologyError):
    """The PCIe root scan failed; discovery cannot go on."""


def pcie_supported(machine: str | None = None) -> bool:
    """True on amd64 (``x86_64``/``AMD64``), where upstream implements the scan."""
    return (platform.machine() if machine is None else machine) in ("x86_64", "AMD64")


def discover_pcie_roots(reader: SysfsReader) -> dict[str, CPUSet]:
    """Root name -> local CPUs, in name order."""
    try:
        names = [name for name in reader.listdir("devices") if _ROOT_NAME.fullmatch(name)]
    except SysfsError as err:
        raise PCIeError(_PREFIX + str(err)) from err
    roots: dict[str, CPUSet] = {}
    for name in names:
        bus = name[len("pci") :]
        rel = f"devices/{name}/pci_bus/{bus}/cpulistaffinity"
        try:
            text = reader.read_text(rel).strip()
        except SysfsError as err:
            raise PCIeError(_PREFIX + str(err)) from err
        try:
            roots[name] = CPUSet.parse(text)
        except CPUSetParseError as err:
            raise PCIeError(f"{_PREFIX}parse {reader.full_path(rel)}: {err}") from err
    return roots


def cpus_not_local(roots: dict[str, CPUSet], online: CPUSet) -> CPUSet:
    """Online CPUs that no root lists; upstream only logs them."""
    local = CPUSet()
    for cpus in roots.values():
        local |= cpus
    return online - local
