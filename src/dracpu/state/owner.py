"""``NodeState``: the one owner of claims, claim owners, containers and the shared pool.

Nothing else changes them, and nothing outside ``dracpu.state`` reads them except through
``NodeState.view`` (``state.view.NodeView``). The owner runs whole transactions:

- ``prepare`` and ``unprepare`` (the kubelet's calls), with the spec file I/O and the
  call ordering injected as ``ClaimSteps`` by the kubelet service;
- ``admit`` (the runtime's CreateContainer: bind the claims, validate the env's CPUs,
  record the container, all or nothing);
- ``apply_topology`` (a CPU hotplug change: what prepare plans with, and the offline CPUs).

Every step of the Trio thread between two awaits is one critical section, so nobody sees
half a change. What changed goes out as messages (``dracpu.messages``):

- ``ClaimsChanged`` to the checkpoint writer, on every change of the claims to keep;
- ``SharedPoolChanged`` to the pool pusher, when a claim enters or leaves the prepared set;
- ``ClaimPrepared`` / ``ClaimUnprepared`` to whoever subscribed (``claim_events``), once a
  prepare or an unprepare committed.

A prepare makes its claim *pending* (CPUs kept from everyone else, invisible to NRI), waits
in ``make_durable`` for the CDI spec and the checkpoint to be on disk, and only then commits
it: a container can never be pinned to CPUs that a failed prepare takes back. An unprepare
keeps the claim prepared until the checkpoint without it is on disk, so a failed write
leaves everything as it was.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import msgspec
import trio

from dracpu.allocation.prepare import (
    ClaimAllocation,
    ClaimPlan,
    DeviceNames,
    PrepareError,
)
from dracpu.allocation.store import (
    AllocationStore,
    ClaimRecord,
    ClaimTracker,
    ContainerRecord,
    ContainerState,
    SandboxRecord,
    StateError,
    StoreError,
)
from dracpu.cpuset import CPUSet
from dracpu.messages import (
    CheckpointWritten,
    ClaimEvent,
    ClaimPrepared,
    ClaimsChanged,
    ClaimsChangeReason,
    SharedPoolChanged,
)
from dracpu.metrics import DriverMetrics
from dracpu.state import claims as claim_transactions
from dracpu.state import events
from dracpu.state.steps import (
    WRITER_NOT_RUNNING,
    AdmissionError,
    CheckpointOutcomeUnknown,
    ClaimSteps,
    CreateDecision,
    PrepareOutcome,
    StateFileError,
    UnprepareOutcome,
)
from dracpu.state.view import EMPTY_SHARED_POOL, NodeView
from dracpu.topology.model import Topology

__all__ = [
    "AdmissionError",
    "ClaimSteps",
    "CreateDecision",
    "NodeState",
    "PrepareOutcome",
    "StateFileError",
    "UnprepareOutcome",
]


def _now() -> float:
    # The Trio clock (MockClock in tests); 0 outside a Trio run (plain unit tests).
    try:
        return trio.current_time()
    except RuntimeError:
        return 0.0


class NodeState:
    """The three stores of behavior.md §12, what prepare plans with, and the channels that
    report their changes.

    The stores (``_store``, ``_tracker``, ``_containers``, ``_sandboxes``) and the steps
    of the transactions (``_begin_prepare`` ...) are private to ``dracpu.state``: everyone
    else, tests and benchmarks included, reads through ``view`` and changes things through
    the transactions below (tests/state/test_owner_boundary.py checks it). ``mems_of``
    maps CPUs to the NUMA nodes holding them (memory alignment); None when alignment is
    off.
    """

    def __init__(
        self,
        store: AllocationStore,
        *,
        metrics: DriverMetrics | None = None,
        mems_of: Callable[[CPUSet], str] | None = None,
    ) -> None:
        self._store = store
        self._tracker = ClaimTracker()
        self._containers = ContainerState()
        # Pod sandboxes by sandbox id (RunPodSandbox, Synchronize's pods): kept on the
        # shared pool by the cgroupfs writer.
        self._sandboxes: dict[str, SandboxRecord] = {}
        self.metrics = metrics
        self.mems_of = mems_of
        self.view = NodeView(self)
        # What prepare plans with (``use_topology``, ``apply_topology``); the online CPUs
        # have this one holder.
        self.topology: Topology | None = None
        self.inventory: DeviceNames | None = None
        self.online = CPUSet()
        # Until the runtime's first Synchronize the containers already running are unknown:
        # the drift watcher must not take them for strangers.
        self.has_synchronized = False
        self.generation = 0
        # Set only by ``checkpoint_writer()``, the writer task's context.
        self._writer_running = False
        self._claims_out: trio.MemorySendChannel[ClaimsChanged] | None = None
        self._pool_out: trio.MemorySendChannel[SharedPoolChanged] | None = None
        # Each claim events subscriber, and whether it hears repeated prepares too.
        self._events_out: dict[trio.MemorySendChannel[ClaimEvent], bool] = {}
        # Set by ``close_channels``: the owner publishes nothing more, ever.
        self._closed = False
        self.refresh_gauges()

    # -- channels -------------------------------------------------------------------------
    def claims_changes(self) -> trio.MemoryReceiveChannel[ClaimsChanged]:
        """The checkpoint writer's inbox. Until one is opened changes are memory-only.

        Unbounded: a change is published from a step that must not await (it is part of a
        transaction), and the queue is bounded by the prepares and unprepares in flight,
        each of which waits for its write; the writer takes all queued ones per write.
        """
        send, receive = trio.open_memory_channel[ClaimsChanged](math.inf)
        if self._closed:
            send.close()
        else:
            self._claims_out = send
        return receive

    def pool_changes(self) -> trio.MemoryReceiveChannel[SharedPoolChanged]:
        """The pool pusher's inbox.

        Unbounded: published from inside a transaction (no await allowed), and the pusher
        drains it and acts on the newest message only, so a backlog costs one push.
        """
        send, receive = trio.open_memory_channel[SharedPoolChanged](math.inf)
        if self._closed:
            send.close()
        else:
            self._pool_out = send
        return receive

    def claim_events(
        self, *, repeated_prepares: bool = False
    ) -> trio.MemoryReceiveChannel[ClaimEvent]:
        """A new subscriber's inbox of ``ClaimPrepared`` and ``ClaimUnprepared``, one per
        committed prepare or unprepare. A repeated prepare of a prepared claim changes
        nothing and is heard only with ``repeated_prepares`` (``ClaimPrepared.repeated``):
        the claim status writer says it again, as a restarted dracpu knows no better.

        Unbounded: sent from the commit step, which must not await; a subscriber that
        falls behind holds one small message per kubelet call. A subscriber that closes
        its end is dropped at the next event.
        """
        send, receive = trio.open_memory_channel[ClaimEvent](math.inf)
        if self._closed:
            send.close()
        else:
            self._events_out[send] = repeated_prepares
        return receive

    def close_channels(self) -> None:
        """The owner stops publishing: every receiver's loop ends once it drained its
        inbox (``EndOfChannel``), and an inbox opened later is already ended. From then
        on ``make_durable`` refuses (nothing would write the checkpoint), so a prepare
        that still ran could not commit. Safe to call again."""
        self._closed = True
        for out in (self._claims_out, self._pool_out, *self._events_out):
            if out is not None:
                out.close()
        self._claims_out = self._pool_out = None
        self._events_out = {}

    async def publishing(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The owner's publishing lifetime as a service: started once the state is
        restored, it ends (``close_channels``) when the daemon stops it. The supervisor
        stops services last started first, so started after the checkpoint writer and
        before the services that change the state (kubelet, NRI, hotplug), it closes the
        channels once those stopped and before the writer is stopped: the writer answers
        what is queued and ends on its own, and any other subscriber's loop ends too."""
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            self.close_channels()

    def _publish_pool(self) -> None:
        if self._pool_out is not None:
            self._pool_out.send_nowait(
                SharedPoolChanged(cpus=self._store.shared_pool.format(), at=_now())
            )

    def _publish_claims(
        self,
        reason: ClaimsChangeReason,
        reply: trio.MemorySendChannel[CheckpointWritten] | None = None,
    ) -> None:
        self.generation += 1
        if self._claims_out is not None:
            self._claims_out.send_nowait(
                ClaimsChanged(generation=self.generation, reason=reason, reply=reply)
            )

    def _publish_event(self, event: ClaimEvent) -> None:
        repeated = isinstance(event, ClaimPrepared) and event.repeated
        kept = {}
        for out, repeats in self._events_out.items():
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                if repeats or not repeated:
                    out.send_nowait(event)
                kept[out] = repeats
        self._events_out = kept

    def refresh_gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.show_store(self._store.snapshot())

    # -- durability -----------------------------------------------------------------------
    @property
    def writer_running(self) -> bool:
        """Whether a checkpoint writer takes ``ClaimsChanged`` now."""
        return self._writer_running

    @contextlib.contextmanager
    def checkpoint_writer(self) -> Iterator[None]:
        """The checkpoint writer task runs inside this: ``make_durable`` waits for it while
        it is inside, and fails at once outside. The writer answers every queued change
        before it leaves (no await in between), so no waiter is ever left behind."""
        self._writer_running = True
        try:
            yield
        finally:
            self._writer_running = False

    async def make_durable(self, reason: ClaimsChangeReason) -> None:
        """Wait until the checkpoint holds the current claims (pending ones included).

        Raises ``StateFileError`` when it cannot be written or no writer runs (also once
        the channels are closed at a stop: the same words as before they could be closed),
        and ``CheckpointOutcomeUnknown`` when a stop left the write in its thread. Without
        a checkpoint writer (tests, benchmarks) the state is memory-only and this returns.
        """
        if self._closed or (self._claims_out is not None and not self._writer_running):
            raise StateFileError(WRITER_NOT_RUNNING)
        if self._claims_out is None:
            return
        send, receive = trio.open_memory_channel[CheckpointWritten](1)
        self._publish_claims(reason, send)
        async with receive:
            try:
                written = await receive.receive()
            except trio.EndOfChannel:
                # The writer closed the reply unanswered: nothing says the write happened,
                # so the caller must undo as for a failed one.
                raise StateFileError(
                    "the checkpoint writer ended without answering: not written"
                ) from None
        if written.outcome_unknown:
            raise CheckpointOutcomeUnknown(written.error)
        if written.error:
            raise StateFileError(written.error)

    # -- queries (the rest is ``view``) --------------------------------------------------
    @property
    def shared_pool(self) -> CPUSet:
        return self._store.shared_pool

    def describe(self) -> dict[str, Any]:
        """The allocation part of ``/debug/state`` (``NodeView.describe``)."""
        return self.view.describe()

    # -- topology -------------------------------------------------------------------------
    def use_topology(self, topology: Topology, inventory: DeviceNames, online: CPUSet) -> None:
        """Plan prepares with this topology, these devices and online CPUs from now on.
        Planning does not await, so a prepare plans wholly with the old or the new."""
        self.topology, self.inventory, self.online = topology, inventory, online

    def apply_topology(self, topology: Topology, inventory: DeviceNames) -> None:
        """A CPU hotplug change: plan with the new topology, and the allocatable CPUs that
        are offline now leave the shared pool (claims keep theirs; ``SharedPoolChanged``)."""
        self.use_topology(topology, inventory, topology.online)
        self.set_offline(topology.present - topology.online)

    def set_offline(self, cpus: CPUSet) -> None:
        """The allocatable CPUs offline now. Claims keep theirs; the shared pool loses (or
        gets back) the rest."""
        if self._store.set_offline(cpus):
            self.refresh_gauges()
            self._publish_pool()

    def restore(self, records: Sequence[ClaimRecord]) -> None:
        """Start-up: claims from the checkpoint or the CDI specs (already checked)."""
        for record in records:
            self._store.reserve(record)
        self.refresh_gauges()

    # -- the kubelet's transactions -------------------------------------------------------
    async def prepare(self, claim: ClaimAllocation, steps: ClaimSteps) -> PrepareOutcome:
        """Prepare one claim as one transaction (``state.claims.prepare``)."""
        return await claim_transactions.prepare(self, claim, steps)

    async def unprepare(
        self, namespace: str, name: str, claim_uid: str, steps: ClaimSteps
    ) -> UnprepareOutcome:
        """Unprepare one claim as one transaction (``state.claims.unprepare``)."""
        return await claim_transactions.unprepare(self, namespace, name, claim_uid, steps)

    # The steps of those transactions, private to ``dracpu.state`` (``state.claims`` runs
    # them in order); tests and benchmarks go through ``prepare`` and ``unprepare`` too.
    def _begin_prepare(self, plan: ClaimPlan) -> bool:
        """Keep a plan's CPUs from every other claim, not yet visible. True when new."""
        if plan.already_prepared or plan.is_empty:
            return False
        try:
            return self._store.reserve(plan.record, pending=True)
        except StoreError as exc:
            raise PrepareError(str(exc)) from None

    def _finish_prepare(self, plan: ClaimPlan, claim: ClaimAllocation | None = None) -> None:
        """The claim's spec and checkpoint are on disk: it is prepared for everyone now.
        ``claim`` (as the kubelet's prepare read it) names the event's devices' shares."""
        record = self._store.commit(plan.claim_uid)
        if record is not None:
            self.refresh_gauges()
            self._publish_pool()
            if self._events_out:  # nobody subscribed: build no event
                self._publish_event(events.claim_prepared(record, claim))

    def _repeat_prepare(self, claim: ClaimAllocation) -> None:
        """The kubelet prepared a claim already prepared: nothing changes, but the
        subscribers that asked hear it again."""
        if any(self._events_out.values()):
            record = self._store.get(claim.uid)
            if record is not None:
                self._publish_event(events.claim_prepared(record, claim, repeated=True))

    def _abort_prepare(self, plan: ClaimPlan) -> None:
        """The prepare failed before anyone saw the claim; the next checkpoint drops it."""
        self._store.discard(plan.claim_uid)

    def _begin_unprepare(self, claim_uid: str) -> ClaimRecord | None:
        """Leave the claim out of the next checkpoint; it stays prepared until finished."""
        return self._store.begin_release(claim_uid)

    def _finish_unprepare(self, claim_uid: str, namespace: str = "", name: str = "") -> None:
        record = self._store.get(claim_uid) if self._events_out else None
        self._store.release(claim_uid)
        self._tracker.release([claim_uid])
        self.refresh_gauges()
        self._publish_pool()
        if record is not None:
            self._publish_event(events.claim_unprepared(record, namespace, name))

    def _abort_unprepare(self, claim_uid: str) -> None:
        self._store.cancel_release(claim_uid)

    # -- the runtime's changes ------------------------------------------------------------
    def admit(self, record: ContainerRecord, claims: Mapping[str, CPUSet]) -> CreateDecision:
        """CreateContainer (§13.3), all or nothing: a claim holder (``claims``: the env's
        claim UID -> CPUs, in order) is bound to its claims, which must be prepared with
        exactly those CPUs, and pinned to them; anyone else to the shared pool. Returns the
        container's cpuset and, when it bound a claim anew, the updates of the containers
        that follow the pool. Raises ``AdmissionError`` (nothing changed) for a claim bound
        to another container, one not prepared or prepared with other CPUs, and a shared
        container while the shared pool is empty."""
        if not claims:
            pool = self._store.shared_pool
            if not pool:
                raise AdmissionError(EMPTY_SHARED_POOL)
            self._containers.set(msgspec.structs.replace(record, claim_uids=()))
            return CreateDecision(cpus=pool)
        claim_uids = tuple(claims)
        try:
            newly_bound = self._tracker.set_owner(record.pod_uid, record.name, claim_uids)
        except StateError as exc:
            raise AdmissionError(str(exc)) from None
        try:
            self._store.validate(claims)
        except StoreError as exc:
            self._tracker.release(newly_bound)
            raise AdmissionError(str(exc)) from None
        # The env's CPUs equal the claims' (validated); sharedPoolAccess adds the pool.
        guaranteed = self.view.holder_cpus(claim_uids)
        self._containers.set(msgspec.structs.replace(record, claim_uids=claim_uids))
        updates = self.view.shared_updates(exclude=record.container_id) if newly_bound else []
        return CreateDecision(
            cpus=guaranteed,
            mems=self.view.mems(guaranteed),
            updates=updates,
            claim_uids=claim_uids,
        )

    def put_container(self, record: ContainerRecord) -> ContainerRecord | None:
        """Record a created container; returns the one of the same (pod, name) it replaces."""
        return self._containers.set(record)

    def drop_container(self, pod_uid: str, name: str, container_id: str) -> ContainerRecord | None:
        """Forget a stopped or removed container; None for a stale or unknown event."""
        return self._containers.remove(pod_uid, name, container_id)

    def put_sandbox(self, record: SandboxRecord) -> None:
        """A pod sandbox runs (RunPodSandbox)."""
        self._sandboxes[record.sandbox_id] = record

    def drop_sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        """A pod sandbox stopped or was removed; None when it was not known."""
        return self._sandboxes.pop(sandbox_id, None)

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
            self._store.reserve(ClaimRecord(uid=uid, cpus=cpus))
        self._tracker.release(list(self._tracker.owners()))
        by_owner: dict[tuple[str, str], list[str]] = {}
        for uid, owner in owners.owners().items():
            by_owner.setdefault((owner.pod_uid, owner.container_name), []).append(uid)
        for (pod_uid, name), uids in by_owner.items():
            self._tracker.set_owner(pod_uid, name, uids)
        for old in list(self._containers):
            self._containers.remove(old.pod_uid, old.name, old.container_id)
        for record in records:
            self._containers.set(record)
        self._sandboxes = {s.sandbox_id: s for s in sandboxes}
        self.has_synchronized = True
        if adopted:
            self.refresh_gauges()
            self._publish_claims("synchronize")
            self._publish_pool()
