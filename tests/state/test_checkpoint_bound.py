"""A checkpoint write must complete, yet a hung one cannot hold up a stop: the stop waits for
it ``stop_bound`` seconds, its waiters then hear that whether it landed is unknown (those
queued behind it, that it was not written), its thread still lands the file whole, and no
later write starts before that thread ends, so an older checkpoint never replaces a newer
one."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from dracpu.allocation.checkpoint import decode_checkpoint
from dracpu.allocation.prepare import ClaimPlan
from dracpu.allocation.store import AllocationStore, ClaimRecord, PreparedDevice
from dracpu.atomicfile import atomic_write
from dracpu.cpuset import CPUSet
from dracpu.state import CheckpointFile, CheckpointOutcomeUnknown, NodeState, StateFileError
from dracpu.state.durable import WRITE_LEFT_RUNNING

ALL = CPUSet.parse("0-15")
DEVICE = (PreparedDevice(pool_name="node-a", device_name="cpudev000"),)


class HungDisk:
    """``write_file`` whose first write blocks until ``release``; records what landed."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.landed: list[list[str]] = []
        self.calls = 0

    def __call__(self, path: str, data: bytes, **kw: Any) -> None:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            self.release.wait(30)
        atomic_write(path, data, **kw)
        self.landed.append([c.uid for c in decode_checkpoint(data).claims])


def hung_checkpoint(
    tmp_path: Path, stop_bound: float
) -> tuple[NodeState, HungDisk, CheckpointFile]:
    """An owner of ALL CPUs whose checkpoint writes to a ``HungDisk`` in ``tmp_path``."""
    state = NodeState(AllocationStore(ALL, CPUSet()))
    disk = HungDisk()
    checkpoint = CheckpointFile(
        state,
        str(tmp_path),
        boot_id="b",
        config_fingerprint="f",
        write_file=disk,
        stop_bound=stop_bound,
    )
    return state, disk, checkpoint


async def prepare(state: NodeState, uid: str, cpus: str, outcomes: list[str]) -> None:
    p = ClaimPlan(record=ClaimRecord(uid=uid, cpus=CPUSet.parse(cpus), devices=DEVICE))
    assert state._begin_prepare(p)
    try:
        await state.make_durable("prepare")
    except CheckpointOutcomeUnknown as exc:
        outcomes.append(f"{uid}: unknown: {exc}")  # as state.claims does: no undo
        return
    except StateFileError as exc:
        state._abort_prepare(p)
        outcomes.append(f"{uid}: {exc}")
        return
    state._finish_prepare(p)
    outcomes.append(f"{uid}: written")


async def test_a_stop_waits_for_a_hung_write_the_bound_only(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    state, disk, checkpoint = hung_checkpoint(tmp_path, stop_bound=2.5)
    outcomes: list[str] = []
    try:
        with state.checkpoint_writer():
            async with trio.open_nursery() as outer, trio.open_nursery() as writer:
                await writer.start(checkpoint.run, state.claims_changes())
                outer.start_soon(prepare, state, "a", "0-1", outcomes)
                await trio.to_thread.run_sync(disk.entered.wait)
                await trio.testing.wait_all_tasks_blocked()
                outer.start_soon(prepare, state, "c", "4-5", outcomes)  # queued behind it
                await trio.testing.wait_all_tasks_blocked()
                start = trio.current_time()
                writer.cancel_scope.cancel()  # the stop
        assert trio.current_time() - start == 2.5
    finally:
        disk.release.set()
    # "a"'s write may still land; "c" is in no snapshot taken, and no later write starts.
    assert sorted(outcomes) == [
        f"a: unknown: {WRITE_LEFT_RUNNING}",
        "c: the checkpoint writer stopped",
    ]


async def test_a_write_left_behind_is_never_overtaken(tmp_path: Path) -> None:
    # Real time: the threads need their milliseconds.
    state, disk, checkpoint = hung_checkpoint(tmp_path, stop_bound=0.1)
    outcomes: list[str] = []
    try:
        with state.checkpoint_writer():
            async with trio.open_nursery() as outer:
                async with trio.open_nursery() as writer:
                    await writer.start(checkpoint.run, state.claims_changes())
                    outer.start_soon(prepare, state, "a", "0-1", outcomes)
                    await trio.to_thread.run_sync(disk.entered.wait)
                    writer.cancel_scope.cancel()  # the writer stops; "a" is left writing
                await trio.testing.wait_all_tasks_blocked()
                assert outcomes == [f"a: unknown: {WRITE_LEFT_RUNNING}"]
                # The writer restarted (the supervisor's backoff): "b" waits for "a"'s thread.
                async with trio.open_nursery() as writer:
                    await writer.start(checkpoint.run, state.claims_changes())
                    outer.start_soon(prepare, state, "b", "2-3", outcomes)
                    await trio.sleep(0.3)
                    assert disk.calls == 1 and len(outcomes) == 1
                    disk.release.set()
                    with trio.fail_after(30):
                        while len(outcomes) < 2:
                            await trio.sleep(0.02)
                    writer.cancel_scope.cancel()
    finally:
        disk.release.set()
    assert outcomes[1] == "b: written"
    # The old write (with "a", pending then) landed first; the newer one last. "a" stays
    # pending (nothing undid it), so the newer one keeps it too.
    assert disk.landed == [["a"], ["a", "b"]]
    on_disk = decode_checkpoint((tmp_path / "checkpoint.json").read_bytes())
    assert [c.uid for c in on_disk.claims] == ["a", "b"]


def test_a_bad_bound_is_refused(tmp_path: Path) -> None:
    state = NodeState(AllocationStore(ALL, CPUSet()))
    with pytest.raises(ValueError, match="checkpoint stop bound must be >= 0 seconds, got -1"):
        CheckpointFile(state, str(tmp_path), boot_id="b", config_fingerprint="f", stop_bound=-1)
