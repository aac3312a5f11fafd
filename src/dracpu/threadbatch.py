"""Blocking calls from Trio, those that queue up together run in one worker-thread job.

Handing a call to a worker thread and its result back costs more than a small file
operation: a lock release that wakes the thread, a wake-up of the Trio thread, and under
load a handover of the interpreter lock for every system call either thread makes while
the other one wants it. In a node drain (64 claims prepared and unprepared at once) the
device metadata files of every claim made two such hops per claim. ``ThreadBatcher`` runs
every call queued while a batch is in a thread as the next batch, in order, in one hop.

There is no background task: the first caller runs the batch and, once its own call is
done, hands the turn to the oldest waiting caller, so no caller waits on work queued
after its own batch. The calls must be short and bounded (file operations): a caller
waits for its batch shielded from cancellation, as a call handed to a worker thread
cannot be taken back anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Generic, TypeVar

import outcome
import trio

__all__ = ["ThreadBatcher"]

T = TypeVar("T")


class _Call(Generic[T]):
    __slots__ = ("fn", "result", "woken")

    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.result: outcome.Outcome[T] | None = None
        self.woken = trio.Event()


def _run_all(batch: list[_Call[Any]]) -> None:
    for call in batch:
        call.result = outcome.capture(call.fn)


class ThreadBatcher:
    """Run blocking calls in a worker thread, one batch at a time, in submission order."""

    def __init__(self, *, max_batch: int = 64, limiter: trio.CapacityLimiter | None = None) -> None:
        """``limiter``: where the batches take their worker thread; one of its own by
        default. Never Trio's default pool, which callers share with threads abandoned
        elsewhere (a hung read cut short at its deadline keeps its token): once those hold
        every token, a batch, and every caller shielded behind it, would wait forever."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self._max_batch = max_batch
        # One batch at a time runs, so one token is all it ever needs.
        self._limiter = limiter if limiter is not None else trio.CapacityLimiter(1)
        self._queue: list[_Call[Any]] = []
        self._busy = False
        self.batches = 0  # batches run so far (for tests and benchmarks)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in a worker thread, with whatever else is queued; its result or
        its exception."""
        call: _Call[T] = _Call(partial(fn, *args))
        self._queue.append(call)
        with trio.CancelScope(shield=True):
            if self._busy:
                await call.woken.wait()  # done, or our turn to run the next batch
            if call.result is None:
                await self._run_batches_until(call)
        assert call.result is not None
        return call.result.unwrap()

    async def _run_batches_until(self, call: _Call[Any]) -> None:
        self._busy = True
        try:
            while call.result is None:
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
                try:
                    await trio.to_thread.run_sync(_run_all, batch, limiter=self._limiter)
                except Exception as exc:  # no thread to run them in: each call fails
                    for failed in batch:
                        failed.result = failed.result or outcome.Error(exc)
                self.batches += 1
                for done in batch:
                    done.woken.set()
        finally:
            if self._queue:
                self._queue[0].woken.set()  # the oldest waiting call runs the next batch
            else:
                self._busy = False
