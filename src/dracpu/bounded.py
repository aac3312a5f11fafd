"""A dict used as a cache that never grows past a bound: when full it starts over.

Every cache of the daemon keeps a few hot entries (the shared pool's text, a claim's CPUs,
the cgroups of running containers) that are refilled at once after a reset, so forgetting
everything at the bound is cheaper than tracking recency, and input of any size can make
it hold at most ``limit`` entries.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["remember"]

K = TypeVar("K")
V = TypeVar("V")


def remember(cache: dict[K, V], key: K, value: V, limit: int) -> V:
    """Put ``value`` under ``key`` (emptying ``cache`` first when it holds ``limit``
    entries); returns ``value``."""
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value
    return value
