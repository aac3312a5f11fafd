"""One pass over the interrupts: which masks to write, and what to remember (pure).

dracpu keeps device interrupts off *banned* CPUs: the union of the CPUs of every prepared
claim that asked for it. For each interrupt the wanted mask is what it had before dracpu
touched it (its *original*) minus the banned CPUs:

- while anything is banned, every interrupt present gets an original, read before the
  first write of the pass; the record holding them is on disk before any mask changes
  (``irq/service.py``), so a crash at any point can put every mask back;
- an interrupt that appears while a ban is in force, with exactly the default affinity
  dracpu wrote, was born from that default (a new MSI vector): its original is the
  node's original default, so it gets the banned CPUs back with everyone else;
- if removing the banned CPUs would leave no CPU, the interrupt keeps its original and is
  reported (``would-empty``): the kernel refuses empty masks and an interrupt with no
  target would stall its device;
- with nothing banned, every remembered original is wanted again.

``/proc/irq/default_smp_affinity`` (the affinity new interrupts start with) follows the
same rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dracpu.cpuset import CPUSet
from dracpu.irq.masks import HexMask

__all__ = ["IrqPass", "plan_pass"]


@dataclass(frozen=True, slots=True)
class IrqPass:
    """What a pass writes, and the originals to keep on disk before it writes."""

    originals: dict[int, CPUSet]
    default_original: HexMask | None
    writes: dict[int, CPUSet] = field(default_factory=dict)
    default_write: HexMask | None = None
    would_empty: tuple[int, ...] = ()
    default_would_empty: bool = False


def plan_pass(
    *,
    banned: CPUSet,
    current: Mapping[int, CPUSet],
    current_default: HexMask,
    originals: Mapping[int, CPUSet],
    default_original: HexMask | None,
) -> IrqPass:
    """Plan a pass from what the files hold now and what dracpu remembered."""
    # The default dracpu had in force, if it had changed it: interrupts born since have it.
    born_default = (
        current_default.cpus
        if default_original is not None and current_default.cpus != default_original.cpus
        else None
    )
    kept: dict[int, CPUSet] = {}
    writes: dict[int, CPUSet] = {}
    would_empty: list[int] = []
    for irq, now in current.items():
        original = originals.get(irq)
        if original is None:
            if not banned:
                continue  # never touched and nothing to do
            original = (
                default_original.cpus
                if born_default is not None and default_original is not None and now == born_default
                else now
            )
        kept[irq] = original
        wanted = original - banned
        if not wanted:
            wanted = original
            if original & banned:
                would_empty.append(irq)
        if wanted != now:
            writes[irq] = wanted
    default_keep = default_original
    default_write = None
    default_empty = False
    if banned and default_keep is None:
        default_keep = current_default
    if default_keep is not None:
        wanted_default = default_keep.cpus - banned
        if not wanted_default:
            wanted_default = default_keep.cpus
            default_empty = bool(default_keep.cpus & banned)
        if wanted_default != current_default.cpus:
            default_write = current_default.with_cpus(wanted_default)
    return IrqPass(
        originals=kept,
        default_original=default_keep,
        writes=writes,
        default_write=default_write,
        would_empty=tuple(would_empty),
        default_would_empty=default_empty,
    )
