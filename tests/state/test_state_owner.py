"""The state owner's messages: ClaimsChanged to the checkpoint writer (one write per batch,
answers on the reply channel), SharedPoolChanged to the pool pusher (newest wins)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from dracpu.allocation.checkpoint import decode_checkpoint
from dracpu.allocation.prepare import ClaimPlan
from dracpu.allocation.store import AllocationStore, ClaimRecord, ClaimTracker, PreparedDevice
from dracpu.atomicfile import atomic_write
from dracpu.cpuset import CPUSet
from dracpu.messages import ContainerIntent, SharedPoolChanged
from dracpu.nri.pusher import PoolPusher
from dracpu.state import CheckpointFile, NodeState, StateFileError

ALL = CPUSet.parse("0-15")
DEVICE = (PreparedDevice(pool_name="node-a", device_name="cpudev000"),)


def plan(uid: str, cpus: str) -> ClaimPlan:
    return ClaimPlan(record=ClaimRecord(uid=uid, cpus=CPUSet.parse(cpus), devices=DEVICE))


def checkpoint_file(state: NodeState, tmp_path: Path, writes: list[int]) -> CheckpointFile:
    def write(path: str, data: bytes, **kw: Any) -> None:
        writes.append(len(decode_checkpoint(data).claims))
        atomic_write(path, data, **kw)

    return CheckpointFile(
        state, str(tmp_path / "state"), boot_id="b", config_fingerprint="f", write_file=write
    )


async def test_queued_changes_share_one_write_and_every_waiter_hears(tmp_path: Path) -> None:
    state = NodeState(AllocationStore(ALL, CPUSet()))
    writes: list[int] = []
    checkpoint = checkpoint_file(state, tmp_path, writes)
    changes = state.claims_changes()
    answered: list[str] = []

    async def prepare(uid: str, cpus: str) -> None:
        p = plan(uid, cpus)
        assert state._begin_prepare(p)
        await state.make_durable("prepare")
        state._finish_prepare(p)
        answered.append(uid)

    # Three prepares queue their changes before the writer takes any (as if it were busy
    # with an earlier write): one write holds all.
    with state.checkpoint_writer():
        async with trio.open_nursery() as nursery:
            for uid, cpus in (("a", "0-1"), ("b", "2-3"), ("c", "4-7")):
                nursery.start_soon(prepare, uid, cpus)
            await trio.testing.wait_all_tasks_blocked()
            assert answered == [] and len(state.view.claims()) == 0  # pending: nobody sees them yet
            await nursery.start(checkpoint.run, changes)
            while len(answered) < 3:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert writes == [3]
    assert sorted(answered) == ["a", "b", "c"]
    assert {r.uid for r in state.view.claims()} == {"a", "b", "c"}
    assert checkpoint.writes == 1


async def test_no_writer_is_a_clear_error_and_a_stopped_writer_answers_everyone(
    tmp_path: Path,
) -> None:
    state = NodeState(AllocationStore(ALL, CPUSet()))
    entered, release = threading.Event(), threading.Event()

    def slow_write(path: str, data: bytes, **kw: Any) -> None:
        entered.set()
        release.wait(10)
        atomic_write(path, data, **kw)

    checkpoint = CheckpointFile(
        state, str(tmp_path / "s"), boot_id="b", config_fingerprint="f", write_file=slow_write
    )
    changes = state.claims_changes()
    with pytest.raises(StateFileError, match="the checkpoint writer is not running"):
        await state.make_durable("prepare")

    outcomes: list[str] = []

    async def wait() -> None:
        try:
            await state.make_durable("unprepare")
            outcomes.append("written")
        except StateFileError as exc:
            outcomes.append(str(exc))

    async with trio.open_nursery() as outer, trio.open_nursery() as writer:
        await writer.start(checkpoint.run, changes)
        outer.start_soon(wait)
        await trio.to_thread.run_sync(entered.wait, 10)
        outer.start_soon(wait)  # queued behind the write in progress
        await trio.testing.wait_all_tasks_blocked()
        writer.cancel_scope.cancel()  # the shielded write still finishes
        release.set()
    assert outcomes == ["written", "the checkpoint writer stopped"]
    assert state.writer_running is False
    with pytest.raises(StateFileError, match="not running"):
        await state.make_durable("prepare")


def test_memory_only_state_publishes_pool_changes_on_commit_and_release() -> None:
    state = NodeState(AllocationStore(ALL, CPUSet()))
    pool = state.pool_changes()
    p = plan("a", "0-3")
    assert state._begin_prepare(p)
    assert state.shared_pool == ALL  # pending CPUs stay in the pool until the commit
    assert not state.view.free & CPUSet.parse("0-3")
    state._finish_prepare(p)
    assert pool.receive_nowait() == SharedPoolChanged(cpus="4-15")
    assert state._begin_unprepare("a") is not None
    assert state.view.durable_claims() == []
    state._abort_unprepare("a")
    assert [r.uid for r in state.view.durable_claims()] == ["a"]
    state._begin_unprepare("a")
    state._finish_unprepare("a")
    assert pool.receive_nowait() == SharedPoolChanged(cpus="0-15")
    with pytest.raises(trio.WouldBlock):
        pool.receive_nowait()


def test_synchronize_adoption_is_checkpointed_and_moves_the_pool() -> None:
    state = NodeState(AllocationStore(ALL, CPUSet()))
    claims = state.claims_changes()
    pool = state.pool_changes()
    owners = ClaimTracker()
    owners.set_owner("p1", "app", ["x"])
    state.synchronized({"x": CPUSet.parse("8-9")}, owners, [])
    change = claims.receive_nowait()
    assert (change.reason, change.reply) == ("synchronize", None)
    assert pool.receive_nowait().cpus == "0-7,10-15"
    assert state.has_synchronized
    # Nothing adopted: nothing to write, the pool did not move.
    state.synchronized({}, ClaimTracker(), [])
    with pytest.raises(trio.WouldBlock):
        claims.receive_nowait()
    with pytest.raises(trio.WouldBlock):
        pool.receive_nowait()


class FakeSession:
    def __init__(self) -> None:
        self.pushed: list[list[str]] = []

    async def update_containers(self, updates: list[ContainerIntent]) -> list[str]:
        self.pushed.append([u.cpus for u in updates])
        return []


class FakePlugin:
    def __init__(self, state: NodeState) -> None:
        self.state = state

    def shared_pool_updates(self) -> list[ContainerIntent]:
        cpus = self.state.shared_pool.format()
        return [ContainerIntent(container_id="s1", cgroups_path="", cpus=cpus)]

    def sandbox_intents(self) -> list[ContainerIntent]:
        return []


async def test_pool_pusher_pushes_the_newest_pool_once_for_queued_changes() -> None:
    state = NodeState(AllocationStore(ALL, CPUSet()))
    session = FakeSession()
    pusher = PoolPusher(state.pool_changes(), FakePlugin(state), session)  # type: ignore[arg-type]
    for uid, cpus in (("a", "0-1"), ("b", "2-3"), ("c", "4-5")):
        p = plan(uid, cpus)
        state._begin_prepare(p)
        state._finish_prepare(p)
    async with trio.open_nursery() as nursery:
        await nursery.start(pusher.run)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert session.pushed == [["6-15"]]
    assert pusher.pushes == 1
