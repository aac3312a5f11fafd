"""The CPU map: which claim, the shared pool, the reserved set or nobody (isolated CPUs)
holds each CPU.

Printed by `dracpu demo` and `dracpu map`. One line per L3 group (socket → NUMA node → L3),
one cell per physical core holding one mark per hardware thread, then a legend::

    Socket 0 · NUMA 0 · L3 0   AA AA .. ..
      A  default/pinned   0-1,8-9 (4 CPUs)
      .  shared pool      2-3,10-11 (4 CPUs)

Pure: it takes plain rows, built from a ``Topology`` or from the ``topology`` section of
``/debug/state`` (the JSON of `dracpu introspect topology`), so a map of a remote daemon
needs no sysfs.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dracpu.cpuset import CPUSet
from dracpu.topology.model import NO_ID, Topology

__all__ = ["CPURow", "render_cpu_map", "rows_from_document", "rows_from_topology"]

SHARED_MARK = "."
RESERVED_MARK = "r"
ISOLATED_MARK = "i"
UNMANAGED_MARK = "-"
_CLAIM_MARKS = (
    string.ascii_uppercase
    + string.ascii_lowercase.replace("r", "").replace("i", "")
    + string.digits
)
_OVERFLOW_MARK = "#"


@dataclass(frozen=True, slots=True)
class CPURow:
    cpu: int
    socket: int
    numa: int
    l3: int
    core: tuple[int, int, int]


def rows_from_topology(topo: Topology) -> list[CPURow]:
    return [CPURow(i.cpu, i.socket, i.numa, i.l3, i.core_key) for _, i in sorted(topo.cpus.items())]


def rows_from_document(doc: Mapping[str, Any]) -> list[CPURow]:
    """Rows from `dracpu introspect topology --format json` output. Raises ValueError."""
    try:
        return [
            CPURow(
                int(c["cpu"]),
                int(c["socket"]),
                int(c["numa"]),
                int(c["l3"]),
                (int(c["socket"]), int(c["cluster"]), int(c["core"])),
            )
            for c in doc["cpus"]
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a topology document: {exc!r}") from None


def _marks(
    claims: Mapping[str, CPUSet], shared: CPUSet, reserved: CPUSet, isolated: CPUSet
) -> tuple[dict[int, str], list[tuple[str, str, CPUSet]]]:
    owner: dict[int, str] = {}
    legend: list[tuple[str, str, CPUSet]] = []
    for index, (label, cpus) in enumerate(sorted(claims.items())):
        mark = _CLAIM_MARKS[index] if index < len(_CLAIM_MARKS) else _OVERFLOW_MARK
        legend.append((mark, label, cpus))
        for cpu in cpus:
            owner[cpu] = mark
    # Reserved CPUs are the shared pool's floor (allocation/floor.py): in the pool, but
    # marked as reserved.
    for cpu in reserved:
        owner.setdefault(cpu, RESERVED_MARK)
    for cpu in shared:
        owner.setdefault(cpu, SHARED_MARK)
    free_isolated = CPUSet(c for c in isolated if c not in owner)
    for cpu in free_isolated:
        owner[cpu] = ISOLATED_MARK
    legend.append((SHARED_MARK, "shared pool", shared))
    if reserved:
        legend.append((RESERVED_MARK, "reserved", reserved))
    if free_isolated:
        legend.append((ISOLATED_MARK, "isolated, unclaimed", free_isolated))
    return owner, legend


def _group_label(socket: int, numa: int, l3: int) -> str:
    l3_text = "?" if l3 == NO_ID else str(l3)
    return f"Socket {socket} · NUMA {numa} · L3 {l3_text}"


def render_cpu_map(
    rows: Sequence[CPURow],
    *,
    claims: Mapping[str, CPUSet],
    shared: CPUSet,
    reserved: CPUSet = CPUSet(),  # noqa: B008 - CPUSet is immutable
    isolated: CPUSet = CPUSet(),  # noqa: B008
    notes: Mapping[str, str] | None = None,
) -> str:
    """The map as text; ``claims`` maps a label (e.g. ``ns/claim``) to its CPUs;
    ``isolated`` CPUs that no claim holds are marked apart (they are never shared).
    ``notes`` maps a claim's label to a line shown under its legend entry (what the
    claim's ``status.devices`` says)."""
    owner, legend = _marks(claims, shared, reserved, isolated)
    groups: dict[tuple[int, int, int], dict[tuple[int, int, int], list[int]]] = {}
    for row in sorted(rows, key=lambda r: (r.socket, r.numa, r.l3, r.cpu)):
        cores = groups.setdefault((row.socket, row.numa, row.l3), {})
        cores.setdefault(row.core, []).append(row.cpu)
    labels = {key: _group_label(*key) for key in groups}
    width = max((len(v) for v in labels.values()), default=0)
    lines: list[str] = []
    for key, cores in groups.items():
        cells = " ".join(
            "".join(owner.get(cpu, UNMANAGED_MARK) for cpu in sorted(cpus))
            for cpus in sorted(cores.values(), key=min)
        )
        lines.append(f"  {labels[key]:<{width}}   {cells}")
    name_width = max((len(label) for _, label, _ in legend), default=0)
    for mark, label, cpus in legend:
        lines.append(f"    {mark}  {label:<{name_width}}  {_describe(cpus)}")
        note = (notes or {}).get(label) if mark not in (SHARED_MARK, RESERVED_MARK) else None
        if note:
            lines.append(f"       {note}")
    if any(owner.get(r.cpu, UNMANAGED_MARK) == UNMANAGED_MARK for r in rows):
        lines.append(f"    {UNMANAGED_MARK}  not managed by dracpu")
    return "\n".join(lines) + "\n"


def _describe(cpus: CPUSet) -> str:
    if not cpus:
        return "(none)"
    return f"{cpus.format()} ({len(cpus)} CPU{'s' if len(cpus) != 1 else ''})"
