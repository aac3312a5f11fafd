"""What a supervised service is: its run function, restart policy and reported status.

``Service`` is the description the daemon hands to ``Supervisor.start``; ``ServiceStatus``
is what the supervisor reports back for it (``/debug/state``).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import msgspec

from dracpu.gofmt import go_quote

__all__ = [
    "Service",
    "ServiceBlocked",
    "ServiceFailed",
    "ServiceRun",
    "ServiceState",
    "ServiceStatus",
    "SupervisorStopping",
]

ServiceState = Literal["starting", "running", "backoff", "stopped", "failed"]
ServiceRun = Callable[..., Awaitable[object]]


class ServiceFailed(Exception):
    """A service failed for good (no restarts left) before it signalled it had started."""

    def __init__(self, name: str, error: str) -> None:
        super().__init__(f"service {go_quote(name)} failed to start: {error}")
        self.name = name
        self.error = error


class ServiceBlocked(Exception):
    """Something outside the daemon keeps a service from running (another process holds
    its port). The message says what and what to do about it, so the supervisor logs it as
    one line, without a traceback, and retries with the service's backoff."""


class SupervisorStopping(RuntimeError):
    """``start`` was called while the supervisor is shutting down."""


@dataclass(frozen=True, kw_only=True)
class Service:
    """One long-lived part of the daemon and how to keep it alive.

    ``run`` is called as ``await run(task_status=...)``; it calls
    ``task_status.started(value)`` once it serves. Restarts follow ``restart_delay``:
    ``backoff_initial * backoff_factor**(n-1)`` capped at ``backoff_cap``, jittered down
    by up to ``backoff_jitter`` of itself. ``max_restarts`` bounds restarts *in a row*: a
    run that lasted ``stable_after`` seconds resets the count. A ``critical`` service that
    fails for good stops the daemon with exit code 1. ``grace_period`` (None: the
    supervisor's) is how long it may take to stop once cancelled.
    """

    name: str
    run: ServiceRun
    restart: bool = True
    backoff_initial: float = 0.5
    backoff_factor: float = 2.0
    backoff_cap: float = 30.0
    backoff_jitter: float = 0.2
    max_restarts: int | None = None
    stable_after: float = 60.0
    critical: bool = False
    grace_period: float | None = None

    def __post_init__(self) -> None:
        problems = []
        if not self.name:
            problems.append("name must not be empty")
        if not (math.isfinite(self.backoff_initial) and self.backoff_initial >= 0):
            problems.append(f"backoff_initial must be >= 0, got {self.backoff_initial}")
        if not (math.isfinite(self.backoff_factor) and self.backoff_factor >= 1):
            problems.append(f"backoff_factor must be >= 1, got {self.backoff_factor}")
        if not self.backoff_cap >= self.backoff_initial:
            problems.append(
                f"backoff_cap ({self.backoff_cap}) must be >= backoff_initial "
                f"({self.backoff_initial})"
            )
        if not 0 <= self.backoff_jitter <= 1:
            problems.append(f"backoff_jitter must be within [0, 1], got {self.backoff_jitter}")
        if self.max_restarts is not None and self.max_restarts < 0:
            problems.append(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.grace_period is not None and not self.grace_period >= 0:
            problems.append(f"grace_period must be >= 0, got {self.grace_period}")
        if problems:
            raise ValueError(f"service {go_quote(self.name)}: {'; '.join(problems)}")


class ServiceStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What ``Supervisor.status()`` reports for one service (also in ``/debug/state``)."""

    name: str
    state: ServiceState
    critical: bool
    restarts: int
    last_error: str = ""
