"""A fake procfs tree for the interrupt tests: ``irq/default_smp_affinity`` and
``irq/<N>/smp_affinity_list`` as plain files, shaped as a kernel prints them."""

from __future__ import annotations

import errno
from collections.abc import Mapping
from pathlib import Path

from dracpu.cpuset import CPUSet
from dracpu.irq.procfs import IrqWriteError, ProcIrq


def make_proc(root: Path, default: str, irqs: Mapping[int, str]) -> Path:
    """Write a tree under ``root/proc``; ``default`` is the hex mask text."""
    proc = root / "proc"
    (proc / "irq").mkdir(parents=True, exist_ok=True)
    (proc / "irq" / "default_smp_affinity").write_text(default + "\n")
    for irq, cpus in irqs.items():
        (proc / "irq" / str(irq)).mkdir(exist_ok=True)
        (proc / "irq" / str(irq) / "smp_affinity_list").write_text(cpus + "\n")
    return proc


def affinities(proc: Path) -> dict[int, str]:
    """Every interrupt's list as the files hold it now."""
    out = {}
    for d in sorted((proc / "irq").iterdir()):
        if d.name.isdigit():
            out[int(d.name)] = (d / "smp_affinity_list").read_text().strip()
    return out


def default_mask(proc: Path) -> str:
    return (proc / "irq" / "default_smp_affinity").read_text().strip()


class ManagedProc(ProcIrq):
    """Writes to the ``managed`` interrupts fail as the kernel fails them (EIO)."""

    def __init__(self, proc_root: str, managed: set[int], errno_: int = errno.EIO) -> None:
        super().__init__(proc_root)
        self.managed = managed
        self.errno_ = errno_
        self.attempts: list[int] = []

    def write_affinity(self, irq: int, cpus: CPUSet) -> None:
        self.attempts.append(irq)
        if irq in self.managed:
            raise IrqWriteError(self.affinity_path(irq), self.errno_, "Input/output error")
        super().write_affinity(irq, cpus)
