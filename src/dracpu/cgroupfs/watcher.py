"""The drift watcher: keep what the kernel enforces equal to what dracpu intends.

Every ``interval`` seconds (and soon after an inotify event in a watched cgroup directory,
where inotify is available) one check reads each known container's effective cpuset,
compares it with the intended one and asks the cgroupfs writer task to rewrite the drifted
ones (a ``DriftRepair``). It also walks the container roots for container cgroups no intent
knows about — created while the NRI session was down — and has them confined to the
shared pool, so an unknown container never runs on CPUs given exclusively to a claim.

The decisions are pure functions over what was read (``dracpu.cgroupfs.drift``); the
reading is synchronous (in a worker thread, through a ``CgroupReader`` of the watcher's
own) and the Trio loop around it is thin. The watcher never writes.

A check reads first and the writer writes last, and the state it read may have moved on
in between (a container created, the shared pool changed by a prepare). So the writer asks
the state owner again right before writing and writes only what is still wanted
(``intent_view.py``): a "drifted" container whose intent changed meanwhile is left for the
next check (the change that moved the intent pokes one), and a cgroup that looked unknown
but whose container the owner knows by now is not confined. Without that, a container
created during the walk was confined to the shared pool although it holds a claim. The
owner's view is asked on the Trio thread only, before the reading starts.
"""

from __future__ import annotations

import errno as errno_mod
import logging
import os
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec
import trio

from dracpu.cgroupfs.blocking_writer import CgroupReader, Results
from dracpu.cgroupfs.drift import DriftReport, container_id_of, find_drift, is_container_dir
from dracpu.cgroupfs.inotify import IN_IGNORED, Inotify, InotifyEvent, open_inotify
from dracpu.cgroupfs.intent_view import IntentView
from dracpu.cgroupfs.paths import CgroupPathError
from dracpu.cgroupfs.writer import CgroupWriteError, CgroupWriter, DriftRepair, RepairResults
from dracpu.cpuset import CPUSet, CPUSetParseError
from dracpu.messages import ContainerIntent
from dracpu.metrics import DriverMetrics
from dracpu.nursery.pulse import Pulse

__all__ = ["DriftWatcher", "WatcherState"]

log = logging.getLogger(__name__)

# Errors kept in a report for /debug/state; the counts stay exact beyond this.
_MAX_REPORTED_ERRORS = 20


class WatcherState(msgspec.Struct, frozen=True, kw_only=True):
    """The watcher's part of ``/debug/state``."""

    interval: float
    checks: int
    inotify: bool
    watched_dirs: int
    last_report: DriftReport | None


@dataclass(frozen=True)
class _Wording:
    """How the writes of one kind are reported: the container, a failure, a success
    (``str.format`` templates over the intent's fields), and the ``cause`` of
    ``dracpu_cgroup_fallback_writes_total`` (drift repairs are also counted in
    ``dracpu_cgroup_drift_repairs_total``; a pod sandbox is never drift)."""

    where: str
    failed: str
    done: str
    cause: str = "drift"


_REPAIR = _Wording(
    where="container {container_id}",
    failed="repair failed: ",
    done="repaired cpuset drift container_id={container_id} cpus={cpus}",
)
_CONFINE = _Wording(
    where="unknown container {cgroups_path}",
    failed="",
    done="confined unknown container cgroup={cgroups_path} cpus={cpus}",
)
_SANDBOX = _Wording(
    where="pod sandbox {container_id}",
    failed="",
    done="pod sandbox kept on the shared pool sandbox_id={container_id} cpus={cpus}",
    cause="sandbox",
)


def _say(template: str, intent: ContainerIntent) -> str:
    return template.format(
        container_id=intent.container_id, cgroups_path=intent.cgroups_path, cpus=intent.cpus
    )


@dataclass(frozen=True)
class _OwnerSaid:
    """What the state owner said before a check read: every intent, and the pool."""

    intents: list[ContainerIntent]
    pool: str


@dataclass
class _Findings:
    """What one check found to write, and what it read."""

    drifted: list[ContainerIntent]
    sandboxes: list[ContainerIntent]
    unknown: list[ContainerIntent]
    checked: int
    missing: int
    errors: list[str]


@dataclass
class _Reading:
    """What one check read of the known containers."""

    readable: list[ContainerIntent] = field(default_factory=list)
    effective: dict[str, CPUSet] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    missing: int = 0


class DriftWatcher:
    """Periodic and event-driven drift checks over the containers dracpu knows about.

    ``view`` is the state owner's read-only view: every container it knows with its
    intended cpuset (pod sandboxes the runtime reported are intents too, marked
    ``sandbox``), the shared pool, and whether it knows every container yet. The watcher
    asks it once per check, on the Trio thread, before reading; ``writer`` (the one
    cgroupfs writer task) asks it again before writing.
    """

    def __init__(
        self,
        writer: CgroupWriter,
        view: IntentView,
        *,
        interval: float = 10.0,
        metrics: DriverMetrics | None = None,
        container_roots: Sequence[str] = ("kubepods", "kubepods.slice"),
        use_inotify: bool = True,
        offload: bool = True,
        settle: float = 0.1,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"drift check interval must be positive, got {interval}")
        self.writer = writer
        self._view = view
        self._reader = CgroupReader(writer.cgroup_root)
        # One read at a time: an abandoned read (below) keeps the next from starting.
        self._one_thread = trio.CapacityLimiter(1)
        self._repairs = writer.inbox()
        self.interval = interval
        self.metrics = metrics
        self.container_roots = tuple(container_roots)
        self.use_inotify = use_inotify
        self.offload = offload
        self.settle = settle
        self.last_report: DriftReport | None = None
        self.checks = 0
        self._scanned_dirs: list[str] = []
        self._hierarchy_missing = False
        # Pokes (and inotify events) are counted fires; the loop waits past the last it saw.
        self._wakeup = Pulse()
        self._wakeups_seen = 0
        self._checking = False
        self._held_events: list[InotifyEvent] = []
        self._inotify_active = False
        self._watched_dirs = 0

    # -- one check ----------------------------------------------------------------------
    async def check(self) -> DriftReport:
        """Read, compare, have the writer repair: one full pass. Never raises for a bad
        container or tree (a writer that dropped the request is one error)."""
        # A pool change's pass on its way (the runtime applying it, the writer writing
        # what it did not) would look like drift everywhere: wait for it, bounded.
        if self.writer.pass_in_flight:
            with trio.move_on_after(self.interval):
                await self.writer.wait_no_pass()
        view = self._view
        pool = view.shared_pool.format()  # one instant with the intents: nothing awaits
        before = _OwnerSaid(intents=list(view.intents()), pool=pool)
        if self.offload:
            # Reads only: abandoned when the watcher is cancelled (at shutdown), so a hung
            # cgroupfs read never holds up the stop.
            found = await trio.to_thread.run_sync(
                self._look, before, abandon_on_cancel=True, limiter=self._one_thread
            )
        else:
            found = self._look(before)
        if isinstance(found, DriftReport):
            return self._finish(found)
        results = await self._ask_writer(found)
        errors = found.errors
        repaired = self._account(results.drifted, errors, _REPAIR)
        self._account(results.sandboxes, errors, _SANDBOX)
        confined = self._account(results.strangers, errors, _CONFINE)
        if found.drifted:
            log.info("cpuset drift: %d of %d containers drifted", len(found.drifted), found.checked)
        return self._finish(
            DriftReport(
                checked=found.checked,
                drifted=len(found.drifted),
                repaired=repaired,
                errors=len(errors),
                unknown_found=len(found.unknown),
                unknown_confined=confined,
                missing=found.missing,
                error_messages=tuple(errors[:_MAX_REPORTED_ERRORS]),
            )
        )

    async def _ask_writer(self, found: _Findings) -> RepairResults:
        if not (found.drifted or found.sandboxes or found.unknown):
            return RepairResults()
        reply_send, reply = trio.open_memory_channel[RepairResults](1)
        request = DriftRepair(
            drifted=found.drifted,
            sandboxes=found.sandboxes,
            strangers=found.unknown,
            reply=reply_send,
        )
        async with reply:
            await self._repairs.send(request)
            try:
                return await reply.receive()
            except trio.EndOfChannel:
                found.errors.append("the cgroupfs writer stopped before repairing")
                return RepairResults()

    def _look(self, before: _OwnerSaid) -> _Findings | DriftReport:
        """The reading half of a check (blocking): what drifted, what is unknown."""
        try:
            self._reader.layout  # noqa: B018 - detect once, so a bad root is one clear error
        except CgroupPathError as exc:
            # Said once (and at start-up by the daemon, with a metric); every check after
            # that only at debug level, until the hierarchy appears.
            if not self._hierarchy_missing:
                log.warning("drift check skipped: %s", exc)
            else:
                log.debug("drift check skipped: %s", exc)
            self._hierarchy_missing = True
            return DriftReport(errors=1, error_messages=(str(exc),))
        self._hierarchy_missing = False
        errors: list[str] = []
        known = self._read_known(before.intents, errors)
        off_intent = find_drift(known.readable, known.effective)
        return _Findings(
            drifted=[i for i in off_intent if not i.sandbox],
            sandboxes=[i for i in off_intent if i.sandbox],
            unknown=self._find_unknown(known.dirs, errors, before.pool),
            checked=len(known.readable),
            missing=known.missing,
            errors=errors,
        )

    def _read_known(self, intents: Iterable[ContainerIntent], errors: list[str]) -> _Reading:
        """Each known container's effective cpuset; a vanished cgroup is forgotten."""
        reading = _Reading()
        for intent in intents:
            try:
                directory = self._reader.directory_of(intent.cgroups_path)
                reading.dirs.add(directory)
                CPUSet.parse(intent.cpus)
                reading.effective[intent.container_id] = self._reader.read_effective_cpus(directory)
            except CgroupWriteError as exc:
                if exc.errno == errno_mod.ENOENT:
                    reading.missing += 1
                    self._reader.forget(intent.cgroups_path)
                else:
                    errors.append(f"container {intent.container_id}: {exc}")
                continue
            except (CgroupPathError, CPUSetParseError) as exc:
                errors.append(f"container {intent.container_id}: {exc}")
                continue
            reading.readable.append(intent)
        return reading

    def _finish(self, report: DriftReport) -> DriftReport:
        if self.metrics is not None:
            self.metrics.drifted_containers.set(report.drifted)
        self.last_report = report
        self.checks += 1
        return report

    def state(self) -> WatcherState:
        """What ``/debug/state`` shows for the watcher."""
        return WatcherState(
            interval=self.interval,
            checks=self.checks,
            inotify=self._inotify_active,
            watched_dirs=self._watched_dirs,
            last_report=self.last_report,
        )

    def _account(self, results: Results, errors: list[str], words: _Wording) -> int:
        """Count and log the writer's results for one kind of write (an outcome with no
        writes: the cgroup held the set by then, nothing to say); collect failures. Both
        drift repairs and the confinement of unknown containers count as repairs; pod
        sandboxes only under their own cause."""
        written = 0
        for intent, result in results:
            if isinstance(result, Exception):
                message = f"{_say(words.where, intent)}: {words.failed}{result}"
            elif not result.ok:
                message = f"{_say(words.where, intent)}: {result.describe_mismatch()}"
            elif not result.writes:
                continue
            else:
                written += 1
                log.info("%s", _say(words.done, intent))
                self._count(words, "success")
                continue
            errors.append(message)
            log.warning("%s", message)
            self._count(words, "error")
        return written

    def _count(self, words: _Wording, result: str) -> None:
        if self.metrics is not None:
            if words.cause == "drift":
                self.metrics.count_drift_repair(result)
            self.metrics.count_fallback_write(result, words.cause)

    def _find_unknown(
        self, known_dirs: set[str], errors: list[str], pool_text: str
    ) -> list[ContainerIntent]:
        """Container leaves nobody intends anything for whose cpus differ from the pool."""
        try:
            pool = CPUSet.parse(pool_text)
        except CPUSetParseError as exc:
            errors.append(f"shared pool: {exc}")
            return []
        hierarchy = self._reader.layout.hierarchy.rstrip("/")
        leaves: list[str] = []
        scanned: list[str] = []
        for root in self.container_roots:
            self._walk(f"{hierarchy}/{root}", known_dirs, leaves, scanned)
        # Known containers' own directories are watched too: that is where drift happens.
        self._scanned_dirs = scanned + sorted(known_dirs)
        unknown = []
        for directory in leaves:
            cid = container_id_of(posixpath.basename(directory))
            try:
                current = self._reader.read_effective_cpus(directory)
            except (CgroupWriteError, CPUSetParseError):
                continue  # removed while walking, or not a cpuset cgroup after all
            if current == pool:
                continue
            if not pool:
                errors.append(f"{directory}: unknown container not confined: shared pool is empty")
                continue
            unknown.append(
                ContainerIntent(
                    container_id=cid,
                    cgroups_path=directory[len(hierarchy) :],
                    cpus=pool_text,
                )
            )
        return unknown

    def _walk(self, top: str, known: set[str], leaves: list[str], scanned: list[str]) -> None:
        stack = [top]
        while stack:
            directory = stack.pop()
            try:
                with os.scandir(directory) as it:
                    subdirs = [e.path for e in it if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            scanned.append(directory)
            if not subdirs:
                parent, name = posixpath.split(directory)
                if directory not in known and is_container_dir(posixpath.basename(parent), name):
                    leaves.append(directory)
                continue
            # A known container's directory needs no walk: it is not new.
            stack.extend(d for d in subdirs if d not in known)

    # -- Trio side ----------------------------------------------------------------------
    def poke(self) -> None:
        """Ask for a check now (the NRI session went down, the shared pool changed...)."""
        self._wakeup.fire()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Check now, then every ``interval`` seconds or sooner when poked."""
        notify = open_inotify() if self.use_inotify else None
        try:
            async with trio.open_nursery() as nursery:
                if notify is not None:
                    self._inotify_active = True
                    nursery.start_soon(self._read_inotify, notify)
                task_status.started()
                while True:
                    self._checking = True
                    try:
                        await self.check()
                        if notify is not None:
                            self._after_check(notify)
                    finally:
                        self._checking = False
                    with trio.move_on_after(self.interval) as timer:
                        await self._wakeup.wait_past(self._wakeups_seen)
                    self._wakeups_seen = self._wakeup.fired
                    if not timer.cancelled_caught and self.settle > 0:
                        # Let a burst (mkdir, cpus, mems from one runc) land before looking.
                        await trio.sleep(self.settle)
        finally:
            self._inotify_active = False
            if notify is not None:
                notify.close()

    def _watch_scanned(self, notify: Inotify) -> None:
        was_exhausted = notify.exhausted
        notify.sync(self._scanned_dirs)
        if notify.exhausted and not was_exhausted:
            log.warning(
                "inotify watches exhausted after %d directories; relying on the %ss timer",
                notify.watched,
                self.interval,
            )

    def _after_check(self, notify: Inotify) -> None:
        events = self._held_events + notify.read_events()
        self._held_events = []
        foreign = self._foreign(notify, events)
        self._watch_scanned(notify)
        self._watched_dirs = notify.watched
        if foreign:
            self.poke()

    def _foreign(self, notify: Inotify, events: list[InotifyEvent]) -> list[InotifyEvent]:
        """Events in directories dracpu itself wrote (the writer task's repairs and passes)
        are echoes; any other (a write behind our back, a new cgroup) means look again."""
        ours = self.writer.take_written_dirs()
        return [
            ev for ev in events if not ev.mask & IN_IGNORED and notify.path_of(ev.wd) not in ours
        ]

    async def _read_inotify(self, notify: Inotify) -> None:
        while True:
            await trio.lowlevel.wait_readable(notify.fd)
            # A pass writing a thousand cgroups makes a thousand events: take them in one
            # read after the settle time rather than waking the Trio thread for each (the
            # worker thread writing them would wait for the interpreter every time).
            if self.settle > 0:
                await trio.sleep(self.settle)
            events = notify.read_events()
            if self._checking:
                self._held_events += events
            elif self._foreign(notify, events):
                self.poke()
