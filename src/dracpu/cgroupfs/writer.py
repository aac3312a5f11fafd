"""The raw cpuset writer: dracpu pins a container itself when the runtime could not.

A write is planned from what the tree holds now (pure: :func:`plan_cpuset_writes`) and then
carried out: on cgroup v1 a child's CPUs and memory nodes must lie within its parent's, so
ancestors that lack the target CPUs are widened first, top down, and the container's own
cgroup is written last (which is also the only place a set ever narrows: dracpu never
narrows a parent, so no sibling can be left outside it). After the write the effective set
is read back and a mismatch is reported rather than assumed away.

The synchronous core runs in a worker thread from the Trio side, shielded so a cancelled
caller cannot tear a write from its read-back. ``run_fallback`` consumes the NRI session's
``CpusetUpdateFailed`` messages.
"""

from __future__ import annotations

import errno as errno_mod
import logging
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec
import trio

from dracpu.cgroupfs.paths import CgroupLayout, CgroupPathError, detect_layout, resolve
from dracpu.cpuset import CPUSet, CPUSetParseError
from dracpu.messages import ContainerIntent, CpusetUpdateFailed
from dracpu.metrics import DriverMetrics

__all__ = [
    "CgroupIntentError",
    "CgroupWriteError",
    "CgroupWriter",
    "CpusetWrite",
    "WriteOutcome",
    "plan_cpuset_writes",
    "read_cgroup_file",
    "write_cgroup_file",
]

log = logging.getLogger(__name__)

CPUS_FILE = "cpuset.cpus"
MEMS_FILE = "cpuset.mems"
# Resolved container directories are cached; a node never runs anywhere near this many
# containers, so the bound only guards against slow growth from churn.
_PATH_CACHE_LIMIT = 16384


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


def _read_if_present(path: str) -> str | None:
    # Absent files are routine (fake trees have no effective files, pod levels no cpuset
    # files): answer None without building an exception on that path.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CgroupWriteError(path, exc.errno or errno_mod.EIO) from exc
    try:
        return os.read(fd, 65536).decode("ascii", "replace").strip()
    except OSError as exc:
        raise CgroupWriteError(path, exc.errno or errno_mod.EIO) from exc
    finally:
        os.close(fd)


def read_cgroup_file(path: str) -> str:
    """One cgroup file's content, stripped; OSError becomes :class:`CgroupWriteError`."""
    text = _read_if_present(path)
    if text is None:
        raise CgroupWriteError(path, errno_mod.ENOENT)
    return text


def write_cgroup_file(path: str, value: str) -> None:
    """Write ``value`` into an existing cgroup file in one write(2)."""
    # No O_CREAT: a missing file means a missing cgroup, which must be an error, and
    # O_NOFOLLOW keeps a planted symlink from redirecting the write.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise CgroupWriteError(path, exc.errno or errno_mod.EIO) from exc
    try:
        data = value.encode("ascii")
        os.write(fd, data)
        # cgroupfs parses each write on its own and reports size 0; a plain file (a fake
        # tree) keeps its old tail, cut here. Not O_TRUNC: ext4 turns truncate-then-write
        # into a synchronous block allocation, 100 times slower than the write.
        if os.fstat(fd).st_size > len(data):
            os.ftruncate(fd, len(data))
    except OSError as exc:
        raise CgroupWriteError(path, exc.errno or errno_mod.EIO) from exc
    finally:
        os.close(fd)


def _parse_set(path: str, text: str) -> CPUSet:
    try:
        return CPUSet.parse(text)
    except CPUSetParseError as exc:
        raise CgroupWriteError(path, errno_mod.EINVAL, f"unparsable content: {exc}") from exc


@dataclass(slots=True)
class _SetCache:
    """Ancestor sets read during one batch, updated as the batch widens them."""

    values: dict[str, CPUSet | None] = field(default_factory=dict)


class FallbackResult(msgspec.Struct, frozen=True, kw_only=True):
    """What the fallback did with one ``CpusetUpdateFailed`` (``apply_fallback``'s result,
    also sent to the optional ``results`` channel of ``run_fallback``)."""

    container_id: str
    cpus: str
    ok: bool
    error: str = ""


class CgroupWriter:
    """Writes containers' cpusets straight into cgroupfs.

    The constructor does no I/O; the layout is detected on first use (or passed in).
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
                if len(self._paths) >= _PATH_CACHE_LIMIT:
                    self._paths.clear()
                self._paths[cgroups_path] = directory
        return directory

    def forget(self, cgroups_path: str) -> None:
        """Drop a cached path whose directory is gone (any thread)."""
        with self._paths_lock:
            self._paths.pop(cgroups_path, None)

    def _read_effective(self, directory: str, effective_file: str, fallback: str) -> CPUSet:
        # Fake trees written like runc have no effective file: the configured set is then
        # the best available answer. On a real kernel the effective file always exists.
        path = f"{directory}/{effective_file}"
        text = _read_if_present(path)
        if text is None:
            path = f"{directory}/{fallback}"
            text = read_cgroup_file(path)
        return _parse_set(path, text)

    def read_effective_cpus(self, directory: str) -> CPUSet:
        """The CPUs the kernel enforces for a cgroup; errors name the file read."""
        return self._read_effective(directory, self.layout.effective_cpus_file, CPUS_FILE)

    def read_effective_mems(self, directory: str) -> CPUSet:
        return self._read_effective(directory, self.layout.effective_mems_file, MEMS_FILE)

    def _read_optional(self, path: str) -> CPUSet | None:
        text = _read_if_present(path)
        return None if text is None else _parse_set(path, text)

    # -- the write ----------------------------------------------------------------------
    def _ancestors(self, directory: str) -> list[str]:
        hierarchy = self.layout.hierarchy.rstrip("/")
        rel = directory[len(hierarchy) + 1 :].split("/")
        return [hierarchy + "/" + "/".join(rel[:i]) for i in range(1, len(rel))]

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
            write_cgroup_file(w.path, w.value)
            cache.values[w.path] = CPUSet.parse(w.value)

    def _write(self, intent: ContainerIntent, cache: _SetCache) -> WriteOutcome:
        cpus = _intent_set(intent, "cpus", intent.cpus)
        mems = _intent_set(intent, "mems", intent.mems) if intent.mems else None
        directory = self.directory_of(intent.cgroups_path)
        if not os.path.isdir(directory):
            self.forget(intent.cgroups_path)
            raise CgroupWriteError(directory, errno_mod.ENOENT, "no such cgroup directory")
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

    def write(self, intent: ContainerIntent) -> WriteOutcome:
        """Write one container's cpuset (and mems) and read the effective set back.

        Raises :class:`CgroupPathError`, :class:`CgroupWriteError` or
        :class:`CgroupIntentError`; a read-back mismatch is reported in the outcome.
        """
        with self._lock:
            return self._write(intent, _SetCache())

    def write_many(
        self, intents: Iterable[ContainerIntent], *, only_differing: bool = False
    ) -> list[tuple[ContainerIntent, WriteOutcome | Exception]]:
        """Write several containers, reading each shared ancestor once.

        With ``only_differing`` each container's effective set is read first and only
        those that enforce something else are written (and listed); a container whose
        cgroup is gone is skipped. One pass, one thread: the verifier's read-back.
        """
        cache = _SetCache()
        results: list[tuple[ContainerIntent, WriteOutcome | Exception]] = []
        # One lock for the batch: the cached ancestor sets stay true only while no other
        # write can change them.
        with self._lock:
            for intent in intents:
                try:
                    if only_differing and not self._differs(intent):
                        continue
                    results.append((intent, self._write(intent, cache)))
                except (CgroupPathError, CgroupWriteError, CgroupIntentError) as exc:
                    # A failed write may have left the cache describing a write that did
                    # not happen; drop it rather than plan the next one on a guess.
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

    # -- Trio side ----------------------------------------------------------------------
    async def write_async(self, intent: ContainerIntent) -> WriteOutcome:
        """:meth:`write` in a worker thread; the write and its read-back are not torn."""
        with trio.CancelScope(shield=True):
            outcome = await trio.to_thread.run_sync(self.write, intent)
        return outcome

    async def run_fallback(
        self,
        failed: trio.MemoryReceiveChannel[CpusetUpdateFailed],
        results: trio.MemorySendChannel[FallbackResult] | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Apply every update the runtime could not, until ``failed`` is closed."""
        task_status.started()
        async for message in failed:
            result = await self.apply_fallback(message)
            if results is not None:
                await results.send(result)

    async def apply_fallback(self, message: CpusetUpdateFailed) -> FallbackResult:
        intent = message.intent
        try:
            outcome = await self.write_async(intent)
        except (CgroupPathError, CgroupWriteError, CgroupIntentError) as exc:
            error = str(exc)
        else:
            error = "" if outcome.ok else outcome.describe_mismatch()
        ok = not error
        if self.metrics is not None:
            self.metrics.count_fallback_write("success" if ok else "error", "runtime-reported")
        if ok:
            log.info(
                "fallback cpuset write container_id=%s cpus=%s reason=%s",
                intent.container_id,
                intent.cpus,
                message.reason,
            )
        else:
            log.warning(
                "fallback cpuset write failed container_id=%s cpus=%s reason=%s: %s",
                intent.container_id,
                intent.cpus,
                message.reason,
                error,
            )
        return FallbackResult(
            container_id=intent.container_id, cpus=intent.cpus, ok=ok, error=error
        )


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
