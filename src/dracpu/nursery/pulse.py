"""``Pulse``: the daemon's one shape of "something changed, look again".

A ``trio.Event`` is set once and stays set, so code that wakes waiters on every change
had been writing the same two lines in several places: set the event, then put a fresh
one in its place. ``Pulse`` is those two lines, named. A task that waits is woken by the
next ``fire()`` after it started waiting, never by an earlier one, so the waiting side is
always a loop over the condition it cares about::

    while not self.registered:
        await self._changed.wait()

(``wait_until`` is that loop.) Nothing is polled: a waiter sleeps until a change is
announced, and no change goes unannounced as long as every writer of the condition fires.

A waiter that must not miss a fire that happens while it is busy elsewhere (a wake-up
asked for during a check, a window update during a flush) notes ``fired`` first and then
waits with ``wait_past(noted)``, which returns at once if a fire came in between: the
same pulse serves the "wake me up" requests that used to be an event set early and
replaced after the wait.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

__all__ = ["Pulse"]


class Pulse:
    """Wakes every task waiting at the moment of ``fire()``; later waiters wait for the
    next one. ``fired`` counts the fires (for tests and debug output)."""

    __slots__ = ("_event", "fired")

    def __init__(self) -> None:
        self._event = trio.Event()
        self.fired = 0

    def fire(self) -> None:
        """Wake the current waiters. Does not await, so it may be called anywhere on the
        Trio thread, including in the middle of a state change that must not yield."""
        self.fired += 1
        event, self._event = self._event, trio.Event()
        event.set()

    async def wait(self) -> None:
        """Sleep until the next ``fire()``."""
        await self._event.wait()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds (at once when it already does), looking again
        after each ``fire()`` only."""
        while not condition():
            await self._event.wait()

    async def wait_past(self, noted: int) -> None:
        """Return once there was a ``fire()`` after ``fired`` was ``noted`` (at once if
        there already was)."""
        if self.fired == noted:
            await self._event.wait()
