"""Read-only views with fixed content, for tests of the HTTP endpoints: what the daemon's
``ReadinessView`` and debug view give ``HTTPApp``, without a daemon."""

from __future__ import annotations

from collections.abc import Mapping

from dracpu.nursery import Readiness, ReadinessView


def fixed_readiness(
    ready: Mapping[str, bool], reasons: Mapping[str, str] | None = None
) -> ReadinessView:
    """A real readiness source holding ``ready`` (component -> ready) with ``reasons``."""
    readiness = Readiness()
    for name, ok in ready.items():
        readiness.declare(name).set(ok, (reasons or {}).get(name, ""))
    return readiness.view()


class FixedDebug:
    """A debug view that always shows ``doc``."""

    def __init__(self, doc: object = None) -> None:
        self.doc = {} if doc is None else doc

    def debug_state(self) -> object:
        return self.doc
