"""The few async primitives the DRA service needs, on Trio.

``DRAService`` takes them as one object, so a caller that runs the same handlers on
another async library (the grpclib comparison in ``bench/grpc.py``) hands in its own
object of this shape instead; the daemon's code has one path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import trio

__all__ = ["Serializer"]

T = TypeVar("T")


class Serializer:
    """One call at a time, first come first served; worker threads for its blocking file
    I/O; and a shield for the commit sections that must not be torn.

    The threads come from a limiter of its own: with Trio's shared default limiter, other
    blocking callers (the kubernetes client, a busy test client) could hold every token
    while a prepare waits for one under the lock.
    """

    def __init__(self) -> None:
        self._lock = trio.Lock()
        self._threads = trio.CapacityLimiter(2)
        self._claims: dict[str, trio.Event] = {}

    def lock(self) -> trio.Lock:
        return self._lock

    @asynccontextmanager
    async def claim_turn(self, claim_uid: str) -> AsyncIterator[None]:
        """One call at a time for one claim, from planning to the checkpoint on disk.

        The lock covers planning and the spec only, so without this a second call for a
        claim could find it pending and answer before the first call's checkpoint is
        written (or fail it, or remove its spec). Waiting changes nothing, so a call
        cancelled here leaves no trace.
        """
        while (busy := self._claims.get(claim_uid)) is not None:
            await busy.wait()
        done = self._claims[claim_uid] = trio.Event()
        try:
            yield
        finally:
            del self._claims[claim_uid]
            done.set()

    async def run_blocking(self, fn: Callable[..., T], *args: object, inline: bool = False) -> T:
        """Run a blocking filesystem call in a worker thread (or here, when ``inline``); it
        always runs to completion, cancelled or not: never abandoned. These are the CDI spec
        and metadata writes of a prepare or an unprepare, and one finishing after its call
        gave up would leave a spec the state does not know of (a start without a readable
        checkpoint trusts the specs, and would take it for a prepared claim). A write that
        hangs holds its call; a stop then waits for it up to the supervisor's grace period,
        after which the process exits."""
        if inline:
            return fn(*args)
        return await trio.to_thread.run_sync(fn, *args, limiter=self._threads)

    def commit_scope(self) -> trio.CancelScope:
        """A scope the caller shields (``scope.shield = True``) once its commit section
        starts, so a cancellation before that changes nothing and one after it cannot tear
        the section."""
        return trio.CancelScope()
