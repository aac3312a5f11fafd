"""The few async primitives the DRA service needs, for Trio and for asyncio.

The daemon runs the DRA handlers on Trio. The benchmark also runs the very same handler
objects on grpclib's asyncio server (issue #5 item 7), so the lock, the worker-thread
offload and the shield are picked by the async library that is running the call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

import sniffio
import trio

__all__ = ["Serializer", "shielded"]

T = TypeVar("T")


def _on_trio() -> bool:
    return sniffio.current_async_library() == "trio"


class Serializer:
    """One call at a time, first come first served (a Trio lock or an asyncio lock), and
    worker threads for its blocking file I/O.

    The threads come from a limiter of its own: with Trio's shared default limiter, other
    blocking callers (the kubernetes client, a busy test client) could hold every token
    while a prepare waits for one under the lock.
    """

    def __init__(self) -> None:
        self._trio: trio.Lock | None = None
        self._asyncio: asyncio.Lock | None = None
        self._threads: trio.CapacityLimiter | None = None

    def lock(self) -> trio.Lock | asyncio.Lock:
        if _on_trio():
            if self._trio is None:
                self._trio = trio.Lock()
            return self._trio
        if self._asyncio is None:
            self._asyncio = asyncio.Lock()
        return self._asyncio

    async def run_blocking(self, fn: Callable[..., T], *args: object, inline: bool = False) -> T:
        """Run a blocking filesystem call in a worker thread (or here, when ``inline``); it
        always runs to completion."""
        if inline:
            return fn(*args)
        if _on_trio():
            if self._threads is None:
                self._threads = trio.CapacityLimiter(2)
            return await trio.to_thread.run_sync(fn, *args, limiter=self._threads)
        return await asyncio.to_thread(fn, *args)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Under Trio, keep a commit section from being torn by cancellation."""
    if _on_trio():
        with trio.CancelScope(shield=True):
            yield
    else:
        yield
