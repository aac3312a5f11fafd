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
``dracpu run`` does it off the path to readiness: ``settle_when_ready`` waits until the
daemon is ready (at most ``READY_WAIT`` seconds), then settles.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import trio

from dracpu.logs import get_logger

__all__ = ["GEN0_THRESHOLD", "READY_WAIT", "settle", "settle_when_ready"]

GEN0_THRESHOLD = 10_000
READY_WAIT = 60.0
_POLL = 0.5
log = get_logger("dracpu.heap")


def settle() -> None:
    """Freeze what start-up built and collect young objects less often (call once)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)


async def settle_when_ready(
    ready: Callable[[], bool], *, settle: Callable[[], None] = settle, wait: float = READY_WAIT
) -> None:
    """Settle once ``ready()`` holds, or after ``wait`` seconds if it never does.

    Runs as a Trio system task, where an exception would end the whole run: a failing
    ``ready()`` is logged and counts as ready.
    """
    with trio.move_on_after(wait):
        while True:
            try:
                if ready():
                    break
            except Exception as exc:
                log.warning("readiness check failed; settling the heap now", err=str(exc))
                break
            await trio.sleep(_POLL)
    settle()
