"""Build the devices and ResourceSlices of a 768-CPU node in individual mode.

Prints `build_slices_768cpu_ms` (median of repeated runs; target < 50 ms) and the slice
count, plus the grouped-mode figure for comparison.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.topology import discover_from_root

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fake_sysfs" / "epyc-2s-768"


def measure(settings: DeviceSettings, runs: int = 15) -> tuple[float, int]:
    topo = discover_from_root(FIXTURE)
    samples = []
    count = 0
    for _ in range(runs):
        start = time.perf_counter()
        slices = build_slices(build_inventory(topo, settings), node_name="node", node_uid="u")
        samples.append((time.perf_counter() - start) * 1000)
        count = len(slices)
    return statistics.median(samples), count


def main() -> None:
    individual_ms, individual_slices = measure(DeviceSettings(mode="individual"))
    grouped_ms, _ = measure(DeviceSettings(mode="grouped"))
    print(f"build_slices_768cpu_ms: {individual_ms:.2f}")
    print(f"build_slices_768cpu_count: {individual_slices}")
    print(f"build_slices_768cpu_grouped_ms: {grouped_ms:.3f}")


if __name__ == "__main__":
    main()
