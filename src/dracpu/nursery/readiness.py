"""The daemon's one readiness source.

``Readiness`` holds, per component (``kubelet-registration``, ``nri``, ``slices``),
whether it is ready and, when it is not, why. The services that know set it through a
``ReadyFlag`` (their component's handle), the supervisor marks a crashed service's
component down, and everything that wants to know reads or waits here:

- ``/readyz`` reads ``components()`` and ``reasons()`` through a ``ReadinessView``;
- ``heap.settle_when_ready`` and tests ``await wait_ready()``, woken by the change that
  made the last component ready (a ``Pulse``), never by a timer;
- ``/debug/state`` shows ``components()``.

No component is read by polling an attribute of the service: a service that knows a
change sets its flag in the same step as the change.
"""

from __future__ import annotations

from collections.abc import Mapping

from dracpu.gofmt import go_quote
from dracpu.logs import get_logger
from dracpu.nursery.pulse import Pulse

__all__ = ["DEFAULT_REASON", "Readiness", "ReadinessView", "ReadyFlag"]

log = get_logger(__name__)

# What /readyz says about a declared component that has not said anything yet.
DEFAULT_REASON = "not ready yet"


class Readiness:
    """Component → ready, with the reason of each one that is not. All on the Trio
    thread; nothing here awaits except the ``wait_*`` methods."""

    def __init__(self) -> None:
        self._ready: dict[str, bool] = {}
        self._reasons: dict[str, str] = {}
        self._changed = Pulse()

    def declare(self, name: str, reason: str = DEFAULT_REASON) -> ReadyFlag:
        """Declare a component that must be ready before the daemon is (not ready, for
        ``reason``), and return its flag. Declaring a known component again changes
        nothing and returns a flag for it."""
        if not name:
            raise ValueError("a readiness component needs a name")
        if name not in self._ready:
            self._ready[name] = False
            self._reasons[name] = reason or DEFAULT_REASON
            self._changed.fire()
        return ReadyFlag(self, name)

    def set(self, name: str, ready: bool, reason: str = "") -> None:
        """Record a component's readiness; ``reason`` says why it is not ready. Waiters
        wake when it changed. An undeclared component is a bug in the caller."""
        if name not in self._ready:
            raise KeyError(f"readiness component {go_quote(name)} was never declared")
        reason = "" if ready else (reason or "not ready")
        if ready != self._ready[name]:
            log.info("readiness changed", v=2, component=name, ready=ready, reason=reason)
        elif reason == self._reasons[name]:
            return
        self._ready[name] = ready
        self._reasons[name] = reason
        self._changed.fire()

    def mark_down(self, name: str, reason: str) -> None:
        """A declared component is not ready any more (its service crashed); nothing for
        a name that is no component."""
        if name in self._ready:
            self.set(name, False, reason)

    def components(self) -> dict[str, bool]:
        """Every declared component and whether it is ready, in declaration order."""
        return dict(self._ready)

    def reasons(self) -> dict[str, str]:
        """Why each component is not ready ("" for one that is)."""
        return dict(self._reasons)

    @property
    def ready(self) -> bool:
        """Every declared component is ready (vacuously true before any is declared)."""
        return all(self._ready.values())

    def is_ready(self, name: str) -> bool:
        return self._ready.get(name, False)

    async def wait_ready(self) -> None:
        """Return once every declared component is ready (at once if they are)."""
        await self._changed.wait_until(lambda: self.ready)

    async def wait_component(self, name: str) -> None:
        """Return once component ``name`` is ready."""
        await self._changed.wait_until(lambda: self._ready.get(name, False))

    def view(self) -> ReadinessView:
        return ReadinessView(self)


class ReadyFlag:
    """One component's handle, held by the service that knows when it is ready."""

    __slots__ = ("_readiness", "name")

    def __init__(self, readiness: Readiness, name: str) -> None:
        self._readiness = readiness
        self.name = name

    @classmethod
    def standalone(cls, name: str, reason: str = DEFAULT_REASON) -> ReadyFlag:
        """A flag in a readiness of its own: for a service run without a supervisor
        (tests, tools), so it never has to ask whether it has a flag."""
        return Readiness().declare(name, reason)

    def set_ready(self) -> None:
        self._readiness.set(self.name, True)

    def set_not_ready(self, reason: str) -> None:
        self._readiness.set(self.name, False, reason)

    def set(self, ready: bool, reason: str = "") -> None:
        self._readiness.set(self.name, ready, reason)

    @property
    def ready(self) -> bool:
        return self._readiness.is_ready(self.name)

    @property
    def reason(self) -> str:
        return self._readiness.reasons().get(self.name, "")

    async def wait_ready(self) -> None:
        await self._readiness.wait_component(self.name)


class ReadinessView:
    """What ``/readyz``, the heap settling and ``/debug/state`` may do with readiness:
    read it and wait for it, never set it."""

    __slots__ = ("_readiness",)

    def __init__(self, readiness: Readiness) -> None:
        self._readiness = readiness

    def components(self) -> Mapping[str, bool]:
        return self._readiness.components()

    def reasons(self) -> Mapping[str, str]:
        return self._readiness.reasons()

    @property
    def ready(self) -> bool:
        return self._readiness.ready

    async def wait_ready(self) -> None:
        await self._readiness.wait_ready()
