"""Drift watcher cost on a fake cgroup v1 tree of 1,000 containers (one per pod).

repair_1000_ms: one check that finds all 1,000 containers drifted and has the cgroupfs
writer task rewrite them (read, compare; the writer asks the owner, widen-checks parents,
writes, reads back); check_1000_clean_ms: one check with nothing to repair. Median of 5
runs each, after one warm-up check.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Iterable

import trio

from dracpu.cgroupfs.watcher import DriftWatcher
from dracpu.cgroupfs.writer import CgroupWriter
from dracpu.cpuset import CPUSet
from dracpu.messages import ContainerIntent

N = 1000
RUNS = 5


def _put(path: str, text: str) -> None:
    # Callers only ever grow a file here, so no truncation (slow on ext4) is needed.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    os.write(fd, text.encode())
    os.close(fd)


class _Owner:
    """The state owner's view: fixed intents, pool 0-63."""

    def __init__(self, intents: list[ContainerIntent]) -> None:
        self._intents = {i.container_id: i for i in intents}
        self.shared_pool = CPUSet.parse("0-63")
        self.has_synchronized = True

    def intents(self) -> list[ContainerIntent]:
        return list(self._intents.values())

    def intents_of(self, ids: Iterable[str]) -> dict[str, ContainerIntent]:
        return {i: self._intents[i] for i in ids if i in self._intents}

    def still_wanted(self, intents: Iterable[ContainerIntent]) -> list[ContainerIntent]:
        return [i for i in intents if self._intents.get(i.container_id) == i]


def main() -> None:
    trio.run(_main)


async def _main() -> None:
    with tempfile.TemporaryDirectory(prefix="dracpu-bench-") as root:
        hierarchy = f"{root}/cpuset"
        os.makedirs(f"{hierarchy}/kubepods")
        for d in (hierarchy, f"{hierarchy}/kubepods"):
            _put(f"{d}/cpuset.cpus", "0-63\n")
        intents = []
        for i in range(N):
            path = f"/kubepods/pod{i:04d}/c{i:04d}"
            os.makedirs(hierarchy + path)
            _put(f"{hierarchy}{path}/cpuset.cpus", f"{i % 32 * 2}-{i % 32 * 2 + 1}\n")
            intents.append(
                ContainerIntent(container_id=f"c{i:04d}", cgroups_path=path, cpus=f"{i % 32 * 2}")
            )
        owner = _Owner(intents)
        writer = CgroupWriter(root)
        watcher = DriftWatcher(writer, owner, offload=False)  # the check itself, inline
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run, owner)
            await _checks(watcher, hierarchy, intents)
            nursery.cancel_scope.cancel()


async def _checks(watcher: DriftWatcher, hierarchy: str, intents: list[ContainerIntent]) -> None:
    start = time.perf_counter()
    cold = await watcher.check()  # resolves paths and repairs everything once
    cold_ms = (time.perf_counter() - start) * 1000
    assert cold.repaired == N, cold

    repair, clean = [], []
    for _ in range(RUNS):
        for it in intents:
            _put(f"{hierarchy}{it.cgroups_path}/cpuset.cpus", "0-63\n")
        start = time.perf_counter()
        report = await watcher.check()
        repair.append((time.perf_counter() - start) * 1000)
        assert (report.drifted, report.repaired, report.errors) == (N, N, 0), report
        start = time.perf_counter()
        report = await watcher.check()
        clean.append((time.perf_counter() - start) * 1000)
        assert report.drifted == 0, report
    print(f"repair_1000_ms: {statistics.median(repair):.1f}")
    print(f"check_1000_clean_ms: {statistics.median(clean):.1f}")
    print(f"first_check_1000_ms: {cold_ms:.1f}")
    print(f"repair_vs_clean_ratio: {statistics.median(repair) / statistics.median(clean):.2f}")


if __name__ == "__main__":
    main()
