"""The cpuset writer's plan and results, without I/O: which cgroup files get which sets, in
which order, and what a finished write reports.

On cgroup v1 a child's CPUs and memory nodes must lie within its parent's, so ancestors
that lack the target set are widened first, top down, and the container's own cgroup is
written last (which is also the only place a set ever narrows: dracpu never narrows a
parent, so no sibling can be left outside it). ``BlockingCgroupWriter``
(``blocking_writer.py``) reads the tree, carries the plan out and reads the result back.
"""

from __future__ import annotations

import errno as errno_mod
import os
from collections.abc import Sequence
from dataclasses import dataclass

from dracpu.cpuset import CPUSet

__all__ = [
    "CgroupIntentError",
    "CgroupWriteError",
    "CpusetWrite",
    "WriteOutcome",
    "plan_cpuset_writes",
]


class CgroupWriteError(Exception):
    """Reading or writing one cgroup file failed; names the file and the errno."""

    def __init__(self, path: str, errno: int, detail: str = "") -> None:
        self.path = path
        self.errno = errno
        self.detail = detail
        name = errno_mod.errorcode.get(errno, str(errno))
        text = detail or os.strerror(errno)
        super().__init__(f"{path}: {name} ({text})")


class CgroupIntentError(ValueError):
    """An intent that cannot be written at all (unparsable or empty cpuset)."""


@dataclass(frozen=True, slots=True)
class CpusetWrite:
    """One planned write: ``value`` into ``<directory>/<file>``."""

    directory: str
    file: str
    value: str

    @property
    def path(self) -> str:
        return f"{self.directory}/{self.file}"


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What one write did. ``ok`` is False when the read-back differs from the intent."""

    container_id: str
    directory: str
    cpus: str
    effective_cpus: str
    mems: str = ""
    effective_mems: str = ""
    writes: tuple[CpusetWrite, ...] = ()

    @property
    def cpus_mismatch(self) -> bool:
        return CPUSet.parse(self.cpus) != CPUSet.parse(self.effective_cpus)

    @property
    def mems_mismatch(self) -> bool:
        return bool(self.mems) and CPUSet.parse(self.mems) != CPUSet.parse(self.effective_mems)

    @property
    def ok(self) -> bool:
        return not (self.cpus_mismatch or self.mems_mismatch)

    @property
    def widened(self) -> tuple[str, ...]:
        """Ancestor directories that were widened, in the order written."""
        return tuple(w.directory for w in self.writes if w.directory != self.directory)

    def describe_mismatch(self) -> str:
        parts = []
        if self.cpus_mismatch:
            parts.append(
                f"effective cpus {self.effective_cpus!r} differ from intended {self.cpus!r}"
            )
        if self.mems_mismatch:
            parts.append(
                f"effective mems {self.effective_mems!r} differ from intended {self.mems!r}"
            )
        return f"{self.directory}: " + "; ".join(parts) if parts else ""


def plan_cpuset_writes(
    leaf: str,
    file: str,
    target: CPUSet,
    ancestors: Sequence[tuple[str, CPUSet | None]],
    *,
    limit: CPUSet | None,
    nested: bool,
) -> list[CpusetWrite]:
    """Pure: the ordered writes that put ``target`` into ``<leaf>/<file>``.

    ``ancestors`` run from the top (just below the hierarchy root) down to the leaf's parent,
    each with its current set, or None when it has no such file (a fake tree) and so
    constrains nothing. ``limit`` is the hierarchy root's set, which dracpu never writes.
    With ``nested`` (v1) an ancestor that lacks part of ``target`` is widened to its union
    with ``target``; on v2 only ancestors with an explicit, too-narrow set are widened (an
    empty one inherits). Parents come before the leaf; no parent is ever narrowed.
    """
    if limit is not None and limit and not target <= limit:
        raise CgroupWriteError(
            f"{leaf}/{file}",
            errno_mod.EINVAL,
            f"{target} is not within the cgroup root's {limit}",
        )
    writes: list[CpusetWrite] = []
    for directory, current in ancestors:
        if current is None or target <= current:
            continue
        if not nested and not current:
            continue
        writes.append(CpusetWrite(directory, file, str(current | target)))
    writes.append(CpusetWrite(leaf, file, str(target)))
    return writes
