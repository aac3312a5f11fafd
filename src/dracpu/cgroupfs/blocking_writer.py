"""The cpuset writer's blocking core: carry a container's write out and read it back.

Each write is planned (``plan.py``) from what the tree holds now, ancestors widened first,
and after it the effective set is read back, so that a mismatch is reported rather than
assumed away. Everything here blocks. ``CgroupWriter`` (``writer.py``) is the one task
that writes: it runs these methods in worker threads one at a time, so nothing here needs
a lock; the drift watcher reads through a ``CgroupReader`` of its own.
"""

from __future__ import annotations

import collections
import errno as errno_mod
import os
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

from dracpu.bounded import remember
from dracpu.cgroupfs.files import (
    CPUS_FILE,
    MEMS_FILE,
    parse_set,
    read_cgroup_file,
    read_if_present,
    write_cgroup_file,
)
from dracpu.cgroupfs.paths import CgroupLayout, CgroupPathError, detect_layout, resolve
from dracpu.cgroupfs.plan import (
    CgroupIntentError,
    CgroupWriteError,
    CpusetWrite,
    WriteOutcome,
    plan_cpuset_writes,
)
from dracpu.cpuset import CPUSet, CPUSetParseError
from dracpu.messages import ContainerIntent
from dracpu.metrics import DriverMetrics

__all__ = ["BlockingCgroupWriter", "CgroupReader", "PassStep"]

# Resolved container directories are cached; a node never runs anywhere near this many
# containers, so the bound only guards against slow growth from churn.
_PATH_CACHE_LIMIT = 16384


@dataclass(slots=True)
class _SetCache:
    """Ancestor sets read during one batch, updated as the batch widens them."""

    values: dict[str, CPUSet | None] = field(default_factory=dict)


Results = list[tuple[ContainerIntent, WriteOutcome | Exception]]


@dataclass(slots=True)
class PassStep:
    """One worker-thread step of a verification pass: what it wrote, the next containers
    found to differ (for the owner to confirm), and the cgroups it could not read."""

    written: Results = field(default_factory=list)
    differing: list[ContainerIntent] = field(default_factory=list)
    errors: Results = field(default_factory=list)


class CgroupReader:
    """Finds containers' cgroup directories and reads what the kernel enforces, blocking
    the calling thread. One instance is used by one thread at a time (its caches have no
    lock); the constructor does no I/O; the layout is detected on first use (or passed in).
    """

    def __init__(
        self,
        cgroup_root: str,
        *,
        metrics: DriverMetrics | None = None,
        layout: CgroupLayout | None = None,
    ) -> None:
        self.cgroup_root = cgroup_root
        self.metrics = metrics
        self._layout = layout
        # cgroups path -> directory: bounded, and forgets a path whose directory has gone.
        self._paths: dict[str, str] = {}
        self._no_effective: dict[str, None] = {}

    # -- paths and reads --------------------------------------------------------------
    @property
    def layout(self) -> CgroupLayout:
        if self._layout is None:
            self._layout = detect_layout(self.cgroup_root)
        return self._layout

    def find_hierarchy(self) -> str | None:
        """Look for the cpuset hierarchy (blocking); None when found, else why not (with
        the paths tried). The answer is not cached when nothing is found, so a mount that
        appears later is found on the next use."""
        try:
            self.layout  # noqa: B018 - detection is the point
        except CgroupPathError as exc:
            if self.metrics is not None:
                self.metrics.cpuset_hierarchy_found.set(0)
            return str(exc)
        if self.metrics is not None:
            self.metrics.cpuset_hierarchy_found.set(1)
        return None

    def directory_of(self, cgroups_path: str) -> str:
        """The container's cgroup directory (cached; refuses escapes)."""
        directory = self._paths.get(cgroups_path)
        if directory is None:
            directory = resolve(self.layout, cgroups_path)
            remember(self._paths, cgroups_path, directory, _PATH_CACHE_LIMIT)
        return directory

    def forget(self, cgroups_path: str) -> None:
        """Drop a cached path whose directory is gone."""
        directory = self._paths.pop(cgroups_path, None)
        if directory is not None:
            self._no_effective.pop(f"{directory}/{self.layout.effective_cpus_file}", None)
            self._no_effective.pop(f"{directory}/{self.layout.effective_mems_file}", None)

    def _read_effective(self, directory: str, effective_file: str, fallback: str) -> CPUSet:
        # Fake trees written like runc have no effective file: the configured set is then
        # the best available answer. On a real kernel the effective file exists wherever
        # the configured one does (v2 adds both when a parent enables cpuset), so a cgroup
        # seen with its configured file but without the effective one is a fake tree's:
        # it is remembered, and its read-back after a write does not fail an open first.
        key = f"{directory}/{effective_file}"
        if key not in self._no_effective:
            text = read_if_present(key)
            if text is not None:
                return parse_set(key, text)
        path = f"{directory}/{fallback}"
        text = read_cgroup_file(path)
        remember(self._no_effective, key, None, _PATH_CACHE_LIMIT)
        return parse_set(path, text)

    def read_effective_cpus(self, directory: str) -> CPUSet:
        """The CPUs the kernel enforces for a cgroup; errors name the file read."""
        return self._read_effective(directory, self.layout.effective_cpus_file, CPUS_FILE)

    def read_effective_mems(self, directory: str) -> CPUSet:
        return self._read_effective(directory, self.layout.effective_mems_file, MEMS_FILE)

    def _read_optional(self, path: str) -> CPUSet | None:
        text = read_if_present(path)
        return None if text is None else parse_set(path, text)


class BlockingCgroupWriter(CgroupReader):
    """Writes containers' cpusets straight into cgroupfs, blocking the calling thread.

    Never called from two threads at once: ``CgroupWriter`` (the one writer task) runs it
    in one worker thread at a time, which is what keeps a parent's widening (read, modify,
    write) from interleaving with another write.
    """

    def __init__(
        self,
        cgroup_root: str,
        *,
        metrics: DriverMetrics | None = None,
        layout: CgroupLayout | None = None,
    ) -> None:
        super().__init__(cgroup_root, metrics=metrics, layout=layout)
        # Directories written since the drift watcher last took them: inotify reports
        # dracpu's own writes too, and those are no news to it. The watcher drains them on
        # the Trio thread while a write may be on its way in a worker thread; a deque's
        # append and popleft are atomic, so no lock is needed (and a full one forgets its
        # oldest entries: at worst one echo is taken for news and costs one check).
        self._written: collections.deque[str] = collections.deque(maxlen=_PATH_CACHE_LIMIT)
        self._ancestor_lists: dict[str, list[str]] = {}

    # -- the write ----------------------------------------------------------------------
    def _ancestors(self, directory: str) -> list[str]:
        # The same few pod and QoS levels for every container: computed once per directory
        # (bounded like the path cache).
        ancestors = self._ancestor_lists.get(directory)
        if ancestors is None:
            hierarchy = self.layout.hierarchy.rstrip("/")
            rel = directory[len(hierarchy) + 1 :].split("/")
            ancestors = [hierarchy + "/" + "/".join(rel[:i]) for i in range(1, len(rel))]
            remember(self._ancestor_lists, directory, ancestors, _PATH_CACHE_LIMIT)
        return ancestors

    def _plan(
        self, directory: str, file: str, target: CPUSet, cache: _SetCache
    ) -> list[CpusetWrite]:
        def current(d: str) -> CPUSet | None:
            key = f"{d}/{file}"
            if key not in cache.values:
                cache.values[key] = self._read_optional(key)
            return cache.values[key]

        def plan() -> list[CpusetWrite]:
            return plan_cpuset_writes(
                directory,
                file,
                target,
                [(d, current(d)) for d in self._ancestors(directory)],
                limit=current(self.layout.hierarchy.rstrip("/")),
                nested=self.layout.parents_must_contain_children,
            )

        writes = plan()
        if len(writes) == 1:
            return writes
        # A widening is computed from fresh reads, never from the batch cache: a parent
        # changed meanwhile (by the kubelet) must not be written back narrower.
        for w in writes[:-1]:
            cache.values.pop(w.path, None)
        return plan()

    def _apply(self, writes: Iterable[CpusetWrite], cache: _SetCache) -> None:
        for w in writes:
            # Noted before the write, so the inotify event it causes finds it there.
            self._written.append(w.directory)
            write_cgroup_file(w.path, w.value)
            cache.values[w.path] = CPUSet.parse(w.value)

    def take_written_dirs(self) -> set[str]:
        """The directories written since the last call (any thread, never waits for a
        write in progress)."""
        taken: set[str] = set()
        while True:
            try:
                taken.add(self._written.popleft())
            except IndexError:
                return taken

    def _write(
        self,
        intent: ContainerIntent,
        cache: _SetCache,
        *,
        only_if_differs: bool = False,
        just_read: bool = False,
    ) -> WriteOutcome:
        cpus = _intent_set(intent, "cpus", intent.cpus)
        mems = _intent_set(intent, "mems", intent.mems) if intent.mems else None
        directory = self.directory_of(intent.cgroups_path)
        # ``just_read``: the pass read this cgroup a moment ago and no other write of this
        # process came in between; a cgroup removed since then fails the write itself
        # with ENOENT.
        if not just_read and not os.path.isdir(directory):
            self.forget(intent.cgroups_path)
            raise CgroupWriteError(directory, errno_mod.ENOENT, "no such cgroup directory")
        if only_if_differs and not self._differs(intent):
            return WriteOutcome(
                container_id=intent.container_id,
                directory=directory,
                cpus=str(cpus),
                effective_cpus=str(cpus),
                mems=str(mems) if mems is not None else "",
                effective_mems=str(mems) if mems is not None else "",
            )
        writes: list[CpusetWrite] = []
        if mems is not None:
            # Memory nodes first, so a task moved onto CPUs of another NUMA node already
            # has that node's memory when it gets there.
            mem_plan = self._plan(directory, MEMS_FILE, mems, cache)
            self._apply(mem_plan, cache)
            writes += mem_plan
        cpu_plan = self._plan(directory, CPUS_FILE, cpus, cache)
        self._apply(cpu_plan, cache)
        writes += cpu_plan
        return WriteOutcome(
            container_id=intent.container_id,
            directory=directory,
            cpus=str(cpus),
            effective_cpus=str(self.read_effective_cpus(directory)),
            mems=str(mems) if mems is not None else "",
            effective_mems=(str(self.read_effective_mems(directory)) if mems is not None else ""),
            writes=tuple(writes),
        )

    def write(self, intent: ContainerIntent, *, only_if_differs: bool = False) -> WriteOutcome:
        """Write one container's cpuset (and mems) and read the effective set back.

        ``only_if_differs``: first read what the cgroup enforces and write nothing when
        it already holds the intent (another write got there first: an outcome with no
        writes). Raises :class:`CgroupPathError`, :class:`CgroupWriteError` or
        :class:`CgroupIntentError`; a read-back mismatch is reported in the outcome.
        """
        return self._write(intent, _SetCache(), only_if_differs=only_if_differs)

    def write_many(
        self, intents: Iterable[ContainerIntent], *, only_if_differs: bool = False
    ) -> Results:
        """Write several containers, reading each shared ancestor once (``only_if_differs``
        as for :meth:`write`)."""
        return self._write_all(intents, only_if_differs=only_if_differs)

    def read_differing(
        self, pending: Iterator[ContainerIntent], *, chunk: int, strict: Collection[str] = ()
    ) -> PassStep:
        """Read containers from ``pending`` back until ``chunk`` of them differ from their
        intent (or ``pending`` is done): those are the step's ``differing``, for the owner
        to confirm before :meth:`write_then_read` writes them. A cgroup that is gone or
        whose path cannot be resolved is skipped (stopped meanwhile, or never created),
        except for the ids in ``strict`` (updates the runtime said it could not apply:
        their missing cgroup is an error to report); a cgroup that cannot be read is
        listed in ``errors``."""
        step = PassStep()
        for intent in pending:
            try:
                if self._differs(intent, strict=intent.container_id in strict):
                    step.differing.append(intent)
            except (CgroupPathError, CgroupWriteError, CgroupIntentError) as exc:
                step.errors.append((intent, exc))
            if len(step.differing) >= chunk:
                break
        return step

    def write_then_read(
        self,
        confirmed: Iterable[ContainerIntent],
        pending: Iterator[ContainerIntent],
        *,
        chunk: int,
        strict: Collection[str] = (),
    ) -> PassStep:
        """Write what the owner confirmed of the last step (just read: no second read),
        then read the next chunk, in one trip to the worker thread."""
        written = self._write_all(confirmed, just_read=True)
        step = self.read_differing(pending, chunk=chunk, strict=strict)
        step.written = written
        return step

    def _write_all(
        self,
        intents: Iterable[ContainerIntent],
        *,
        only_if_differs: bool = False,
        just_read: bool = False,
    ) -> Results:
        # The cached ancestor sets stay true for the batch: no other write of this process
        # runs while it does.
        cache = _SetCache()
        results: Results = []
        for intent in intents:
            try:
                outcome = self._write(
                    intent, cache, only_if_differs=only_if_differs, just_read=just_read
                )
                results.append((intent, outcome))
            except (CgroupPathError, CgroupWriteError, CgroupIntentError) as exc:
                # A failed write may have left the cache describing a write that did not
                # happen; drop it rather than plan the next one on a guess.
                cache = _SetCache()
                results.append((intent, exc))
        return results

    def _differs(self, intent: ContainerIntent, *, strict: bool = False) -> bool:
        """Whether the container's cgroup enforces other CPUs (or memory nodes) than the
        intent; False when the cgroup is gone or cannot be found (no hierarchy: warned at
        start; nothing to write into), unless ``strict``: then those raise."""
        try:
            directory = self.directory_of(intent.cgroups_path)
        except CgroupPathError:
            if strict:
                raise
            return False
        if strict and not os.path.isdir(directory):
            self.forget(intent.cgroups_path)
            raise CgroupWriteError(directory, errno_mod.ENOENT, "no such cgroup directory")
        try:
            if self.read_effective_cpus(directory) != _intent_set(intent, "cpus", intent.cpus):
                return True
            if not intent.mems:
                return False
            return self.read_effective_mems(directory) != _intent_set(intent, "mems", intent.mems)
        except CgroupWriteError as exc:
            if exc.errno == errno_mod.ENOENT and not strict:
                self.forget(intent.cgroups_path)
                return False  # stopped meanwhile, or never created
            raise


def _intent_set(intent: ContainerIntent, what: str, text: str) -> CPUSet:
    try:
        value = CPUSet.parse(text)
    except CPUSetParseError as exc:
        raise CgroupIntentError(
            f"container {intent.container_id!r}: invalid {what}: {exc}"
        ) from exc
    if not value:
        raise CgroupIntentError(
            f"container {intent.container_id!r}: refusing to write an empty {what} set"
        )
    return value
