"""Restart and retry delays: exponential, capped, jittered; and a server's Retry-After,
spread. Pure: the random source is passed in."""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["restart_delay", "retry_after_delay"]


def restart_delay(
    failures: int,
    *,
    initial: float,
    factor: float,
    cap: float,
    jitter: float,
    rand: Callable[[], float],
) -> float:
    """Seconds to wait before restarting after the ``failures``-th consecutive crash
    (1-based): ``initial * factor**(failures-1)``, capped at ``cap``, then scaled into
    ``[1 - jitter, 1]`` of that by ``rand()`` (in ``[0, 1)``) so that services crashing
    together do not restart in lockstep."""
    if failures < 1:
        raise ValueError(f"failures must be >= 1, got {failures}")
    try:
        raw = initial * float(factor) ** (failures - 1)
    except OverflowError:  # long past the cap
        raw = math.inf
    return min(cap, raw) * (1.0 - jitter + jitter * rand())


def retry_after_delay(retry_after: float, *, cap: float, rand: Callable[[], float]) -> float:
    """Seconds to wait when the server answered with ``Retry-After: retry_after``: never
    sooner than it asked (``retry_after`` capped at ``cap`` against absurd values), spread
    over one more such interval by ``rand()`` (in ``[0, 1)``), so that the many clients
    one overloaded server told the same number do not all come back in the same second."""
    if not retry_after >= 0:
        raise ValueError(f"retry-after must be >= 0 seconds, got {retry_after}")
    base = min(retry_after, cap)
    return base * (1.0 + rand())
