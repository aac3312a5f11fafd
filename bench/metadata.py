"""Device-metadata file work per prepare+unprepare pair: spare trees against new ones.

64 claims are prepared and unprepared again and again, as in a node drain, through the
daemon's own metadata steps (``write_claim_metadata``, ``remove_claim_metadata`` and the
purge), files in a plugin dir on disk (``DRACPU_BENCH_DISK``, default /var/tmp) and specs
in a CDI dir on tmpfs (/dev/shm when there is one). One process, no threads: CPU time
(user + system) of this process per pair, median of alternated rounds.

- ``metadata_pair_cpu_us_spares``: as the daemon runs, with spare trees kept (at most 64):
  a prepare takes the tree an unprepare set aside.
- ``metadata_pair_cpu_us_new_trees``: no spare kept (``keep=0``): every prepare makes a
  new tree and every purge deletes the old one, as before spares. On ext4 without a
  journal each new inode scans the inodes its group freed in the last minute, so this
  line grows with the churn there.
- ``metadata_spares_vs_new_trees``: their ratio.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

from dracpu.allocation.prepare import ClaimAllocation
from dracpu.allocation.store import PreparedDevice
from dracpu.kubelet.metadata import MetadataPurger, remove_claim_metadata, write_claim_metadata

CLAIMS = 64
CYCLES = 10  # each claim prepared and unprepared this many times per round
ROUNDS = 5
DEVICES = [PreparedDevice(pool_name="node-a", device_name="cpudevnuma000", request_names=("cpus",))]


def _claims() -> list[ClaimAllocation]:
    return [
        ClaimAllocation(
            uid=f"6f1c2a3e-0b5d-4c1e-9a57-{i:012d}", namespace="default", name=f"claim-{i}"
        )
        for i in range(CLAIMS)
    ]


def _round(keep: int) -> float:
    """CPU microseconds per pair for one round in fresh directories."""
    plugin_dir = tempfile.mkdtemp(dir=os.environ.get("DRACPU_BENCH_DISK", "/var/tmp"))
    cdi_dir = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        purger = MetadataPurger(plugin_dir, keep=keep)
        spares = purger.spares
        claims = _claims()
        started = time.process_time()
        for _ in range(CYCLES):
            for c in claims:
                write_claim_metadata(
                    plugin_dir, cdi_dir, c, DEVICES, None, spec_durable=False, spares=spares
                )
            for c in claims:
                remove_claim_metadata(
                    plugin_dir, cdi_dir, c.namespace, c.name, c.uid, purge=False, spares=spares
                )
            spares.purge()  # what the metadata-purge service does after the unprepares
        return (time.process_time() - started) / (CYCLES * CLAIMS) * 1e6
    finally:
        shutil.rmtree(plugin_dir, ignore_errors=True)
        shutil.rmtree(cdi_dir, ignore_errors=True)


def main() -> None:
    runs: dict[int, list[float]] = {64: [], 0: []}
    for i in range(ROUNDS):
        for keep in (64, 0) if i % 2 == 0 else (0, 64):
            runs[keep].append(_round(keep))
    spares, new_trees = statistics.median(runs[64]), statistics.median(runs[0])
    ratio = statistics.median(a / b for a, b in zip(runs[64], runs[0], strict=True))
    print(f"metadata_pair_cpu_us_spares: {spares:.0f} us")
    print(f"metadata_pair_cpu_us_new_trees: {new_trees:.0f} us")
    print(f"metadata_spares_vs_new_trees: {ratio:.2f} x")


if __name__ == "__main__":
    main()
