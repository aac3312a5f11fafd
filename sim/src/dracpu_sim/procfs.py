"""The fake procfs the simulated node gives the daemon (``--proc-root``): the host's boot id
and a few interrupts under ``irq/``. The interrupt service runs for real on it while claims
with ``isolateIRQs`` come and go, the chaos invariants compare every mask with its
original, and a demo never touches the host's ``/proc/irq``.

Every interrupt's original holds the node's first CPU, which the chaos run reserves, so no
ban can leave one without a CPU there: each mask must be exactly its original minus the
CPUs of the prepared claims that asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dracpu.cpuset import CPUSet
from dracpu.irq.masks import HexMask

__all__ = ["FakeIrqs", "make_fake_procfs"]


@dataclass(frozen=True)
class FakeIrqs:
    """Where the tree is and what every interrupt had before the daemon started."""

    proc_root: str
    originals: dict[int, CPUSet]
    default_original: CPUSet


def _boot_id() -> str:
    # The host's, so the daemon sees the same boot as it would with the real /proc.
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "00000000-0000-0000-0000-000000000000"


def make_fake_procfs(directory: str, online: CPUSet) -> FakeIrqs:
    """Write ``<directory>/proc`` for a node whose CPUs are ``online``."""
    root = Path(directory, "proc")
    first = online.min()
    half = online.sorted()[len(online) // 2]
    originals = {
        0: CPUSet([first]),
        8: online,
        16: CPUSet(c for c in online if c < half),
        17: CPUSet(c for c in online if c >= half) | CPUSet([first]),
        24: online,
        25: online,
        30: CPUSet(online.sorted()[:8]),
    }
    random_dir = root / "sys" / "kernel" / "random"
    random_dir.mkdir(parents=True, exist_ok=True)
    (random_dir / "boot_id").write_text(_boot_id() + "\n")
    irq_dir = root / "irq"
    irq_dir.mkdir(exist_ok=True)
    bits = online.max() + 1  # nr_cpu_ids: what %*pb prints
    chunks = (bits + 31) // 32
    first_width = ((bits % 32) + 3) // 4 if bits % 32 else 8
    default = HexMask(cpus=online, chunks=chunks, first_width=first_width)
    (irq_dir / "default_smp_affinity").write_text(default.format() + "\n")
    for irq, cpus in originals.items():
        (irq_dir / str(irq)).mkdir(exist_ok=True)
        (irq_dir / str(irq) / "smp_affinity_list").write_text(cpus.format() + "\n")
    return FakeIrqs(proc_root=str(root), originals=originals, default_original=online)
