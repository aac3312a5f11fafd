"""The cpuset writer's blocking core: carry a container's write out and read it back.

Each write is planned (``plan.py``) from what the tree holds now, ancestors widened first,
and after it the effective set is read back, so that a mismatch is reported rather than
assumed away. Everything here blocks and may run in any thread: ``CgroupWriter``
(``writer.py``) calls it from Trio in a worker thread, the watcher and the verifier in
theirs.
"""

from __future__ import annotations

import errno as errno_mod
import os
import threading
from collections.abc import Callable, Iterable
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

__all__ = ["BlockingCgroupWriter"]

# Resolved container directories are cached; a node never runs anywhere near this many
# containers, so the bound only guards against slow growth from churn.
_PATH_CACHE_LIMIT = 16384


@dataclass(slots=True)
class _SetCache:
    """Ancestor sets read during one batch, updated as the batch widens them."""

    values: dict[str, CPUSet | None] = field(default_factory=dict)


class BlockingCgroupWriter:
    """Writes containers' cpusets straight into cgroupfs, blocking the calling thread.

    The constructor does no I/O; the layout is detected on first use (or passed in).
    ``CgroupWriter`` adds the Trio side.
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
        # cgroups path -> directory. Resolved in worker threads (the fallback loop and the
        # watcher both write from them), so the cache has a lock of its own; it is bounded,
        # and forgets a path whose directory has gone.
        self._paths: dict[str, str] = {}
        self._paths_lock = threading.Lock()
        # The fallback loop and the watcher write from worker threads; a parent's widening
        # is read-modify-write, so two writes must not interleave.
        self._lock = threading.Lock()
        # Directories any writer of this process wrote since the drift watcher last took
        # them: inotify reports dracpu's own writes too, and those are no news to it. A
        # lock of its own, so taking them never waits for a pass in flight.
        self._written: dict[str, None] = {}
        self._written_lock = threading.Lock()
        self._no_effective: dict[str, None] = {}
        self._ancestor_lists: dict[str, list[str]] = {}

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
        with self._paths_lock:
            directory = self._paths.get(cgroups_path)
        if directory is None:
            directory = resolve(self.layout, cgroups_path)
            with self._paths_lock:
                remember(self._paths, cgroups_path, directory, _PATH_CACHE_LIMIT)
        return directory

    def forget(self, cgroups_path: str) -> None:
        """Drop a cached path whose directory is gone (any thread)."""
        with self._paths_lock:
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
        with self._paths_lock:
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

    # -- the write ----------------------------------------------------------------------
    def _ancestors(self, directory: str) -> list[str]:
        # The same few pod and QoS levels for every container: computed once per directory
        # (bounded like the path cache; called under the writer's lock).
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
            with self._written_lock:  # bounded: nobody takes them when no watcher runs
                remember(self._written, w.directory, None, _PATH_CACHE_LIMIT)
            write_cgroup_file(w.path, w.value)
            cache.values[w.path] = CPUSet.parse(w.value)

    def take_written_dirs(self) -> set[str]:
        """The directories written since the last call (any thread, never waits for a
        write in progress)."""
        with self._written_lock:
            written, self._written = self._written, {}
        return set(written)

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
        # ``just_read``: the pass read this cgroup a moment ago, under the same hold of
        # the lock; a cgroup removed since then fails the write itself with ENOENT.
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
        it already holds the intent (another writer got there first: an outcome with no
        writes). Raises :class:`CgroupPathError`, :class:`CgroupWriteError` or
        :class:`CgroupIntentError`; a read-back mismatch is reported in the outcome.
        """
        with self._lock:
            return self._write(intent, _SetCache(), only_if_differs=only_if_differs)

    def write_many(
        self, intents: Iterable[ContainerIntent], *, only_if_differs: bool = False
    ) -> list[tuple[ContainerIntent, WriteOutcome | Exception]]:
        """Write several containers, reading each shared ancestor once (``only_if_differs``
        as for :meth:`write`)."""
        with self._lock:
            return self._write_all(intents, only_if_differs=only_if_differs)

    def write_differing(
        self,
        intents: Iterable[ContainerIntent],
        still_wanted: Callable[[list[ContainerIntent]], list[ContainerIntent]],
        *,
        chunk: int = 128,
    ) -> list[tuple[ContainerIntent, WriteOutcome | Exception]]:
        """One pass of reads and writes: read each container's effective set back and,
        every ``chunk`` containers that differ (and at the end), ask ``still_wanted``
        which of them are still intended (the state owner, asked at that moment, after
        the read-back: a newer set the runtime applied meanwhile is read back as
        "differs" and must not be overwritten with the older one), and write those. All
        under one hold of the lock, so no other writer of this process writes a cgroup
        twice for one change, and a writer that waited for the pass reads what it wrote.
        Containers whose cgroup is gone are skipped; a cgroup that cannot be read is
        listed with its error."""
        results: list[tuple[ContainerIntent, WriteOutcome | Exception]] = []
        differing: list[ContainerIntent] = []
        with self._lock:
            for intent in intents:
                try:
                    if self._differs(intent):
                        differing.append(intent)
                except (CgroupWriteError, CgroupIntentError) as exc:
                    results.append((intent, exc))
                if len(differing) >= chunk:
                    results += self._write_all(still_wanted(differing), just_read=True)
                    differing = []
            if differing:
                results += self._write_all(still_wanted(differing), just_read=True)
        return results

    def _write_all(
        self,
        intents: Iterable[ContainerIntent],
        *,
        only_if_differs: bool = False,
        just_read: bool = False,
    ) -> list[tuple[ContainerIntent, WriteOutcome | Exception]]:
        # Under the lock, held for the batch: the cached ancestor sets stay true only
        # while no other write can change them.
        cache = _SetCache()
        results: list[tuple[ContainerIntent, WriteOutcome | Exception]] = []
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

    def _differs(self, intent: ContainerIntent) -> bool:
        """Whether the container's cgroup enforces other CPUs (or memory nodes) than the
        intent; False when the cgroup is gone or cannot be found (no hierarchy: warned at
        start; nothing to write into)."""
        try:
            directory = self.directory_of(intent.cgroups_path)
        except CgroupPathError:
            return False
        try:
            if self.read_effective_cpus(directory) != _intent_set(intent, "cpus", intent.cpus):
                return True
            if not intent.mems:
                return False
            return self.read_effective_mems(directory) != _intent_set(intent, "mems", intent.mems)
        except CgroupWriteError as exc:
            if exc.errno == errno_mod.ENOENT:
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
