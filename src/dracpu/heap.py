"""The garbage collector, settled once the daemon has started.

By the time every service runs, the process holds a few hundred thousand objects that
live as long as it does: modules (the kubernetes client alone is ~100k), the topology,
the device inventory, compiled protobuf descriptors. Python's cyclic collector walks
them again on every full collection, and its youngest generation is collected every
700 net container allocations, which a busy gRPC connection passes a few times per call.
In a node drain (64 prepares and unprepares in flight) that was ~4% of the daemon's CPU
and found nothing to free: the daemon's hot paths make no reference cycles to speak of.

``settle()`` collects once, moves everything alive into the permanent generation
(``gc.freeze``), which no collection walks again, and raises the youngest generation's
threshold. Cyclic garbage made later is still collected, in bigger batches: at most
``GEN0_THRESHOLD`` objects wait for a collection (a few hundred KiB).

That one full collection blocks the event loop for 0.1-0.3 s on a busy node, so
``dracpu run`` does it off the path to readiness: ``settle_when_ready``, a one-shot
service under the root supervisor, waits on the daemon's readiness (woken by the report
that made the last component ready; at most ``READY_WAIT`` seconds), then settles.

Large requests are the other side of it. A 4 MiB gRPC message passes through several
buffers of its size (its pieces, the joined message, the protobuf's strings, the error
text quoting it). glibc serves the first from mmap and gives it back on free, then raises
its mmap threshold to that size (up to 32 MiB), so later ones come from the heap, and
from one arena per thread that touched them, where freed space stays resident; and the
cyclic garbage a failed call leaves (an exception, its traceback and the frames holding the
request) waits for a collection that, with the threshold above, can be far off. Measured:
16 connections sending 4 MiB claim names left the server at 207 MB idle (69 MB before),
134 MB after a collection and ``malloc_trim``. ``Reclaimer`` hands that memory back once
a burst of large requests is over: a collection on the event loop (objects frozen at
start-up are not walked) and ``malloc_trim(0)`` in a worker thread, at most once per
``RELEASE_INTERVAL``, so a flood of large requests costs one release every few seconds.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import math
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from dracpu.logs import get_logger

__all__ = [
    "GEN0_THRESHOLD",
    "LARGE_REQUEST",
    "READY_WAIT",
    "RECLAIMER",
    "RELEASE_AFTER",
    "RELEASE_INTERVAL",
    "RELEASE_QUIET",
    "Reclaimer",
    "release_memory",
    "settle",
    "settle_when_ready",
]

GEN0_THRESHOLD = 10_000
READY_WAIT = 60.0
# A request (or a discarded part of one) this large counts towards a release; smaller ones
# come and go from pools the allocator reuses.
LARGE_REQUEST = 64 * 1024
# Large requests adding up to this make a release due: one maximal message does.
RELEASE_AFTER = 1024 * 1024
# The burst is over when no large request has ended for this long...
RELEASE_QUIET = 0.25
# ...and releases are this far apart at least; under a flood, one comes every interval.
RELEASE_INTERVAL = 3.0
log = get_logger("dracpu.heap")


def settle() -> None:
    """Freeze what start-up built and collect young objects less often (call once)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)


class Readiness(Protocol):
    """What the settling waits on: ``dracpu.nursery.ReadinessView``."""

    async def wait_ready(self) -> None: ...


async def settle_when_ready(
    readiness: Readiness,
    *,
    settle: Callable[[], None] = settle,
    wait: float = READY_WAIT,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Settle once the daemon is ready, or after ``wait`` seconds if it never is.

    A one-shot service: started at once (it is on nobody's path), it sleeps until the
    readiness source says every component is ready, settles and returns.
    """
    task_status.started()
    with trio.move_on_after(wait):
        await readiness.wait_ready()
    settle()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def _trim_heap() -> None:
    trim = _malloc_trim()
    if trim is not None:
        # Returns every free page of every arena to the kernel, not only the heap's top.
        trim(0)


async def release_memory() -> None:
    """Collect cyclic garbage, then give free heap pages back to the kernel.

    The collection runs here, on the event loop: finalizers it triggers may touch Trio
    objects, and in a worker thread it would hold the interpreter all the same. Objects
    frozen by ``settle`` are not walked. ``malloc_trim`` releases the interpreter (a
    ctypes call), so it runs in a worker thread: it walks every arena, a few ms. Abandoned
    when cancelled: it changes nothing the daemon holds (it only hands free pages back),
    so shutdown never waits for it.
    """
    gc.collect()
    await trio.to_thread.run_sync(_trim_heap, abandon_on_cancel=True)


class Reclaimer:
    """Releases memory (``release_memory``) after a burst of large requests.

    The gRPC shell calls ``note`` with the size of each large request whose call ended
    and of each large part of a request it discarded; when ``note`` says so, it starts
    ``release_when_due`` in a nursery that outlives the connection. The release comes
    once large requests add up to ``after`` bytes, none has ended for ``quiet`` seconds
    (or ``interval`` seconds have passed since the first of them, under a flood), and the
    last release is ``interval`` seconds ago. One reclaimer serves the whole process.
    """

    def __init__(
        self,
        *,
        large: int = LARGE_REQUEST,
        after: int = RELEASE_AFTER,
        quiet: float = RELEASE_QUIET,
        interval: float = RELEASE_INTERVAL,
        release: Callable[[], object] = release_memory,
    ) -> None:
        self.large, self.after = large, after
        self.quiet, self.interval = quiet, interval
        self._release = release
        self._pending = 0  # bytes of large requests since the last release
        self._first = math.inf  # when the first of them was noted
        self._last = -math.inf  # when the last of them was noted
        self._released_at = -math.inf
        self._scheduled = False
        self._run: object = None  # the Trio run whose clock the times above are on
        self.releases = 0

    def note(self, size: int) -> bool:
        """Count a large request that ended; true when a ``release_when_due`` task should
        start (none is waiting yet and a release is due). Cheap, does not await."""
        if size < self.large:
            return False
        run = trio.lowlevel.current_root_task()
        if run is not self._run:
            # Another trio.run (tests run many, some on a mock clock): start afresh.
            self._run, self._pending, self._released_at = run, 0, -math.inf
            self._scheduled = False
        now = trio.current_time()
        if not self._pending:
            self._first = now
        self._pending += size
        self._last = now
        if self._scheduled or self._pending < self.after:
            return False
        self._scheduled = True
        return True

    def _due(self) -> float:
        burst_over = min(self._last + self.quiet, self._first + self.interval)
        return max(burst_over, self._released_at + self.interval)

    async def release_when_due(self) -> None:
        """Wait until the burst is over and the interval has passed, then release; again
        if large requests that ended meanwhile make another release due."""
        try:
            while self._pending >= self.after:
                while trio.current_time() < (due := self._due()):
                    await trio.sleep_until(due)
                self._pending, self._first = 0, math.inf
                self._released_at = trio.current_time()
                self.releases += 1
                try:
                    result = self._release()
                    if isinstance(result, Awaitable):
                        await result
                except Exception as exc:
                    # Runs in a listener's nursery: a failed release must not end it.
                    log.warning("releasing memory after large requests failed", err=str(exc))
        finally:
            self._scheduled = False


# The process's reclaimer: every gRPC listener notes its large requests here.
RECLAIMER = Reclaimer()
