"""Blocking calls in worker threads, by what a cancellation (a stop) may do to them.

Every service's task must end soon after the supervisor cancels it, and a task waiting
for a worker thread cannot end before the thread does unless the thread is abandoned. So
each blocking call in the daemon is one of two kinds:

- **Safe to leave behind** (reads, writes that are idempotent or replace a whole file):
  ``trio.to_thread.run_sync(..., abandon_on_cancel=True)``. The task ends at once; the
  thread finishes on its own, and what it does is harmless whenever it lands.
- **Must complete** (a commit section: the checkpoint's write and fsyncs, an interrupt
  pass whose record and masks go together): ``run_to_completion``. A cancellation does
  not cut it short, as a shield would not, but a stop waits for it ``bound`` seconds at
  most (a hung disk), so the daemon still stops within its grace period.

Either way a caller whose thread may outlive it passes a ``CapacityLimiter(1)`` of its
own: Trio releases a limiter only when the thread really ends, so the next call cannot
start beside (or overtake) one that was left behind.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Final, TypeVar

import outcome
import trio

__all__ = ["STOP_BOUND", "run_to_completion"]

T = TypeVar("T")

# How long a stop waits for a call that must complete: under the supervisor's 5 s grace.
STOP_BOUND: Final = 4.0


async def run_to_completion(
    fn: Callable[..., T],
    *args: object,
    limiter: trio.CapacityLimiter,
    bound: float = STOP_BOUND,
) -> T:
    """``fn(*args)`` in a worker thread, and its result, even when the caller is cancelled
    meanwhile, provided it finishes within ``bound`` seconds of the cancellation; after
    that the thread is left to finish alone and ``trio.Cancelled`` propagates.

    Without a cancellation it waits as long as ``fn`` takes (no deadline of its own). A
    result returned after a cancellation leaves the caller's scope cancelled: its next
    checkpoint raises. A cancellation before the thread started runs nothing.
    """
    if not bound >= 0:
        raise ValueError(f"bound must be >= 0 seconds, got {bound}")
    token = trio.lowlevel.current_trio_token()
    # Whether the thread began fn, or the caller gave up before it did: decided once,
    # under the lock, so fn runs only while someone may still wait for it.
    decided = threading.Lock()
    began: list[bool] = []
    finished = trio.Event()
    result: list[outcome.Outcome[T]] = []

    def call() -> None:
        with decided:
            if began:  # [False]: the caller gave up before this thread got here
                return
            began.append(True)
        try:
            result.append(outcome.capture(fn, *args))
        finally:
            # The run may be over by now (the thread outlived a stop): nothing to wake.
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(finished.set)

    try:
        await trio.to_thread.run_sync(call, abandon_on_cancel=True, limiter=limiter)
    except trio.Cancelled:
        with decided:
            if not began:
                began.append(False)
                raise
        with trio.CancelScope(shield=True), trio.move_on_after(bound):
            await finished.wait()
        if not result:
            raise
    return result[0].unwrap()
