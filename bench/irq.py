"""One interrupt pass on a large fake procfs: 768 CPUs (a 2-socket EPYC node) and 1,024
interrupts (network and NVMe queues on such a node), every one movable.

- ``ban_pass_ms``: a claim of 64 CPUs asks for isolateIRQs; the pass reads every mask,
  writes the record of originals and every changed mask (median of 5);
- ``resync_pass_ms``: the same ban again, nothing to write (what the 60 s resync costs);
- ``restore_pass_ms``: the claim is gone; every original is written back and the record
  emptied;
- ``record_bytes``: the size of irq-affinity.json while the ban holds;
- ``record_writes``: atomic writes (each with its fsyncs) of the record in the ban, resync
  and restore passes; they set the floor of each pass's time on a real disk.

The times are of regular files standing in for procfs: a write that truncates a file
written moments before makes ext4 allocate its blocks first, which is most of the restore
pass here and does not exist on procfs (its files ignore O_TRUNC).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from dracpu.allocation.store import ClaimRecord
from dracpu.cpuset import CPUSet
from dracpu.irq.masks import HexMask
from dracpu.irq.record import RECORD_FILE, IrqRecord
from dracpu.irq.service import IrqIsolation

CPUS = CPUSet.range(0, 767)
IRQS = 1024
BANNED = CPUSet.range(128, 191)
RUNS = 5


def make_tree(root: Path) -> None:
    irq = root / "proc" / "irq"
    irq.mkdir(parents=True)
    default = HexMask(cpus=CPUS, chunks=24, first_width=8)
    (irq / "default_smp_affinity").write_text(default.format() + "\n")
    for n in range(IRQS):
        (irq / str(n)).mkdir()
        # Queues spread over the node: each on one NUMA-sized range of 96 CPUs.
        first = (n * 96) % 768
        (irq / str(n) / "smp_affinity_list").write_text(f"{first}-{first + 95}\n")


class _NoClaims:
    """The owner's view with nothing prepared (the bench bans by hand)."""

    online = CPUSet()

    def claims(self) -> list[ClaimRecord]:
        return []


def one_round() -> tuple[float, float, float, int, list[int]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_tree(root)
        svc = IrqIsolation(
            str(root / "proc"), str(root / "state"), boot_id="bench", view=_NoClaims()
        )
        svc.load()
        saves: list[int] = []
        save = svc.record_file.save

        def counted(record: IrqRecord) -> None:
            saves[-1] += 1
            save(record)

        svc.record_file.save = counted  # type: ignore[method-assign]
        saves.append(0)
        t0 = time.perf_counter()
        svc.apply(BANNED)
        t1 = time.perf_counter()
        size = (root / "state" / RECORD_FILE).stat().st_size
        saves.append(0)
        svc.apply(BANNED)
        t2 = time.perf_counter()
        saves.append(0)
        svc.apply(CPUSet())
        t3 = time.perf_counter()
        return (t1 - t0) * 1000, (t2 - t1) * 1000, (t3 - t2) * 1000, size, saves


def main() -> None:
    rounds = [one_round() for _ in range(RUNS)]
    print(f"ban_pass_ms: {statistics.median(r[0] for r in rounds):.1f} ms")
    print(f"resync_pass_ms: {statistics.median(r[1] for r in rounds):.1f} ms")
    print(f"restore_pass_ms: {statistics.median(r[2] for r in rounds):.1f} ms")
    print(f"record_bytes: {rounds[0][3]} bytes")
    ban, resync, restore = rounds[0][4]
    print(f"record_writes: {ban} ban, {resync} resync, {restore} restore")


if __name__ == "__main__":
    main()
