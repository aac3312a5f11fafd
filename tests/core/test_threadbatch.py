"""ThreadBatcher: blocking calls queued together run in one worker-thread job, in order."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from dracpu.threadbatch import ThreadBatcher


async def test_calls_queued_while_a_batch_runs_share_the_next_batch() -> None:
    batcher = ThreadBatcher()
    release_first = threading.Event()
    ran: list[tuple[str, int]] = []

    def call(name: str) -> str:
        if name == "first":
            release_first.wait(10)
        ran.append((name, threading.get_ident()))
        return name.upper()

    results: dict[str, str] = {}

    async def submit(name: str) -> None:
        results[name] = await batcher.run(call, name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, "first")
        await trio.testing.wait_all_tasks_blocked()
        for name in ("a", "b", "c"):
            nursery.start_soon(submit, name)
            await trio.testing.wait_all_tasks_blocked()
        release_first.set()
    assert results == {"first": "FIRST", "a": "A", "b": "B", "c": "C"}
    assert [name for name, _ in ran] == ["first", "a", "b", "c"]
    assert batcher.batches == 2  # [first], then [a, b, c] in one job
    assert len({thread for name, thread in ran[1:]}) == 1
    assert all(thread != threading.get_ident() for _, thread in ran)


async def test_an_exception_belongs_to_its_call_only() -> None:
    batcher = ThreadBatcher()
    gate = threading.Event()

    def fail(message: str) -> None:
        gate.wait(10)
        raise OSError(message)

    outcomes: dict[str, object] = {}

    async def submit(name: str, fn: object, *args: object) -> None:
        try:
            outcomes[name] = await batcher.run(fn, *args)  # type: ignore[arg-type]
        except OSError as exc:
            outcomes[name] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, "lead", fail, "first")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(submit, "bad", fail, "second")
        nursery.start_soon(submit, "good", len, "abc")
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    assert str(outcomes["lead"]) == "first"
    assert str(outcomes["bad"]) == "second"
    assert outcomes["good"] == 3


async def test_the_first_caller_does_not_wait_for_work_queued_after_it() -> None:
    # The caller that ran a batch hands the next one to the oldest waiting call.
    batcher = ThreadBatcher()
    gates = {name: threading.Event() for name in ("one", "two")}
    finished: list[str] = []

    async def submit(name: str) -> None:
        await batcher.run(gates[name].wait, 10)
        finished.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, "one")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(submit, "two")
        await trio.testing.wait_all_tasks_blocked()
        gates["one"].set()
        with trio.fail_after(10):
            while finished != ["one"]:
                await trio.sleep(0.01)
        gates["two"].set()
    assert finished == ["one", "two"]
    assert batcher.batches == 2


async def test_a_cancelled_caller_still_has_its_call_run() -> None:
    batcher = ThreadBatcher()
    gate = threading.Event()
    ran: list[str] = []

    def call(name: str) -> None:
        gate.wait(10)
        ran.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batcher.run, call, "lead")
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as scope:
            scope.cancel()
            # Shielded: a call handed over runs to its end, cancelled or not.
            gate.set()
            await batcher.run(call, "cancelled")
    assert ran == ["lead", "cancelled"]


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch must be at least 1, not 0"):
        ThreadBatcher(max_batch=0)


async def test_max_batch_splits_a_long_queue() -> None:
    batcher = ThreadBatcher(max_batch=2)
    gate = threading.Event()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batcher.run, gate.wait, 10)
        await trio.testing.wait_all_tasks_blocked()
        for i in range(5):
            nursery.start_soon(batcher.run, abs, -i)
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    assert batcher.batches == 1 + 3  # the gate, then 2 + 2 + 1


async def test_batches_run_while_trios_default_threads_are_all_held() -> None:
    # Threads abandoned elsewhere (a hung read cut short at its deadline) keep their
    # tokens of Trio's shared default limiter; the batcher's own limiter is not among them.
    default = trio.to_thread.current_default_thread_limiter()
    release = threading.Event()
    saved = default.total_tokens
    default.total_tokens = 1
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, release.wait, 10)
            await trio.testing.wait_all_tasks_blocked()
            assert default.available_tokens == 0
            batcher = ThreadBatcher()
            with trio.fail_after(5):
                assert await batcher.run(str.upper, "meta") == "META"
            release.set()
    finally:
        release.set()
        default.total_tokens = saved


async def test_a_given_limiter_is_the_one_batches_take() -> None:
    limiter = trio.CapacityLimiter(1)
    batcher = ThreadBatcher(limiter=limiter)
    seen: list[int] = []

    def call() -> str:
        seen.append(limiter.borrowed_tokens)
        return "done"

    assert await batcher.run(call) == "done"
    assert seen == [1] and limiter.borrowed_tokens == 0
