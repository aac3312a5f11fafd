"""Fault injection and call counting for the simulated API server. Pure.

Verbs are the Kubernetes verbs (get, list, watch, create, update, patch, delete,
deletecollection); resources are plural names with an optional subresource
(``resourceclaims/status``). ``"*"`` matches any verb or resource.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

__all__ = ["CallCounter", "Fault", "FaultInjector"]


@dataclass(slots=True)
class Fault:
    verb: str
    resource: str
    remaining: int
    status: int = 500
    drop_connection: bool = False
    message: str = ""

    def matches(self, verb: str, resource: str) -> bool:
        return self.verb in ("*", verb) and self.resource in ("*", resource)


class FaultInjector:
    def __init__(self) -> None:
        self._faults: list[Fault] = []

    def inject(
        self,
        verb: str,
        resource: str,
        count: int = 1,
        *,
        status: int = 500,
        drop_connection: bool = False,
        message: str = "",
    ) -> Fault:
        """Make the next ``count`` matching calls fail with ``status`` (a Status body of
        that code) or, with ``drop_connection``, by closing the connection unanswered."""
        if count < 1:
            raise ValueError(f"fault count must be at least 1, got {count}")
        if not drop_connection and not 400 <= status <= 599:
            raise ValueError(f"fault status must be an HTTP error code, got {status}")
        fault = Fault(verb, resource, count, status, drop_connection, message)
        self._faults.append(fault)
        return fault

    def take(self, verb: str, resource: str) -> Fault | None:
        """The fault for this call, if any; consumes one of its remaining uses."""
        for fault in self._faults:
            if fault.matches(verb, resource):
                fault.remaining -= 1
                if fault.remaining == 0:
                    self._faults.remove(fault)
                return fault
        return None

    def pending(self) -> int:
        return sum(f.remaining for f in self._faults)

    def clear(self) -> None:
        self._faults.clear()


class CallCounter:
    """Calls per (verb, resource) that reached the server, failed ones included."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()

    def record(self, verb: str, resource: str) -> None:
        self._counts[(verb, resource)] += 1

    def get(self, verb: str, resource: str) -> int:
        if verb == "*" or resource == "*":
            return sum(
                n for (v, r), n in self._counts.items() if verb in ("*", v) and resource in ("*", r)
            )
        return self._counts[(verb, resource)]

    def snapshot(self) -> dict[str, int]:
        """``{"list resourceslices": 3, ...}``, sorted."""
        return {f"{v} {r}": n for (v, r), n in sorted(self._counts.items())}

    def reset(self) -> None:
        self._counts.clear()
