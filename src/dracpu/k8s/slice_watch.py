"""The slice reconciler's watch on its own ResourceSlices (docs/scale.md).

``SliceWatch.run`` watches from the version of the reconciler's last list and hands each
change (not bookmarks) to the reconciler. Watches are long (``timeout``, randomised up
to twice that, as client-go does) and kept alive by the server's bookmarks;
``idle_timeout`` ends one that received nothing at all for that long. On 410 Gone it
waits a random part of ``reconnect_spread``, has the reconciler list again and watches
from there. A stream that breaks after it was established reconnects at a random moment
of the same spread, so that a fleet hit by one event (an API server restart, every watch
dropped) does not come back in the same second; other failures wait the reconciler's
retry delay, which honours ``Retry-After``. ``down`` tells the reconciler's periodic
resync why the watch is not streaming.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from dracpu.k8s.client import ConnectionFailed, Gone, K8sError, KubeClient, TooManyRequests
from dracpu.k8s.watch import WatchEvent, WatchStream, watch_once

__all__ = ["Sleep", "SliceWatch", "WatchDown", "WatchReport"]

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]

# A watch that ends sooner than this without delivering anything counts as a failure, so
# a server that closes watches at once is not hammered in a tight loop (as client-go).
_SHORT_WATCH = 1.0


class WatchDown(enum.Enum):
    """Why the watch is not streaming, as far as the periodic resync is concerned."""

    # Each holds until the next attempt's outcome: a refused watch stays refused while
    # it is tried again.
    CONNECTING = "connecting"  # a request is on its way (or a stream just ended cleanly)
    BROKEN = "broken"  # an open stream broke: reconnecting within the spread
    UNREACHABLE = "unreachable"  # the last attempt could not connect
    THROTTLED = "throttled"  # the server answered 429
    RELISTING = "relisting"  # 410 Gone: a relist is on its way
    REFUSED = "refused"  # the server answered the watch with another error


def _down_after(exc: K8sError, *, established: bool) -> WatchDown:
    if established:
        return WatchDown.BROKEN
    if isinstance(exc, ConnectionFailed):
        return WatchDown.UNREACHABLE
    if isinstance(exc, TooManyRequests):
        return WatchDown.THROTTLED
    return WatchDown.REFUSED


@dataclass(frozen=True, slots=True)
class _Failure:
    """Why one watch request failed, and what that means for the wait before the next."""

    message: str
    retry_after: float | None = None
    established: bool = False  # the stream had been open: a reconnect, not a retry


class WatchReport(Protocol):
    """Where the watch reports what it does: the reconciler's attributes, which
    ``/debug/state``, the fleet sim and the tests read."""

    watch_requests: int
    watch_errors: int
    watch_events: int  # ADDED/MODIFIED/DELETED seen, ours included
    relists: int  # 410 Gone answers
    watch_connected: bool
    watch_stream: WatchStream | None  # the newest request's handle


@dataclass(eq=False, kw_only=True)
class SliceWatch:
    """One node's watch on its slices, for the life of ``run``.

    What the watch needs of the reconciler is passed in: ``relist`` (sync now; the
    resource version of the list, once one succeeded), ``on_change`` (an ADDED, MODIFIED
    or DELETED event), ``retry_delay`` (the wait before retry ``attempt``, given the
    server's ``Retry-After``) and ``report``. Constructing one does no I/O; ``down``
    tells the reconciler's periodic resync why the watch is not streaming.
    """

    kube: KubeClient
    field_selector: str
    timeout: float | None
    idle_timeout: float | None
    reconnect_spread: float
    rand: Callable[[], float]
    sleep: Sleep
    retry_delay: Callable[[int, float | None], float]
    relist: Callable[[], Awaitable[str | None]]
    on_change: Callable[[WatchEvent], None]
    report: WatchReport
    down: WatchDown = field(default=WatchDown.CONNECTING, init=False)
    _resource_version: str | None = field(default=None, init=False)
    _limiter: trio.CapacityLimiter = field(
        default_factory=lambda: trio.CapacityLimiter(1), init=False
    )

    def __post_init__(self) -> None:
        if self.timeout is not None and not self.timeout >= 1:
            raise ValueError(f"watch timeout must be >= 1 second, got {self.timeout}")
        if self.idle_timeout is not None and not self.idle_timeout >= 1:
            raise ValueError(f"watch idle timeout must be >= 1 second, got {self.idle_timeout}")
        if not 0 <= self.reconnect_spread < float("inf"):
            raise ValueError(f"reconnect spread must be >= 0 seconds, got {self.reconnect_spread}")

    async def run(self, resource_version: str | None) -> None:
        """Watch from ``resource_version`` (the last list's) until cancelled. 410 Gone:
        list again and watch from there. Other failures: wait, and watch again from the
        last version seen."""
        self._resource_version = resource_version
        attempt = 0
        while True:
            try:
                failure = await self._attempt()
            except Gone as exc:
                log.info("resourceslice watch: %s; listing again", exc)
                await self._relist_after_gone()
                continue
            if failure is None:
                attempt = 0
                continue
            attempt = await self._wait_after(failure, attempt)

    async def _relist_after_gone(self) -> None:
        self.report.relists += 1
        self.down = WatchDown.RELISTING
        # Every watcher of a restarted or compacted server gets its 410 at about the
        # same moment: spread the relists.
        await self.sleep(self.reconnect_spread * self.rand())
        self._resource_version = await self.relist()
        self.down = WatchDown.CONNECTING

    async def _attempt(self) -> _Failure | None:
        """One watch request; None when it ended well (it delivered something, or it
        lasted long enough). ``Gone`` is raised for ``run`` to relist."""
        started = trio.current_time()
        try:
            delivered = await self._watch_once()
        except Gone:
            raise
        except K8sError as exc:
            self.report.watch_errors += 1
            stream = self.report.watch_stream
            established = stream is not None and stream.attached
            self.down = _down_after(exc, established=established)
            return _Failure(str(exc), exc.retry_after, established)
        self.down = WatchDown.CONNECTING
        if delivered or trio.current_time() - started >= _SHORT_WATCH:
            return None
        self.report.watch_errors += 1
        self.down = WatchDown.REFUSED
        return _Failure("the watch ended at once without any event")

    async def _wait_after(self, failure: _Failure, attempt: int) -> int:
        """Sleep before the next request; returns the next failure's ``attempt``."""
        if failure.established and attempt == 0:
            # A stream that was open broke (dropped connection, restarted server):
            # likely every node's did. Resuming from our version loses nothing, so
            # there is no hurry; come back at a random moment of the spread.
            delay = self.reconnect_spread * self.rand()
        else:
            delay = self.retry_delay(attempt, failure.retry_after)
            attempt += 1
        log.warning("resourceslice watch failed (retry in %.3fs): %s", delay, failure.message)
        await self.sleep(delay)
        return attempt

    async def _watch_once(self) -> int:
        stream = WatchStream()
        self.report.watch_stream = stream
        self.report.watch_requests += 1
        timeout = None if self.timeout is None else int(self.timeout * (1 + self.rand()))
        self.report.watch_connected = True
        try:
            return await watch_once(
                self.kube,
                self.kube.resource.list_resource_slice,
                on_event=self._on_event,
                resource_version=self._resource_version,
                timeout_seconds=timeout,
                limiter=self._limiter,
                stream=stream,
                what="resourceslices",
                idle_timeout=self.idle_timeout,
                field_selector=self.field_selector,
            )
        finally:
            self.report.watch_connected = False

    def _on_event(self, event: WatchEvent) -> None:
        if event.resource_version:
            self._resource_version = event.resource_version
        if event.type == "BOOKMARK":
            return
        self.report.watch_events += 1
        self.on_change(event)
