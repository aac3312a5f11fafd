"""``IrqIsolation``: the service that keeps device interrupts off banned CPUs.

It wakes on each message of the state owner's claim events (``ClaimPrepared`` and
``ClaimUnprepared``: a prepare or an unprepare committed) and reads the prepared claims
from the owner's read-only view; its first pass, at start, works from the claims the
checkpoint restored. The banned CPUs are the union of the CPUs of every prepared claim
that asked (``isolateIRQs`` in its allocation options) or of every prepared claim when the
node config says so (``isolateIRQs``). Each change is one pass (``plan.plan_pass``) in a
worker thread that a stop does not cut short (``nursery.threads.run_to_completion``: the
record and the masks go together), but waits for ``STOP_BOUND`` seconds at most, so a hung
/proc write cannot hold up the daemon's stop. A pass left to its thread then still writes
the record before any mask (step 3), so the next process's first pass puts
right what it did not do; passes take one worker thread at a time (a limiter held until
the thread really ends), so two never overlap:

1. read ``default_smp_affinity`` and every ``<N>/smp_affinity_list``; a file that cannot
   be read or holds what no kernel prints is reported and the pass writes nothing for it
   (an unreadable default ends the pass before anything is written);
2. plan (``plan.py``): dracpu owns only the masks that still read what it wrote; other
   writers' masks (irqbalance, the administrator) lose banned CPUs and nothing else, and
   are not given back; no mask is planned without an online CPU (the owner's
   ``NodeView.online``);
3. if a write changes a mask to something other than its original, write the record
   (``record.py``) with the originals and the masks about to be written first;
4. write the masks that differ from the wanted ones. A write the kernel refuses (managed
   interrupts: EIO, EPERM since Linux 6.12) is counted and not tried again by this
   process; an interrupt that vanished meanwhile is forgotten; a failed write leaves the
   mask dracpu's only if it was before;
5. write the record of what dracpu owns now (with nothing banned: what it could not give
   back yet).

While something is banned or owned a pass also runs every ``resync_interval`` (60 s),
clearing banned CPUs that another writer put back, and as soon as the online CPUs differ
from the last pass's (checked every ``online_interval``, 5 s: the owner publishes no
message for a hotplug change that leaves the shared pool as it was, and reading its view
costs nothing); a failed pass is retried after ``retry_interval``. Claims restored without
their options keep the ban the record gives their CPUs until they are unprepared
(``inherit``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import trio

from dracpu.allocation.store import ClaimRecord
from dracpu.cpuset import MAX_CPU_ID, CPUSet
from dracpu.irq.masks import HexMask
from dracpu.irq.metrics import IrqMetrics
from dracpu.irq.plan import plan_pass
from dracpu.irq.procfs import IrqFileError, IrqWriteError, ProcIrq
from dracpu.irq.record import IrqRecord, IrqRecordError, RecordFile
from dracpu.logs import get_logger
from dracpu.nursery.threads import run_to_completion

__all__ = ["IrqIsolation", "PassReport", "banned_cpus"]

log = get_logger("dracpu.irq")


def banned_cpus(claims: Iterable[ClaimRecord], *, isolate_all: bool) -> CPUSet:
    """The CPUs device interrupts must avoid while these claims are prepared."""
    mask = 0
    for claim in claims:
        if isolate_all or any(o.isolate_irqs for o in claim.options.values()):
            mask |= claim.cpus.mask
    return CPUSet.from_mask(mask)


def _remembers_more(
    originals: dict[int, CPUSet], default: HexMask | None, record: IrqRecord
) -> bool:
    """Whether a pass knows an original the record on disk does not hold."""
    if default is not None and record.default_original != default:
        return True
    return any(record.originals.get(irq) != cpus for irq, cpus in originals.items())


@dataclass(slots=True)
class PassReport:
    """What one pass did; ``unmoved`` lists interrupts still allowed on banned CPUs."""

    banned: CPUSet
    written: int = 0
    refused: list[int] = field(default_factory=list)
    would_empty: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)
    default_problem: str = ""

    def describe(self) -> dict[str, Any]:
        return {
            "bannedCPUs": self.banned.format(),
            "written": self.written,
            "refused": self.refused,
            "wouldEmpty": self.would_empty,
            "waitingForOnlineCPU": self.waiting,
            "errors": {str(k): v for k, v in sorted(self.errors.items())},
            **({"defaultAffinity": self.default_problem} if self.default_problem else {}),
        }


class ClaimsView(Protocol):
    """What the service reads of the owner: ``state.view.NodeView`` satisfies it. A read
    is an in-memory look at the owner's state, on the Trio thread."""

    def claims(self) -> Iterable[ClaimRecord]:
        """Every prepared claim."""
        ...

    @property
    def online(self) -> CPUSet:
        """The CPUs online now; empty when not known."""
        ...


class IrqIsolation:
    """Keeps ``/proc/irq`` masks off banned CPUs; the constructor does no I/O."""

    def __init__(
        self,
        proc_root: str,
        state_dir: str,
        *,
        boot_id: str,
        view: ClaimsView,
        isolate_all: bool = False,
        metrics: IrqMetrics | None = None,
        resync_interval: float = 60.0,
        retry_interval: float = 30.0,
        online_interval: float = 5.0,
    ) -> None:
        self.proc = ProcIrq(proc_root)
        self.record_file = RecordFile(state_dir)
        self.boot_id = boot_id
        self.view = view
        self.online_interval = online_interval
        self.isolate_all = isolate_all
        self.metrics = metrics
        self.resync_interval = resync_interval
        self.retry_interval = retry_interval
        self.record = IrqRecord(boot_id=boot_id)
        self.last: PassReport | None = None
        self.last_error = ""
        self.passes = 0
        # Interrupts the kernel refused to move: refused for their whole life.
        self._refused: set[int] = set()
        self._one_pass = trio.CapacityLimiter(1)
        # The online CPUs the last pass planned with (None: not known).
        self._online_seen: CPUSet | None = None
        # Claims restored without their options (the checkpoint was lost: restored from
        # the CDI specs or the running containers) whose CPUs the record says were banned:
        # UID -> those CPUs, kept banned until the claim is unprepared.
        self.inherited: dict[str, CPUSet] = {}

    # -- blocking halves (worker thread) ------------------------------------------------
    def load(self) -> None:
        """Read the record left by an earlier dracpu of this boot."""
        self.record, note = self.record_file.load(self.boot_id)
        if note:
            log.warning("interrupt affinity record dropped", note=note)
        elif not self.record.empty:
            log.info(
                "interrupt affinity record found",
                banned=self.record.banned.format(),
                interrupts=len(self.record.originals),
            )

    def _online_now(self) -> CPUSet | None:
        """The online CPUs, None when not known (an empty set: every CPU then counts as
        online)."""
        return self.view.online or None

    def apply(self, banned: CPUSet) -> PassReport:
        """One pass (blocking). Raises IrqFileError or IrqRecordError when it wrote nothing."""
        report = PassReport(banned=banned)
        record = self.record
        online = self._online_now()
        self._online_seen = online
        if not banned and record.empty:
            self._show(report)
            return report
        current_default = self.proc.read_default()
        listed = self.proc.irqs()
        current: dict[int, CPUSet] = {}
        for irq in listed:
            try:
                current[irq] = self.proc.read_affinity(irq)
            except IrqFileError as exc:
                report.errors[irq] = str(exc)
        plan = plan_pass(
            banned=banned,
            current=current,
            current_default=current_default,
            originals=record.originals,
            written=record.written,
            default_original=record.default_original,
            default_written=record.default_written,
            pending=record.pending,
            default_pending=record.default_pending,
            present=record.present,
            online=online,
        )
        originals = dict(plan.originals)
        written = dict(plan.written)
        for irq in report.errors:  # unreadable now: what dracpu owned stays owned
            if irq in record.originals:
                originals[irq] = record.originals[irq]
                written[irq] = record.written.get(irq, record.originals[irq])
        default_original, default_written = plan.default_original, plan.default_written
        present = CPUSet.from_mask(sum(1 << i for i in listed if i <= MAX_CPU_ID))
        # Every mask a write changes to something other than its original is on disk as
        # dracpu's (original and pending) before the write: a crash in between still knows
        # it. Giving masks back needs nothing first: a crash leaves them at their originals.
        merged = {**record.originals, **originals}
        merged_default = default_original or record.default_original
        if any(merged.get(i) != cpus for i, cpus in plan.writes.items()) or (
            plan.default_write is not None
            and (merged_default is None or merged_default.cpus != plan.default_write.cpus)
        ):
            self._save(
                replace(
                    record,
                    banned=banned,
                    originals=merged,
                    written={i: c for i, c in record.written.items() if i in merged},
                    pending=dict(plan.writes),
                    default_original=merged_default,
                    default_pending=plan.default_write,
                    present=present,
                )
            )
        if plan.default_would_empty:
            report.default_problem = "every CPU of the default affinity is banned: left as is"
        if plan.default_waiting:
            report.default_problem = "no CPU of the original default affinity is online: kept"
        if plan.default_write is not None:
            try:
                self.proc.write_default(plan.default_write)
                report.written += 1
                self._count("success")
            except IrqWriteError as exc:
                report.default_problem = str(exc)
                self._count("error")
                # Still what it was: dracpu's (with its original) only if it was before.
                mine = (record.default_written, record.default_pending)
                if record.default_original is not None and any(
                    m is not None and m.cpus == current_default.cpus for m in mine
                ):
                    default_original, default_written = record.default_original, current_default
                else:
                    default_original = default_written = None
        report.would_empty = list(plan.would_empty)
        report.waiting = list(plan.waiting)
        for irq, cpus in plan.writes.items():
            if irq in self._refused:
                report.refused.append(irq)
                self._unwritten(irq, banned, current[irq], record, originals, written)
                continue
            try:
                self.proc.write_affinity(irq, cpus)
            except IrqWriteError as exc:
                if exc.gone:
                    originals.pop(irq, None)
                    written.pop(irq, None)
                    continue
                if exc.refused:
                    self._refused.add(irq)
                    report.refused.append(irq)
                    self._count("refused")
                else:
                    report.errors[irq] = str(exc)
                    self._count("error")
                self._unwritten(irq, banned, current[irq], record, originals, written)
                if exc.refused and not banned:
                    originals.pop(irq, None)  # never given back by anyone: forgotten
                    written.pop(irq, None)
                continue
            report.written += 1
            self._count("success")
        # Refused interrupts left on banned CPUs: only those whose mask has banned CPUs.
        report.refused = [i for i in report.refused if current.get(i, CPUSet()) & banned]
        self._save(
            IrqRecord(
                boot_id=self.boot_id,
                banned=banned,
                default_original=default_original,
                originals=originals,
                written=written,
                default_written=default_written,
                present=present,
            )
        )
        self._show(report)
        return report

    @staticmethod
    def _unwritten(
        irq: int,
        banned: CPUSet,
        now: CPUSet,
        record: IrqRecord,
        originals: dict[int, CPUSet],
        written: dict[int, CPUSet],
    ) -> None:
        """A planned write did not happen: the mask is still ``now``. dracpu owns it (with
        the original it had) only if it owned it before the pass."""
        before = record.originals.get(irq)
        owned = before is not None and now in (record.written.get(irq), record.pending.get(irq))
        if not banned:
            if owned and before is not None:
                originals[irq], written[irq] = before, now  # given back at a later pass
            return
        if owned and before is not None:
            originals[irq], written[irq] = before, now
        else:
            originals.pop(irq, None)
            written.pop(irq, None)

    def _save(self, record: IrqRecord) -> None:
        """Write the record when it changed (atomically; IrqRecordError on failure)."""
        if record != self.record:
            self.record_file.save(record)
            self.record = record

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.count_write(result)

    def _show(self, report: PassReport) -> None:
        self.last = report
        self.passes += 1
        if self.metrics is not None:
            self.metrics.show(
                banned=len(report.banned),
                refused=len(report.refused),
                would_empty=len(report.would_empty),
                error=len(report.errors),
            )

    # -- the service ----------------------------------------------------------------------
    def inherit(self, claims: Iterable[ClaimRecord]) -> None:
        """At start, after ``load``: a claim restored without its options (the checkpoint
        was lost and the claims came back from the CDI specs or the running containers)
        cannot say whether it asked for ``isolateIRQs``. Those of its CPUs the record says
        were banned stay banned until it is unprepared, and the claim is named in a
        warning. (With the node setting ``isolateIRQs`` every claim is banned anyway.) A
        claim without options that got the CPUs of one unprepared just before a crash (the
        pass between them not run) is taken for such a claim too: its CPUs are kept free of
        interrupts until it is unprepared, an error on the safe side."""
        if self.isolate_all or not self.record.banned:
            return
        for claim in claims:
            if claim.options:
                continue
            kept = claim.cpus & self.record.banned
            if kept:
                self.inherited[claim.uid] = kept
                log.warning(
                    "claim restored without its allocation options: the interrupt ban of "
                    "its CPUs is kept until it is unprepared",
                    claim=f"{claim.namespace}/{claim.name}" if claim.name else claim.uid,
                    uid=claim.uid,
                    cpus=kept.format(),
                )

    def banned_now(self) -> CPUSet:
        """The CPUs banned now: the prepared claims' that ask, and those inherited."""
        claims = list(self.view.claims())
        if self.inherited:
            prepared = {c.uid for c in claims}
            self.inherited = {u: c for u, c in self.inherited.items() if u in prepared}
        mask = banned_cpus(claims, isolate_all=self.isolate_all).mask
        for cpus in self.inherited.values():
            mask |= cpus.mask
        return CPUSet.from_mask(mask)

    async def run(
        self,
        changes: trio.MemoryReceiveChannel[Any],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """A pass at start, after each change of the prepared claims, every
        ``resync_interval`` while something is banned or owned, ``retry_interval`` after
        one that failed, and when the online CPUs changed (CPU hotplug): the owner's
        online CPUs (``NodeView.online``, an in-memory read) are compared with the last
        pass's every ``online_interval`` while something is banned or owned. The channel
        ending stops the service."""
        # A read (a corrupt record is moved aside, whole): abandoned if a stop comes.
        await trio.to_thread.run_sync(self.load, abandon_on_cancel=True, limiter=self._one_pass)
        self.inherit(self.view.claims())
        # The first pass before ``started``: a restart has put the masks right (given back
        # what no prepared claim bans any more) before the kubelet can call.
        banned = self.banned_now()
        failed = not await self._pass(banned)
        task_status.started()
        while True:
            busy = bool(banned) or not self.record.empty
            if failed:
                due = trio.current_time() + self.retry_interval
            elif busy:
                due = trio.current_time() + self.resync_interval
            else:
                due = math.inf
            changed = False
            while not changed:
                poll = self.online_interval if busy else math.inf
                with trio.move_on_at(min(due, trio.current_time() + poll)):
                    try:
                        await changes.receive()
                    except trio.EndOfChannel:
                        return
                    changed = True
                    while True:  # one pass for every change queued meanwhile
                        try:
                            changes.receive_nowait()
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                if trio.current_time() >= due or self._online_now() != self._online_seen:
                    changed = True
            banned = self.banned_now()
            failed = not await self._pass(banned)

    async def _pass(self, banned: CPUSet) -> bool:
        try:
            report = await run_to_completion(self.apply, banned, limiter=self._one_pass)
        except (IrqFileError, IrqRecordError) as exc:
            self.last_error = str(exc)
            log.error("interrupt affinities not changed", err=exc, banned=banned.format())
            return False
        self.last_error = ""
        if report.refused or report.would_empty or report.errors or report.default_problem:
            log.warning(
                "some interrupts stay on banned CPUs",
                banned=banned.format(),
                refused=len(report.refused),
                wouldEmpty=len(report.would_empty),
                errors=len(report.errors),
                default=report.default_problem or None,
            )
        elif report.written:
            log.info(
                "interrupt affinities changed", v=2, banned=banned.format(), writes=report.written
            )
        return not report.errors and not report.default_problem.startswith("cannot")

    def describe(self) -> dict[str, Any]:
        """The ``irq`` part of ``/debug/state``."""
        return {
            "isolateAll": self.isolate_all,
            "bannedCPUs": self.record.banned.format(),
            "remembered": len(self.record.originals),
            # Claims restored without their options whose CPUs stay banned (``inherit``).
            "inheritedBans": {uid: cpus.format() for uid, cpus in sorted(self.inherited.items())},
            "passes": self.passes,
            "lastPass": self.last.describe() if self.last is not None else None,
            "lastError": self.last_error or None,
        }
