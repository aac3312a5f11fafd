"""Topology discovery of the 768-CPU fixture, against the bare syscalls it cannot avoid.

The peer is a loop that only lists and reads the same files discovery does (open/read/close
per file, one listing per directory), so ``discover_vs_raw_io`` is the price of the Python
around the I/O. Prints ``name: value unit`` lines.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from dracpu.topology import SysfsReader, discover_topology  # noqa: E402

ROOT = REPO / "tests" / "fake_sysfs" / "epyc-2s-768"
RUNS = 9
_FILES = (
    "topology/physical_package_id",
    "topology/cluster_id",
    "topology/core_id",
    "topology/die_id",
    "cache/index0/level",
    "cache/index1/level",
    "cache/index2/level",
    "cache/index3/level",
    "cache/index3/shared_cpu_list",
    "cache/index3/id",
)


def raw_io(root: str, cpus: int) -> None:
    flags = os.O_RDONLY | os.O_CLOEXEC
    for cpu in range(cpus):
        cpu_dir = f"{root}/devices/system/cpu/cpu{cpu}"
        os.listdir(cpu_dir)
        os.listdir(cpu_dir + "/cache")
        for rel in _FILES:
            fd = os.open(f"{cpu_dir}/{rel}", flags)
            os.read(fd, 1 << 16)
            os.close(fd)


def timings(fn: Callable[[], object]) -> list[float]:
    fn()  # warm the dentry cache
    out = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def main() -> None:
    reader = SysfsReader(ROOT)
    topo = discover_topology(reader)
    discover = timings(lambda: discover_topology(SysfsReader(ROOT)))
    raw = timings(lambda: raw_io(str(ROOT), topo.num_cpus))
    print(f"discover_768cpu_ms: {min(discover):.1f}")
    print(f"discover_768cpu_median_ms: {statistics.median(discover):.1f}")
    print(f"raw_io_768cpu_ms: {min(raw):.1f}")
    print(f"discover_vs_raw_io: {min(discover) / min(raw):.2f} x")


if __name__ == "__main__":
    main()
