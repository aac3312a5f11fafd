"""One pass over the interrupts: which masks to write, and what to remember (pure).

dracpu keeps device interrupts off *banned* CPUs: the union of the CPUs of every prepared
claim that asked for it. It only ever clears bits, as CRI-O does, and it shares
``/proc/irq`` with other writers (irqbalance, the administrator), so it owns a mask only
while the mask is still the one it wrote:

- **a mask dracpu owns** (it reads back exactly what dracpu wrote, ``written``, or what a
  pass that did not finish was about to write, ``pending``) is computed from the
  interrupt's *original*, the mask it had before dracpu changed it: ``original - banned``.
  A ban that shrinks gives CPUs back this way; one that grows never narrows a mask step by
  step;
- **any other mask** is another writer's choice. While it holds no banned CPU it is left
  alone (and forgotten: nothing to give back); otherwise dracpu writes ``now - banned``,
  or ``original - banned`` when that is empty, and the mask it replaced becomes the
  original to give back. irqbalance configured as docs/workloads.md says (its
  ``IRQBALANCE_BANNED_CPULIST``: CPUs that get no interrupt when it rebalances, per its
  misc/irqbalance.env) only writes masks of the first kind, so the two no longer undo
  each other's writes;
- a wanted mask must hold an *online* CPU: the kernel refuses the write otherwise
  (kernel/irq/proc.c ``write_irq_affinity``: a mask that intersects no online CPU goes to
  ``irq_select_affinity_usr``, which answers -EINVAL everywhere but Alpha;
  ``default_affinity_write`` answers -EINVAL outright). ``smp_affinity_list`` may name
  offline CPUs, so an original can hold none. When no candidate holds one the interrupt is
  reported (``would-empty``) and never written to be refused: a mask dracpu owns gets its
  original back (every online CPU of it is banned: narrowing it serves nothing), any other
  is left as it is;
- an interrupt that appears while a ban is in force (not among ``present``, the
  interrupts of the previous pass) with exactly the default affinity dracpu wrote was born
  from that default (a new MSI vector): dracpu owns it, and its original is the node's
  original default;
- with nothing banned, every mask dracpu still owns gets its original back (once the
  original holds an online CPU); every mask another writer changed since is left with
  that writer's choice.

``/proc/irq/default_smp_affinity`` (the affinity new interrupts start with) follows the
same rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dracpu.cpuset import CPUSet
from dracpu.irq.masks import HexMask

__all__ = ["IrqPass", "plan_pass"]


@dataclass(frozen=True, slots=True)
class IrqPass:
    """What a pass writes, and what dracpu owns once the writes are done.

    ``originals`` and ``written`` are the masks dracpu owns after the pass (the ones it
    writes included: ``writes`` is a subset of ``written``); ``default_original`` and
    ``default_written`` the same for the default affinity (None: not dracpu's).
    ``waiting`` are owned interrupts whose original holds no online CPU yet, at a give
    back: they stay owned until a CPU of theirs comes online.
    """

    originals: dict[int, CPUSet]
    written: dict[int, CPUSet]
    default_original: HexMask | None
    default_written: HexMask | None = None
    writes: dict[int, CPUSet] = field(default_factory=dict)
    default_write: HexMask | None = None
    would_empty: tuple[int, ...] = ()
    default_would_empty: bool = False
    waiting: tuple[int, ...] = ()
    default_waiting: bool = False


def _usable(cpus: CPUSet | None, online: CPUSet | None) -> bool:
    """A mask the kernel takes: it holds an online CPU (any CPU when online is unknown)."""
    if cpus is None or not cpus:
        return False
    return online is None or bool(cpus & online)


def _choose(candidates: tuple[CPUSet | None, ...], online: CPUSet | None) -> CPUSet | None:
    return next((c for c in candidates if c is not None and _usable(c, online)), None)


def plan_pass(
    *,
    banned: CPUSet,
    current: Mapping[int, CPUSet],
    current_default: HexMask,
    originals: Mapping[int, CPUSet],
    written: Mapping[int, CPUSet],
    default_original: HexMask | None,
    default_written: HexMask | None,
    pending: Mapping[int, CPUSet] | None = None,
    default_pending: HexMask | None = None,
    present: CPUSet | None = None,
    online: CPUSet | None = None,
) -> IrqPass:
    """Plan a pass from what the files hold now and what dracpu remembered.

    ``present``: the interrupts the previous pass saw (None: unknown, so no interrupt is
    taken for one born from dracpu's default). ``online``: the CPUs online now (None:
    unknown, every CPU counts as online).
    """
    pending = pending or {}
    # The default, and whether dracpu owns it (the file reads what it wrote).
    default_owned = default_original is not None and (
        (default_written is not None and current_default.cpus == default_written.cpus)
        or (default_pending is not None and current_default.cpus == default_pending.cpus)
    )
    born_default = current_default.cpus if default_owned and banned else None

    kept: dict[int, CPUSet] = {}
    kept_written: dict[int, CPUSet] = {}
    writes: dict[int, CPUSet] = {}
    would_empty: list[int] = []
    waiting: list[int] = []
    for irq, now in current.items():
        original = originals.get(irq)
        owned = original is not None and now in (written.get(irq), pending.get(irq))
        if (
            not owned
            and born_default is not None
            and default_original is not None
            and now == born_default
            and present is not None
            and irq not in present
        ):
            owned, original = True, default_original.cpus
        if not banned:
            if not owned or original is None:
                continue  # another writer's choice since, or never dracpu's
            if not _usable(original, online):
                waiting.append(irq)  # kept as dracpu wrote it until a CPU comes online
                kept[irq], kept_written[irq] = original, now
            elif original != now:
                writes[irq] = original
            continue
        if owned and original is not None:
            wanted = _choose((original - banned,), online)
            base = original
            if wanted is None and _usable(original, online):
                # Every online CPU it may use is banned: dracpu's narrowing serves nothing,
                # so it gets its original back (still dracpu's, reported).
                would_empty.append(irq)
                kept[irq], kept_written[irq] = original, original
                if original != now:
                    writes[irq] = original
                continue
        elif not now & banned:
            continue  # another writer's mask that avoids the ban: theirs, left alone
        else:
            wanted = _choose(
                (now - banned, None if original is None else original - banned), online
            )
            base = now
        if wanted is None:
            if now & banned:
                would_empty.append(irq)
            if owned:
                kept[irq], kept_written[irq] = base, now
            continue
        kept[irq], kept_written[irq] = base, wanted
        if wanted != now:
            writes[irq] = wanted

    d_original: HexMask | None = None
    d_written: HexMask | None = None
    default_write: HexMask | None = None
    default_empty = False
    default_wait = False
    cur = current_default.cpus
    if not banned:
        if default_owned and default_original is not None:
            if not _usable(default_original.cpus, online):
                default_wait = True
                d_original, d_written = default_original, current_default
            elif default_original.cpus != cur:
                default_write = current_default.with_cpus(default_original.cpus)
    else:
        if default_owned and default_original is not None:
            base_default = default_original
            chosen = _choose((default_original.cpus - banned,), online)
            if chosen is None and _usable(default_original.cpus, online):
                chosen = default_original.cpus  # as for an interrupt: its original back
                default_empty = True
        elif not cur & banned:
            base_default = None
            chosen = None
        else:
            base_default = current_default
            chosen = _choose(
                (
                    cur - banned,
                    None if default_original is None else default_original.cpus - banned,
                ),
                online,
            )
        if base_default is not None:
            if chosen is None:
                default_empty = default_empty or bool(cur & banned)
                if default_owned:
                    d_original, d_written = base_default, current_default
            else:
                d_original, d_written = base_default, current_default.with_cpus(chosen)
                if chosen != cur:
                    default_write = d_written
    return IrqPass(
        originals=kept,
        written=kept_written,
        default_original=d_original,
        default_written=d_written,
        writes=writes,
        default_write=default_write,
        would_empty=tuple(would_empty),
        default_would_empty=default_empty,
        waiting=tuple(waiting),
        default_waiting=default_wait,
    )
