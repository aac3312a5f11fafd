"""Fault injection and call counting for the simulated API server. Pure: where time
matters (the rate limit, the request log) the caller passes it in.

Verbs are the Kubernetes verbs (get, list, watch, create, update, patch, delete,
deletecollection); resources are plural names with an optional subresource
(``resourceclaims/status``). ``"*"`` matches any verb or resource.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

__all__ = ["CallCounter", "Fault", "FaultInjector", "RateLimit", "RequestLog", "RequestRecord"]


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


@dataclass(slots=True)
class RateLimit:
    """A token bucket standing for the server's capacity (API Priority and Fairness
    rejecting what its queues cannot hold): ``rate`` requests a second on average,
    ``burst`` at once; a request over it is answered 429 with ``Retry-After``."""

    rate: float
    burst: float
    retry_after: int = 1
    tokens: float = 0.0
    last: float | None = None
    rejected: int = 0

    def admit(self, now: float) -> bool:
        if self.last is None:
            self.tokens = self.burst
        else:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        self.rejected += 1
        return False


class FaultInjector:
    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self.rate_limit: RateLimit | None = None

    def limit_rate(self, rate: float, *, burst: float, retry_after: int = 1) -> RateLimit:
        """Answer 429 (``Retry-After: retry_after``) to requests over ``rate`` per second
        with bursts of ``burst``; every verb counts, watches included (APF admits a
        watch like any other request). Replaces an earlier limit."""
        if not rate > 0 or not burst >= 1:
            raise ValueError(f"rate limit needs rate > 0 and burst >= 1, got {rate}, {burst}")
        if retry_after < 0:
            raise ValueError(f"retry-after must be >= 0 seconds, got {retry_after}")
        self.rate_limit = RateLimit(rate, burst, retry_after)
        return self.rate_limit

    def throttle(self, now: float) -> int | None:
        """The ``Retry-After`` to answer with when the rate limit rejects this request."""
        limit = self.rate_limit
        if limit is None or limit.admit(now):
            return None
        return limit.retry_after

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
        self.rate_limit = None


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


@dataclass(frozen=True, slots=True)
class RequestRecord:
    time: float
    verb: str
    resource: str
    user_agent: str
    status: int  # 200 for a watch that started streaming; 0 for a dropped connection
    size: int = 0  # bytes of the response body; 0 for a watch (its events are not counted)


class RequestLog:
    """Every request that reached the handler, in order, with its ``User-Agent`` (the
    simulated fleet tells its nodes apart by it, as an audit log does)."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def record(
        self, time: float, verb: str, resource: str, user_agent: str, status: int, size: int = 0
    ) -> None:
        self.records.append(RequestRecord(time, verb, resource, user_agent, status, size))

    def since(self, start: float, end: float | None = None) -> list[RequestRecord]:
        """Records with ``start <= time < end`` (to the last one without ``end``)."""
        return [r for r in self.records if r.time >= start and (end is None or r.time < end)]

    def __len__(self) -> int:
        return len(self.records)
