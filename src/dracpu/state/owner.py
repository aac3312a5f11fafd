"""``NodeState``: the one owner of claims, claim owners, containers and the shared pool.

Nothing else changes them. The kubelet service and the NRI plugin call the methods below;
none of them awaits, so each change happens inside one critical section of the Trio thread
and nobody sees half of it. What changed goes out as messages (``dracpu.messages``):

- ``ClaimsChanged`` to the checkpoint writer, on every change of the claims to keep;
- ``SharedPoolChanged`` to the pool pusher, when a claim enters or leaves the prepared set.

A prepare makes its claim *pending* (CPUs kept from everyone else, invisible to NRI), waits
in ``make_durable`` for the CDI spec and the checkpoint to be on disk, and only then commits
it: a container can never be pinned to CPUs that a failed prepare takes back. An unprepare
keeps the claim prepared until the checkpoint without it is on disk, so a failed write
leaves everything as it was.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from dracpu.allocation.prepare import ClaimPlan, PrepareError
from dracpu.allocation.store import (
    AllocationStore,
    ClaimRecord,
    ClaimTracker,
    ContainerRecord,
    ContainerState,
    SandboxRecord,
    StoreError,
)
from dracpu.cpuset import CPUSet
from dracpu.messages import CheckpointWritten, ClaimsChanged, SharedPoolChanged
from dracpu.metrics import DriverMetrics

__all__ = ["NodeState", "StateFileError"]


def _now() -> float:
    # The Trio clock (MockClock in tests); 0 outside a Trio run (plain unit tests).
    try:
        return trio.current_time()
    except RuntimeError:
        return 0.0


class StateFileError(Exception):
    """The checkpoint could not be written; the message names the file and the OS error."""


class NodeState:
    """The three stores of behavior.md §12 and the channels that report their changes.

    ``store``, ``tracker`` and ``containers`` are public for reading; every change goes
    through a method of this class. ``mems_of`` maps CPUs to the NUMA nodes holding them
    (memory alignment); it is None when alignment is off.
    """

    def __init__(
        self,
        store: AllocationStore,
        *,
        metrics: DriverMetrics | None = None,
        mems_of: Callable[[CPUSet], str] | None = None,
    ) -> None:
        self.store = store
        self.tracker = ClaimTracker()
        self.containers = ContainerState()
        # Pod sandboxes by sandbox id (RunPodSandbox, Synchronize's pods): kept on the
        # shared pool by the cgroupfs writer.
        self.sandboxes: dict[str, SandboxRecord] = {}
        self.metrics = metrics
        self.mems_of = mems_of
        # Until the runtime's first Synchronize the containers already running are unknown:
        # the drift watcher must not take them for strangers.
        self.has_synchronized = False
        self.generation = 0
        self.writer_running = False
        self._claims_out: trio.MemorySendChannel[ClaimsChanged] | None = None
        self._pool_out: trio.MemorySendChannel[SharedPoolChanged] | None = None
        self.refresh_gauges()

    # -- channels -------------------------------------------------------------------------
    def claims_changes(self) -> trio.MemoryReceiveChannel[ClaimsChanged]:
        """The checkpoint writer's inbox. Until one is opened changes are memory-only."""
        send, receive = trio.open_memory_channel[ClaimsChanged](math.inf)
        self._claims_out = send
        return receive

    def pool_changes(self) -> trio.MemoryReceiveChannel[SharedPoolChanged]:
        """The pool pusher's inbox (unbounded: the pusher acts on the newest message)."""
        send, receive = trio.open_memory_channel[SharedPoolChanged](math.inf)
        self._pool_out = send
        return receive

    def _publish_pool(self) -> None:
        if self._pool_out is not None:
            self._pool_out.send_nowait(
                SharedPoolChanged(cpus=self.store.shared_pool.format(), at=_now())
            )

    def _publish_claims(
        self, reason: str, reply: trio.MemorySendChannel[CheckpointWritten] | None = None
    ) -> None:
        self.generation += 1
        if self._claims_out is not None:
            self._claims_out.send_nowait(
                ClaimsChanged(generation=self.generation, reason=reason, reply=reply)
            )

    def refresh_gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.show_store(self.store.snapshot())

    async def make_durable(self, reason: str) -> None:
        """Wait until the checkpoint holds the current claims (pending ones included).

        Raises ``StateFileError`` when it cannot be written or no writer runs. Without a
        checkpoint writer (tests, benchmarks) the state is memory-only and this returns.
        """
        if self._claims_out is None:
            return
        if not self.writer_running:
            raise StateFileError("the checkpoint writer is not running")
        send, receive = trio.open_memory_channel[CheckpointWritten](1)
        self._publish_claims(reason, send)
        async with receive:
            written = await receive.receive()
        if written.error:
            raise StateFileError(written.error)

    # -- queries ----------------------------------------------------------------------------
    @property
    def shared_pool(self) -> CPUSet:
        return self.store.shared_pool

    def claims_cpus(self, claim_uids: Sequence[str]) -> CPUSet:
        """The union of the prepared CPUs of these claims (unknown ones add nothing)."""
        if len(claim_uids) == 1:  # the usual holder: one claim, no union to build
            return self.store.cpus_of(claim_uids[0]) or CPUSet()
        cpus = CPUSet()
        for uid in claim_uids:
            held = self.store.cpus_of(uid)
            if held is not None:
                cpus |= held
        return cpus

    def describe(self) -> dict[str, Any]:
        """The allocation part of ``/debug/state``: reserved CPUs, pool, claims and owners."""
        store = self.store
        owners = self.tracker.owners()
        return {
            "reserved": store.reserved.format(),
            "isolated": store.isolated.format(),
            "sharedFloor": store.floor.format(),
            "sharedPool": store.shared_pool.format(),
            "claims": [
                {
                    "uid": r.uid,
                    "namespace": r.namespace,
                    "name": r.name,
                    "cpus": r.cpus.format(),
                    "owner": (
                        {"podUID": owners[r.uid].pod_uid, "container": owners[r.uid].container_name}
                        if r.uid in owners
                        else None
                    ),
                }
                for r in sorted(store.records(), key=lambda r: r.uid)
            ],
        }

    def follows_pool(self, claim_uids: Sequence[str]) -> bool:
        """Whether a claim holder also runs on the shared pool (``sharedPoolAccess``)."""
        for uid in claim_uids:
            record = self.store.get(uid)
            if record is not None and record.shared_pool_access:
                return True
        return False

    def holder_cpus(self, claim_uids: Sequence[str]) -> CPUSet:
        """A claim holder's whole cpuset: its claims' CPUs, plus the shared pool when one
        of them asked for ``sharedPoolAccess``."""
        cpus = self.claims_cpus(claim_uids)
        if self.follows_pool(claim_uids):
            cpus |= self.store.shared_pool
        return cpus

    def mems(self, cpus: CPUSet) -> str:
        return self.mems_of(cpus) if self.mems_of is not None and cpus else ""

    # -- the kubelet's changes ------------------------------------------------------------
    def begin_prepare(self, plan: ClaimPlan) -> bool:
        """Keep a plan's CPUs from every other claim, not yet visible. True when new."""
        if plan.already_prepared or plan.is_empty:
            return False
        try:
            return self.store.reserve(plan.record, pending=True)
        except StoreError as exc:
            raise PrepareError(str(exc)) from None

    def finish_prepare(self, plan: ClaimPlan) -> None:
        """The claim's spec and checkpoint are on disk: it is prepared for everyone now."""
        if self.store.commit(plan.claim_uid) is not None:
            self.refresh_gauges()
            self._publish_pool()

    def abort_prepare(self, plan: ClaimPlan) -> None:
        """The prepare failed before anyone saw the claim; the next checkpoint drops it."""
        self.store.discard(plan.claim_uid)

    def begin_unprepare(self, claim_uid: str) -> ClaimRecord | None:
        """Leave the claim out of the next checkpoint; it stays prepared until finished."""
        return self.store.begin_release(claim_uid)

    def finish_unprepare(self, claim_uid: str) -> None:
        self.store.release(claim_uid)
        self.tracker.release([claim_uid])
        self.refresh_gauges()
        self._publish_pool()

    def abort_unprepare(self, claim_uid: str) -> None:
        self.store.cancel_release(claim_uid)

    def set_offline(self, cpus: CPUSet) -> None:
        """CPU hotplug: the allocatable CPUs offline now. Claims keep theirs; the shared
        pool loses (or gets back) the rest."""
        if self.store.set_offline(cpus):
            self.refresh_gauges()
            self._publish_pool()

    def restore(self, records: Sequence[ClaimRecord]) -> None:
        """Start-up: claims from the checkpoint or the CDI specs (already checked)."""
        for record in records:
            self.store.reserve(record)
        self.refresh_gauges()

    # -- the runtime's changes ------------------------------------------------------------
    def bind(self, pod_uid: str, name: str, claim_uids: Sequence[str]) -> list[str]:
        """Bind claims to a container (raises ``OwnerError``); returns the newly bound."""
        return self.tracker.set_owner(pod_uid, name, claim_uids)

    def unbind(self, claim_uids: Sequence[str]) -> None:
        self.tracker.release(claim_uids)

    def put_container(self, record: ContainerRecord) -> ContainerRecord | None:
        """Record a created container; returns the one of the same (pod, name) it replaces."""
        return self.containers.set(record)

    def drop_container(self, pod_uid: str, name: str, container_id: str) -> ContainerRecord | None:
        """Forget a stopped or removed container; None for a stale or unknown event."""
        return self.containers.remove(pod_uid, name, container_id)

    def put_sandbox(self, record: SandboxRecord) -> None:
        """A pod sandbox runs (RunPodSandbox)."""
        self.sandboxes[record.sandbox_id] = record

    def drop_sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        """A pod sandbox stopped or was removed; None when it was not known."""
        return self.sandboxes.pop(sandbox_id, None)

    def synchronized(
        self,
        adopted: Mapping[str, CPUSet],
        owners: ClaimTracker,
        records: Sequence[ContainerRecord],
        sandboxes: Sequence[SandboxRecord] = (),
    ) -> None:
        """Take the runtime's view from Synchronize: claims adopted from running containers
        (checked by the caller against the free CPUs), every claim owner, container and pod
        sandbox."""
        for uid, cpus in adopted.items():
            self.store.reserve(ClaimRecord(uid=uid, cpus=cpus))
        self.tracker.release(list(self.tracker.owners()))
        by_owner: dict[tuple[str, str], list[str]] = {}
        for uid, owner in owners.owners().items():
            by_owner.setdefault((owner.pod_uid, owner.container_name), []).append(uid)
        for (pod_uid, name), uids in by_owner.items():
            self.tracker.set_owner(pod_uid, name, uids)
        for old in list(self.containers):
            self.containers.remove(old.pod_uid, old.name, old.container_id)
        for record in records:
            self.containers.set(record)
        self.sandboxes = {s.sandbox_id: s for s in sandboxes}
        self.has_synchronized = True
        if adopted:
            self.refresh_gauges()
            self._publish_claims("synchronize")
            self._publish_pool()
