"""What the cgroupfs writer and the drift watcher may ask of the state owner, and the one
rule every cgroupfs write follows: is this set still wanted?

The owner's view is read-only and is asked on the Trio thread only (the owner's tables
change only there, so an answer is one consistent instant). The writer asks right before
each batch of writes, after it read the cgroups back: a set the runtime applied for a
newer intent reads back as "differs" too, and asking after the read keeps it from being
overwritten with the older one. Pure functions over the view; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from dracpu.cpuset import CPUSet
from dracpu.messages import ContainerIntent

__all__ = ["IntentView", "still_wanted", "strangers_still_unknown"]


class IntentView(Protocol):
    """The state owner's read-only answers (Trio thread only); ``state.view.NodeView`` is
    the daemon's, tests bring their own."""

    def intents(self) -> Iterable[ContainerIntent]:
        """Every known container and pod sandbox with the set it should run on."""
        ...

    def intents_of(self, ids: Iterable[str]) -> Mapping[str, ContainerIntent]:
        """:meth:`intents` for these ids only; unknown ids (and containers with nothing to
        run on) are left out."""
        ...

    def still_wanted(self, intents: Iterable[ContainerIntent]) -> list[ContainerIntent]:
        """Those of ``intents`` the owner still wants on exactly that set (same ``cpus``,
        and same ``mems`` when the intent sets them), in order."""
        ...

    @property
    def shared_pool(self) -> CPUSet: ...

    @property
    def has_synchronized(self) -> bool:
        """Whether the owner's list of containers is complete enough to call a cgroup
        unknown: false until the runtime's first Synchronize, when every container is
        unknown to a freshly started daemon and confining them would move claim holders
        onto the shared pool."""
        ...


def still_wanted(view: IntentView, intents: Sequence[ContainerIntent]) -> list[ContainerIntent]:
    """The intents whose container (or sandbox) the owner still wants on exactly that set:
    anything it stopped tracking or moved elsewhere meanwhile is left out."""
    return view.still_wanted(intents) if intents else []


def strangers_still_unknown(
    view: IntentView, strangers: Sequence[ContainerIntent]
) -> list[ContainerIntent]:
    """Container cgroups nobody intends anything for, each about to be confined to the pool
    it was found off (its ``cpus``): those the owner still does not know, provided it knows
    every container and the pool is still that set. A container created while the walk ran
    is known by now and keeps its CPUs; after a pool change the next check confines again."""
    if not strangers or not view.has_synchronized:
        return []
    pool = view.shared_pool.format()
    known = view.intents_of(s.container_id for s in strangers)
    return [s for s in strangers if s.container_id not in known and s.cpus == pool]
