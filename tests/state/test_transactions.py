"""The owner's whole transactions: prepare and unprepare with injected steps (spec I/O and
ordering), NRI's admission, a topology change, the read-only view, and the claim events
published when a transaction commits."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from builders import claim, machine, result
from owner_steps import MemorySteps

from dracpu.allocation.store import AllocationStore, ContainerRecord, SandboxRecord
from dracpu.atomicfile import atomic_write
from dracpu.cpuset import CPUSet
from dracpu.devices import DeviceSettings, build_inventory
from dracpu.messages import ClaimDevice, ClaimPrepared, ClaimUnprepared, ContainerIntent
from dracpu.state import (
    AdmissionError,
    CheckpointFile,
    CheckpointOutcomeUnknown,
    NodeState,
    PrepareOutcome,
    UnprepareOutcome,
)
from dracpu.state.steps import WRITER_NOT_RUNNING, StateFileError

FIXTURE = "epyc-nps4"


def make_state() -> NodeState:
    topo = machine(FIXTURE)
    inventory = build_inventory(topo, DeviceSettings(mode="grouped", group_by="numanode"))
    state = NodeState(AllocationStore(topo.all_cpus, CPUSet()))
    state.use_topology(topo, inventory, topo.online)
    return state


class Steps(MemorySteps):
    """MemorySteps that also record whether the metadata removal held the owner's lock."""

    def __init__(self, *fail: str) -> None:
        super().__init__(*fail)
        self.metadata_under_lock: list[bool] = []

    async def remove_metadata(self, namespace: str, name: str, claim_uid: str) -> None:
        self.metadata_under_lock.append(self.lock().locked())
        await super().remove_metadata(namespace, name, claim_uid)


def broken_writer(state: NodeState, tmp_path: Path) -> CheckpointFile:
    def write(path: str, data: bytes, **kw: Any) -> None:
        raise OSError(28, "No space left on device")

    return CheckpointFile(
        state, str(tmp_path), boot_id="b", config_fingerprint="f", write_file=write
    )


async def test_prepare_commits_after_the_spec_and_publishes_one_event() -> None:
    state = make_state()
    events = state.claim_events()
    steps = Steps()
    outcome = await state.prepare(claim("u1", result("cpudevnuma000", 4)), steps)
    assert outcome.error == "" and outcome.new and outcome.plan is not None
    assert steps.calls == [("write_spec", "u1")]
    held = state.view.cpus_of("u1")
    assert held is not None and len(held) == 4
    assert not held & state.view.shared_pool
    event = events.receive_nowait()
    assert isinstance(event, ClaimPrepared)
    assert (event.uid, event.name, event.cpus) == ("u1", "claim-u1", held.format())
    assert event.devices == (ClaimDevice(pool="node-a", device="cpudevnuma000"),)
    # A repeated prepare rewrites the spec, reserves nothing anew, publishes nothing.
    again = await state.prepare(claim("u1", result("cpudevnuma000", 4)), steps)
    assert (again.error, again.new) == ("", False)
    with pytest.raises(trio.WouldBlock):
        events.receive_nowait()


async def test_a_failed_spec_write_leaves_no_claim() -> None:
    state = make_state()
    pool = state.view.shared_pool
    outcome = await state.prepare(claim("u1", result("cpudevnuma000", 4)), Steps("write_spec"))
    assert (outcome.failed_at, outcome.error) == ("spec", "write_spec failed for u1")
    assert state.view.cpus_of("u1") is None and state.view.free == pool


async def test_an_unplannable_claim_is_refused_before_any_file_step() -> None:
    state = make_state()
    steps = Steps()
    bad_uid = await state.prepare(claim("../x", result("cpudevnuma000", 1)), steps)
    assert bad_uid.failed_at == "plan" and "../x" in bad_uid.error
    unknown = await state.prepare(claim("u2", result("nosuchdevice", 1)), steps)
    assert unknown.failed_at == "plan" and unknown.error
    assert steps.calls == []


async def test_no_topology_yet_is_a_clear_error() -> None:
    state = NodeState(AllocationStore(CPUSet.parse("0-7"), CPUSet()))
    outcome = await state.prepare(claim("u1", result("cpudevnuma000", 1)), Steps())
    assert outcome == PrepareOutcome(
        error="the driver has no CPU topology to plan with yet", failed_at="plan"
    )


async def test_a_failed_checkpoint_drops_the_claim_and_its_spec(tmp_path: Path) -> None:
    state = make_state()
    steps = Steps()
    events = state.claim_events()
    checkpoint = broken_writer(state, tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(checkpoint.run, state.claims_changes())
        outcome = await state.prepare(claim("u1", result("cpudevnuma000", 4)), steps)
        nursery.cancel_scope.cancel()
    assert outcome.failed_at == "record"
    assert outcome.error.startswith("failed to record claim default/claim-u1: failed to write")
    assert steps.calls == [("write_spec", "u1"), ("remove_spec", "u1")]
    assert state.view.cpus_of("u1") is None and not state.view.durable_claims()
    with pytest.raises(trio.WouldBlock):
        events.receive_nowait()


async def test_unprepare_releases_after_the_checkpoint_and_publishes_one_event() -> None:
    state = make_state()
    await state.prepare(claim("u1", result("cpudevnuma000", 4)), Steps())
    events = state.claim_events()
    steps = Steps()
    outcome = await state.unprepare("default", "claim-u1", "u1", steps)
    assert outcome.error == "" and outcome.released is not None
    assert steps.calls == [("remove_spec", "u1"), ("remove_metadata", "u1")]
    assert state.view.cpus_of("u1") is None
    event = events.receive_nowait()
    assert isinstance(event, ClaimUnprepared) and event.uid == "u1"
    # An unknown claim succeeds: its spec and metadata are removed, nothing is published.
    steps = Steps()
    assert (await state.unprepare("ns", "gone", "u9", steps)).released is None
    assert steps.calls == [("remove_spec", "u9"), ("remove_metadata", "u9")]
    with pytest.raises(trio.WouldBlock):
        events.receive_nowait()


async def test_no_metadata_removal_holds_the_lock() -> None:
    # Metadata I/O may be slow (a worker thread, a disk): the lock every prepare and
    # unprepare plans under is never held across it, for a known claim or an unknown one.
    state = make_state()
    await state.prepare(claim("u1", result("cpudevnuma000", 4)), Steps())
    steps = Steps()
    assert (await state.unprepare("default", "claim-u1", "u1", steps)).released is not None
    assert (await state.unprepare("ns", "gone", "u9", steps)).released is None
    assert steps.calls == [
        ("remove_spec", "u1"),
        ("remove_metadata", "u1"),
        ("remove_spec", "u9"),
        ("remove_metadata", "u9"),
    ]
    assert steps.metadata_under_lock == [False, False]


async def test_an_unknown_claims_slow_metadata_removal_lets_other_calls_plan() -> None:
    state = make_state()
    release = trio.Event()
    order: list[str] = []

    class SlowMetadata(Steps):
        async def remove_metadata(self, namespace: str, name: str, claim_uid: str) -> None:
            order.append("metadata started")
            await release.wait()
            order.append("metadata done")

    steps = SlowMetadata()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(state.unprepare, "ns", "gone", "u9", steps)
        await trio.testing.wait_all_tasks_blocked()
        outcome = await state.prepare(claim("u1", result("cpudevnuma000", 4)), steps)
        order.append("prepared" if outcome.error == "" else outcome.error)
        release.set()
    assert order == ["metadata started", "prepared", "metadata done"]


async def test_a_failed_unprepare_puts_everything_back(tmp_path: Path) -> None:
    state = make_state()
    await state.prepare(claim("u1", result("cpudevnuma000", 4)), Steps())
    held = state.view.cpus_of("u1")
    failed_spec = await state.unprepare("default", "claim-u1", "u1", Steps("remove_spec"))
    assert (failed_spec.failed_at, failed_spec.released) == ("spec", None)
    assert state.view.cpus_of("u1") == held
    steps = Steps()
    checkpoint = broken_writer(state, tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(checkpoint.run, state.claims_changes())
        outcome = await state.unprepare("default", "claim-u1", "u1", steps)
        nursery.cancel_scope.cancel()
    assert outcome.failed_at == "record" and outcome.error.startswith(
        "failed to record claim default/claim-u1: "
    )
    # The claim stays prepared and its spec is written again; the kubelet retries.
    assert steps.calls == [("remove_spec", "u1"), ("write_spec", "u1")]
    assert state.view.cpus_of("u1") == held
    assert [r.uid for r in state.view.durable_claims()] == ["u1"]


async def test_unpreparing_an_unusable_uid_touches_no_file() -> None:
    # No spec can exist under such a name (prepare refuses it), so it is simply done.
    state = make_state()
    steps = Steps()
    assert await state.unprepare("ns", "n", "../x", steps) == UnprepareOutcome()
    assert steps.calls == []


async def test_admit_pins_holders_to_their_claims_and_others_to_the_pool() -> None:
    state = make_state()
    await state.prepare(claim("u1", result("cpudevnuma000", 4)), Steps())
    held = state.view.cpus_of("u1")
    assert held is not None
    shared = state.admit(
        ContainerRecord(pod_uid="p0", name="web", container_id="c0", cgroups_path="/c0"), {}
    )
    assert shared.cpus == state.view.shared_pool and shared.updates == []
    holder = state.admit(
        ContainerRecord(pod_uid="p1", name="db", container_id="c1", cgroups_path="/c1"),
        {"u1": held},
    )
    assert (holder.cpus, holder.claim_uids) == (held, ("u1",))
    assert state.view.knows_container("c0") and state.view.knows_container("c1")
    intents = {i.container_id: i.cpus for i in state.view.intents()}
    assert intents == {"c0": state.view.shared_pool.format(), "c1": held.format()}


def test_admit_refuses_without_changing_anything() -> None:
    state = make_state()
    record = ContainerRecord(pod_uid="p1", name="db", container_id="c1")
    with pytest.raises(AdmissionError, match='claim "u1" is not prepared by this driver'):
        state.admit(record, {"u1": CPUSet.parse("0-3")})
    assert not state.view.knows_container("c1") and state.view.owners() == {}
    # An empty shared pool refuses a shared container (fail closed).
    empty = NodeState(AllocationStore(CPUSet.parse("0-3"), CPUSet()))
    empty.set_offline(CPUSet.parse("0-3"))
    with pytest.raises(AdmissionError, match="shared pool is empty"):
        empty.admit(record, {})
    assert not empty.view.knows_container("c1")


async def test_admit_refuses_a_claim_bound_to_another_container_or_with_other_cpus() -> None:
    state = make_state()
    await state.prepare(claim("u1", result("cpudevnuma000", 2)), Steps())
    held = state.view.cpus_of("u1")
    assert held is not None
    first = ContainerRecord(pod_uid="p1", name="a", container_id="c1")
    state.admit(first, {"u1": held})
    with pytest.raises(AdmissionError, match="already bound"):
        state.admit(ContainerRecord(pod_uid="p2", name="b", container_id="c2"), {"u1": held})
    forged = CPUSet([max(state.view.shared_pool)])
    await state.prepare(claim("u2", result("cpudevnuma001", 2)), Steps())
    with pytest.raises(AdmissionError, match="cpuset mismatch"):
        state.admit(ContainerRecord(pod_uid="p3", name="c", container_id="c3"), {"u2": forged})
    # The refused binding was undone: another container may still take u2.
    assert "u2" not in state.view.owners()


async def test_still_wanted_keeps_only_current_intents() -> None:
    state = make_state()
    state.admit(ContainerRecord(pod_uid="p0", name="w", container_id="c0", cgroups_path="/c0"), {})
    state.put_sandbox(SandboxRecord(pod_uid="p0", sandbox_id="s0", cgroups_path="/s0"))
    pool = state.view.shared_pool.format()
    now = [
        ContainerIntent(container_id="c0", cgroups_path="/c0", cpus=pool),
        ContainerIntent(container_id="s0", cgroups_path="/s0", cpus=pool, sandbox=True),
    ]
    stale = ContainerIntent(container_id="c0", cgroups_path="/c0", cpus="0")
    gone = ContainerIntent(container_id="c9", cgroups_path="/c9", cpus=pool)
    assert state.view.still_wanted([*now, stale, gone]) == now
    assert state.view.is_wanted(now[0]) and not state.view.is_wanted(stale)
    # A prepare shrinks the pool: the old pool is not wanted any more.
    await state.prepare(claim("u1", result("cpudevnuma000", 4)), Steps())
    assert state.view.still_wanted(now) == []
    state.drop_sandbox("s0")
    assert [i.container_id for i in state.view.intents()] == ["c0"]


def test_apply_topology_moves_online_cpus_and_the_pool() -> None:
    state = make_state()
    topo = state.topology
    assert topo is not None and state.inventory is not None
    pool = state.pool_changes()
    gone = CPUSet([max(topo.online)])
    offline = dataclasses.replace(topo, online=topo.online - gone, present=topo.all_cpus)
    state.apply_topology(offline, state.inventory)
    assert state.view.online == topo.online - gone
    assert state.view.offline == gone
    assert pool.receive_nowait().cpus == (topo.all_cpus - gone).format()


async def test_closing_the_channels_ends_every_receiver() -> None:
    state = make_state()
    claims, pool, events = state.claims_changes(), state.pool_changes(), state.claim_events()
    state.close_channels()
    for inbox in (claims, pool, events):
        with pytest.raises(trio.EndOfChannel):
            await inbox.receive()


async def test_after_closing_nothing_commits_and_new_inboxes_are_ended() -> None:
    state = make_state()
    state.claims_changes()
    state.close_channels()
    state.close_channels()  # again: nothing left to close
    outcome = await state.prepare(claim("u1", result("cpudevnuma000", 1)), Steps())
    assert outcome.failed_at == "record"
    # The words a late prepare heard before the channels could be closed at a stop.
    assert outcome.error == "failed to record claim default/claim-u1: " + WRITER_NOT_RUNNING
    assert WRITER_NOT_RUNNING == "the checkpoint writer is not running"
    assert state.view.cpus_of("u1") is None and state.view.durable_claims() == []
    for inbox in (state.claims_changes(), state.pool_changes(), state.claim_events()):
        with pytest.raises(trio.EndOfChannel):
            await inbox.receive()


async def test_the_publishing_service_closes_the_channels_when_stopped() -> None:
    state = make_state()
    events, pool = state.claim_events(), state.pool_changes()
    ended: list[str] = []

    async def drain(name: str, inbox: trio.abc.ReceiveChannel[Any]) -> None:
        async for _ in inbox:
            pass
        ended.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain, "events", events)
        nursery.start_soon(drain, "pool", pool)
        async with trio.open_nursery() as service:
            await service.start(state.publishing)
            await state.prepare(claim("u1", result("cpudevnuma000", 1)), Steps())
            await trio.testing.wait_all_tasks_blocked()
            assert ended == []  # running: the receivers wait for more
            service.cancel_scope.cancel()  # the daemon stops the service
    assert sorted(ended) == ["events", "pool"]  # each receiver ended on its own


async def test_a_closed_subscriber_is_dropped() -> None:
    state = make_state()
    gone, kept = state.claim_events(), state.claim_events()
    await gone.aclose()
    await state.prepare(claim("u1", result("cpudevnuma000", 1)), Steps())
    assert isinstance(kept.receive_nowait(), ClaimPrepared)


class HungWrite:
    """A checkpoint ``write_file`` that blocks until released (a hung disk), then writes."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, path: str, data: bytes, **kw: Any) -> None:
        self.entered.set()
        self.release.wait(30)
        atomic_write(path, data, **kw)


async def _stopped_mid_write(
    state: NodeState, tmp_path: Path, transaction: Any
) -> PrepareOutcome | UnprepareOutcome:
    """Run ``transaction()`` while the writer hangs in its write, stop the writer, wait past
    its stop bound; the transaction's outcome."""
    disk = HungWrite()
    checkpoint = CheckpointFile(
        state, str(tmp_path), boot_id="b", config_fingerprint="f", write_file=disk, stop_bound=0.05
    )
    outcomes: list[PrepareOutcome | UnprepareOutcome] = []

    async def run() -> None:
        outcomes.append(await transaction())

    try:
        async with trio.open_nursery() as outer, trio.open_nursery() as writer:
            await writer.start(checkpoint.run, state.claims_changes())
            outer.start_soon(run)
            await trio.to_thread.run_sync(disk.entered.wait, 10)
            writer.cancel_scope.cancel()  # the stop; the write stays in its thread
    finally:
        disk.release.set()
    return outcomes[0]


async def test_a_prepare_whose_write_a_stop_left_running_undoes_nothing(tmp_path: Path) -> None:
    # The write may still land with the claim in it: removing its spec or dropping it
    # could contradict the checkpoint; the next start rebuilds from both files.
    state = make_state()
    steps = Steps()
    outcome = await _stopped_mid_write(
        state, tmp_path, lambda: state.prepare(claim("u1", result("cpudevnuma000", 4)), steps)
    )
    assert outcome.failed_at == "record"
    assert outcome.error.startswith("failed to record claim default/claim-u1: ")
    assert "unknown" in outcome.error
    assert steps.calls == [("write_spec", "u1")]  # no remove_spec
    assert [r.uid for r in state.view.durable_claims()] == ["u1"]  # not dropped
    assert state.view.cpus_of("u1") is None  # nor committed


async def test_an_unprepare_whose_write_a_stop_left_running_puts_nothing_back(
    tmp_path: Path,
) -> None:
    state = make_state()
    await state.prepare(claim("u1", result("cpudevnuma000", 4)), Steps())
    steps = Steps()
    outcome = await _stopped_mid_write(
        state, tmp_path, lambda: state.unprepare("default", "claim-u1", "u1", steps)
    )
    assert outcome.failed_at == "record" and "unknown" in outcome.error
    assert steps.calls == [("remove_spec", "u1")]  # the spec is not written again
    assert state.view.durable_claims() == []  # still left out, as in the write


async def test_the_exception_of_an_unknown_outcome_is_a_state_file_error() -> None:
    # Callers that only know StateFileError still hear a failure.
    assert issubclass(CheckpointOutcomeUnknown, StateFileError)


async def test_a_reply_closed_unanswered_fails_and_undoes_the_prepare() -> None:
    state = make_state()
    steps = Steps()
    changes = state.claims_changes()

    async def writer_that_drops_replies() -> None:
        with state.checkpoint_writer():
            message = await changes.receive()
            assert message.reply is not None
            await message.reply.aclose()  # closed, never answered

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer_that_drops_replies)
        await trio.testing.wait_all_tasks_blocked()
        outcome = await state.prepare(claim("u1", result("cpudevnuma000", 4)), steps)
    assert outcome.failed_at == "record"
    assert outcome.error == (
        "failed to record claim default/claim-u1: "
        "the checkpoint writer ended without answering: not written"
    )
    assert steps.calls == [("write_spec", "u1"), ("remove_spec", "u1")]
    assert state.view.cpus_of("u1") is None and state.view.durable_claims() == []
