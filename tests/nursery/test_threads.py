"""``run_to_completion``: a commit section in a worker thread is not cut short by a
cancellation, but a stop waits for it ``bound`` seconds at most; a cancellation before the
thread began runs nothing; the limiter keeps a left-behind thread from being overtaken."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from dracpu.nursery.threads import STOP_BOUND, run_to_completion


class Gate:
    """A blocking call that waits for ``open``; records that it ran."""

    def __init__(self) -> None:
        self.entered, self.opened = threading.Event(), threading.Event()
        self.ran = 0

    def __call__(self, value: int) -> int:
        self.entered.set()
        self.opened.wait(timeout=30)
        self.ran += 1
        return value * 2


async def test_without_a_cancellation_it_is_a_plain_call() -> None:
    def fail() -> None:
        raise OSError(5, "Input/output error")

    limiter = trio.CapacityLimiter(1)
    assert await run_to_completion(lambda: 21 * 2, limiter=limiter) == 42
    with pytest.raises(OSError, match="Input/output error"):
        await run_to_completion(fail, limiter=limiter)


async def test_a_cancelled_call_that_finishes_within_the_bound_returns_its_result(
    mock_clock: trio.testing.MockClock,
) -> None:
    # The clock stands still: only the thread's end can wake the wait.
    gate = Gate()
    got: list[int] = []
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def write() -> None:
                got.append(await run_to_completion(gate, 7, limiter=trio.CapacityLimiter(1)))
                await trio.sleep(0)  # the next checkpoint: the stop reaches the caller here
                got.append(-1)

            nursery.start_soon(write)
            await trio.to_thread.run_sync(gate.entered.wait)
            scope.cancel()
            gate.opened.set()
    assert got == [14] and gate.ran == 1
    assert scope.cancelled_caught


async def test_a_stop_waits_for_a_hung_call_the_bound_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate = Gate()
    limiter = trio.CapacityLimiter(1)
    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: run_to_completion(gate, 1, limiter=limiter, bound=2.5))
                await trio.to_thread.run_sync(gate.entered.wait)
                start = trio.current_time()
                scope.cancel()
        assert trio.current_time() - start == 2.5
        assert limiter.borrowed_tokens == 1  # the thread left behind still holds it
    finally:
        gate.opened.set()
    async with limiter:  # free once that thread really ended
        assert gate.ran == 1


async def test_cancelled_before_the_thread_began_it_runs_nothing() -> None:
    gate = Gate()
    limiter = trio.CapacityLimiter(1)
    async with limiter:  # another call holds the one thread
        with trio.move_on_after(0.05) as waited:
            await run_to_completion(gate, 1, limiter=limiter)
    assert waited.cancelled_caught
    await trio.sleep(0.1)
    assert gate.ran == 0 and not gate.entered.is_set()


async def test_a_bad_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="bound must be >= 0 seconds, got -1"):
        await run_to_completion(int, limiter=trio.CapacityLimiter(1), bound=-1)


def test_the_stop_bound_fits_in_the_grace_period() -> None:
    from dracpu.nursery import DEFAULT_GRACE_PERIOD

    assert 0 < STOP_BOUND < DEFAULT_GRACE_PERIOD
