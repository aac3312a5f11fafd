"""Restart delays: exponential, capped, jittered. Pure: the random source is passed in."""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["restart_delay"]


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
