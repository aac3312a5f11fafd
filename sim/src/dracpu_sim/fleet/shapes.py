"""The machines of a simulated fleet: real topologies from ``tests/fake_sysfs``.

Each shape is discovered once through ``dracpu.topology`` and its device inventory built
once per (mode, reserved CPUs); a node's slices are then built from the cached inventory
with its own name and UID, exactly as the daemon builds them (``devices.build_slices``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dracpu.cpuset import CPUSet
from dracpu.devices import DeviceInventory, DeviceSettings, build_inventory, build_slices
from dracpu.topology import Topology, TopologyError, discover_from_root

__all__ = ["FIXTURES", "Shape", "SliceFactory", "load_shapes"]

FIXTURES = Path(__file__).parents[4] / "tests" / "fake_sysfs"


@dataclass(frozen=True)
class Shape:
    name: str
    topology: Topology

    @property
    def cpus(self) -> int:
        return self.topology.num_cpus


def load_shapes(root: Path, cpus_per_node: int | None) -> list[Shape]:
    """Every machine under ``root`` (one sysfs tree per directory) with ``cpus_per_node``
    CPUs, or all of them when None; sorted by name. An unusable tree is skipped; none
    left is an error naming the CPU counts there are."""
    found: list[Shape] = []
    for tree in sorted(p for p in root.iterdir() if (p / "devices").is_dir()):
        try:
            found.append(Shape(tree.name, discover_from_root(tree)))
        except (TopologyError, OSError):
            continue
    if not found:
        raise ValueError(f"no sysfs trees under {root}")
    chosen = [s for s in found if cpus_per_node is None or s.cpus == cpus_per_node]
    if not chosen:
        counts = ", ".join(f"{s.name}={s.cpus}" for s in found)
        raise ValueError(f"no machine under {root} has {cpus_per_node} CPUs (there are: {counts})")
    return chosen


class SliceFactory:
    """A node's desired slices for its shape, with the inventories cached."""

    def __init__(self, mode: str) -> None:
        self.settings = DeviceSettings(mode=mode)  # type: ignore[arg-type]
        self._inventories: dict[tuple[str, int], DeviceInventory] = {}

    def inventory(self, shape: Shape, reserved: CPUSet) -> DeviceInventory:
        key = (shape.name, reserved.mask)
        inv = self._inventories.get(key)
        if inv is None:
            settings = DeviceSettings(mode=self.settings.mode, reserved=reserved)
            inv = self._inventories[key] = build_inventory(shape.topology, settings)
        return inv

    def slices(
        self, shape: Shape, node_name: str, node_uid: str, reserved: CPUSet | None = None
    ) -> list[dict[str, Any]]:
        inv = self.inventory(shape, reserved or CPUSet())
        return build_slices(inv, node_name=node_name, node_uid=node_uid, expose_pcie_roots=False)
