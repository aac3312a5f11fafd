"""Time building devices and ResourceSlices for the 768-CPU node in individual mode.

Topology discovery (file reads) is done once, outside the timed region: this measures the
pure devices core only. Prints ``name: value unit`` lines; the target is < 50 ms.
Run from the repo root: ``.venv/bin/python bench/slices_build.py``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.topology import Topology, discover_from_root

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fake_sysfs" / "epyc-2s-768"
ROUNDS = 30


def best_and_median_ms(fn: Callable[[], Any], rounds: int = ROUNDS) -> tuple[float, float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return min(times), statistics.median(times)


def build(topo: Topology, settings: DeviceSettings) -> list[dict[str, Any]]:
    inv = build_inventory(topo, settings)
    return build_slices(
        inv, node_name="node-a", node_uid="u", expose_pcie_roots=settings.expose_pcie_roots
    )


def main() -> None:
    plain = discover_from_root(FIXTURE)
    with_roots = discover_from_root(FIXTURE, expose_pcie_roots=True, pcie_scan_supported=True)
    individual = DeviceSettings(mode="individual")
    individual_pcie = DeviceSettings(mode="individual", expose_pcie_roots=True)

    best, median = best_and_median_ms(lambda: build(plain, individual))
    print(f"build_slices_768cpu_ms: {median:.2f}")
    print(f"build_slices_768cpu_best_ms: {best:.2f}")
    _, inv_ms = best_and_median_ms(lambda: build_inventory(plain, individual))
    print(f"build_inventory_768cpu_ms: {inv_ms:.2f}")
    _, pcie_ms = best_and_median_ms(lambda: build(with_roots, individual_pcie))
    print(f"build_slices_768cpu_pcie_ms: {pcie_ms:.2f}")
    _, grouped_ms = best_and_median_ms(lambda: build(plain, DeviceSettings(mode="grouped")))
    print(f"build_slices_768cpu_grouped_ms: {grouped_ms:.3f}")

    # Peer in the same run: serialising the result with the stdlib JSON encoder, the step
    # any API client must take anyway. A ratio below 1 means building is the cheaper part.
    slices = build(plain, individual)
    _, json_ms = best_and_median_ms(lambda: json.dumps(slices))
    print(f"json_dumps_768cpu_slices_ms: {json_ms:.2f}")
    print(f"build_vs_json_dumps_ratio: {median / json_ms:.2f}")
    print(f"slices_768cpu: {len(slices)} count")


if __name__ == "__main__":
    main()
