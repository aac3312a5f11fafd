"""Publishing the node's ResourceSlices (behavior.md §6.4).

``SliceReconciler`` keeps the node's pool converged: list, plan and apply
(``slice_api``, planning with the pure ``slice_plan``), retry API errors with backoff;
then re-converge for the life of the process when its watch (``slice_watch``) reports a
change we did not make, on a periodic resync, and on ``trigger()``. On shutdown the
slices are left in place (the kubelet removes them once the plugin is gone, protocols.md
§2.6). The planner's names are re-exported here, where other code imports them from.

What it costs the API server at rest (docs/scale.md): the watch keeps a cache of our
slices (``slice_cache``), and the periodic resync, like a client-go informer's, replays
that cache instead of calling the API (``cache_in_sync``): it lists only when the watch
is down. A 429 or 5xx with ``Retry-After`` is honoured, spread over one more such
interval so that a fleet told the same number does not come back in the same second.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from dracpu import DRIVER_NAME
from dracpu.k8s.client import K8sError, KubeClient
from dracpu.k8s.slice_api import RetryDelays, SliceAPI
from dracpu.k8s.slice_cache import SliceCache
from dracpu.k8s.slice_plan import (
    Obj,
    Plan,
    SliceDigest,
    SliceUpdate,
    cache_in_sync,
    content_digest,
    json_copy,
    plan_reconcile,
    slice_digest,
)
from dracpu.k8s.slice_watch import Sleep, SliceWatch, WatchDown
from dracpu.k8s.watch import WatchEvent, WatchStream
from dracpu.logs import operation
from dracpu.nursery.pulse import Pulse
from dracpu.nursery.readiness import ReadyFlag

__all__ = [
    "Plan",
    "SliceDigest",
    "SliceReconciler",
    "SliceUpdate",
    "cache_in_sync",
    "content_digest",
    "plan_reconcile",
    "slice_digest",
]

log = logging.getLogger(__name__)

# The readiness component the reconciler sets, and what /readyz says before a first sync.
READY_COMPONENT = "slices"
NOT_PUBLISHED = "not published yet"

# Why a sync ran, most important first: a sync woken for several reasons counts as the
# first of them ("resync" when only the interval ran out and the cache could not answer).
_REASONS = ("relist", "desired", "trigger", "watch")


class SliceReconciler:
    """Keeps this node's pool of ResourceSlices equal to ``desired``.

    ``run`` never raises for API errors: each failed sync is logged and retried with
    ``nursery.backoff`` delays (``backoff_base`` doubling up to ``backoff_cap``, jittered;
    never sooner than a ``Retry-After``), and a failing watch is retried the same way
    while the periodic resync goes on converging without it. ``is_published`` /
    ``wait_published()`` tell when the first sync succeeded. Every wait goes through Trio
    (``sleep``, default ``trio.sleep``; ``trio.move_on_after`` for the resync interval),
    so tests run it under ``trio.testing.MockClock``.

    ``resync_interval=math.inf`` turns the periodic resync off; while the watch streams,
    a resync compares the cache with ``desired`` and calls the API only if they differ;
    without a watch (none, or one the server refused for a whole interval) it lists and
    applies once (no retries: the next interval is the retry). ``watch=False`` turns the watch
    off. ``watch_timeout`` is the server-side length of one watch request (randomised
    up to twice that, as client-go does); ``watch_idle_timeout`` ends a watch that
    received nothing at all (not even a bookmark) for that long. ``reconnect_spread`` is
    the window a relist after 410, and the first reconnect of a watch that broke after
    it was established, are spread over.
    """

    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        desired: Sequence[Mapping[str, Any]],
        resync_interval: float = 30.0,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        rand: Callable[[], float] | None = None,
        watch: bool = True,
        watch_timeout: float | None = 1800.0,
        sleep: Sleep | None = None,
        watch_idle_timeout: float | None = 180.0,
        reconnect_spread: float = 5.0,
        ready: ReadyFlag | None = None,
    ) -> None:
        if not resync_interval > 0:
            raise ValueError(f"resync interval must be > 0 seconds, got {resync_interval}")
        self.kube = kube
        self.node_name = node_name
        self.resync_interval = resync_interval
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.watch_enabled = watch
        self.watch_timeout = watch_timeout
        self.watch_idle_timeout = watch_idle_timeout
        self.reconnect_spread = reconnect_spread
        self._rand = rand or random.Random().random
        self._sleep: Sleep = sleep or trio.sleep
        self._desired: list[Obj] = [json_copy(d) for d in desired]
        self._desired_digests = [content_digest(d) for d in self._desired]
        self.generation: int | None = None
        # Counters for /metrics and /debug/state (the API calls are counted by _api).
        self.errors = 0  # failed syncs
        self.last_error: str | None = None
        self.sync_reasons: Counter[str] = Counter()
        self.cache_resyncs = 0  # periodic resyncs the cache answered without the API
        self.watch_requests = 0
        self.watch_errors = 0
        self.watch_events = 0  # ADDED/MODIFIED/DELETED seen, ours included
        self.external_changes = 0  # those not made by us
        self.relists = 0  # 410 Gone answers to a watch
        self.watch_connected = False
        self.watch_stream: WatchStream | None = None  # the newest watch request's handle
        self.converged = trio.Event()
        # The daemon's "slices" readiness: ready from the first converged sync on.
        self.ready = ready or ReadyFlag.standalone(READY_COMPONENT, NOT_PUBLISHED)
        # The parts check their own settings (the backoff's, then the watch's), which
        # they read once, here.
        self._retry_delays = RetryDelays(backoff_base, backoff_cap, self._rand)
        self._cache = SliceCache()
        self._api = SliceAPI(kube, field_selector=self.field_selector, cache=self._cache)
        self._watch = SliceWatch(
            kube=kube,
            field_selector=self.field_selector,
            timeout=watch_timeout,
            idle_timeout=watch_idle_timeout,
            reconnect_spread=reconnect_spread,
            rand=self._rand,
            sleep=self._sleep,
            retry_delay=self._retry_delays,
            relist=self._relist_for_watch,
            on_change=self._on_watch_change,
            report=self,
        )
        self._resyncs_refused = 0  # consecutive resyncs that found the watch refused
        # A wake-up is a reason added; the loop waits until there is one.
        self._wake = Pulse()
        self._wake_reasons: set[str] = set()
        self._syncs_started = 0
        self._syncs_done = 0
        self._sync_done = Pulse()

    @property
    def field_selector(self) -> str:
        return f"spec.nodeName={self.node_name},spec.driver={DRIVER_NAME}"

    # ---- control and readiness ----------------------------------------------------------

    @property
    def is_published(self) -> bool:
        """The pool was converged at least once (for ``/readyz``)."""
        return self.converged.is_set()

    async def wait_published(self) -> None:
        await self.converged.wait()

    def trigger(self) -> None:
        """Resync now instead of at the next interval."""
        self._wake_up("trigger")

    def set_desired(self, desired: Sequence[Mapping[str, Any]]) -> None:
        self._desired = [json_copy(d) for d in desired]
        self._desired_digests = [content_digest(d) for d in self._desired]
        self._wake_up("desired")

    async def wait_next_sync(self) -> None:
        """Return after a sync that started after this call has succeeded."""
        target = self._syncs_started + 1
        await self._sync_done.wait_until(lambda: self._syncs_done >= target)

    @property
    def watch_streaming(self) -> bool:
        """A watch is open now, so the cache follows the server."""
        stream = self.watch_stream
        return self.watch_enabled and stream is not None and stream.streaming

    def cache_in_sync(self) -> bool:
        """The cached slices are what ``desired`` wants (no API call)."""
        return cache_in_sync(
            self._desired,
            self._cache.digests(),
            current_generation=self.generation,
            desired_digests=self._desired_digests,
        )

    @property
    def api_calls(self) -> int:
        """List/create/update/delete calls, failed ones included."""
        return self._api.calls

    def status(self) -> dict[str, Any]:
        """A snapshot for ``/debug/state``."""
        return {
            "published": self.is_published,
            "generation": self.generation,
            "slices": len(self._desired),
            "apiCalls": self.api_calls,
            "failedSyncs": self.errors,
            "lastError": self.last_error,
            "syncs": dict(sorted(self.sync_reasons.items())),
            "cache": {"slices": len(self._cache), "resyncsFromCache": self.cache_resyncs},
            "watch": {
                "enabled": self.watch_enabled,
                "connected": self.watch_connected,
                "state": "streaming" if self.watch_streaming else self._watch.down.value,
                "requests": self.watch_requests,
                "errors": self.watch_errors,
                "events": self.watch_events,
                "externalChanges": self.external_changes,
                "relists": self.relists,
            },
        }

    def _retry_delay(self, attempt: int, retry_after: float | None) -> float:
        """Before retry ``attempt`` (0-based): see ``slice_api.RetryDelays``."""
        return self._retry_delays(attempt, retry_after)

    # ---- the loops ----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Publish (``started`` once the first sync succeeded), then keep the pool
        converged until cancelled. Cancelling deletes nothing."""
        await self._sync_until_ok("start")
        task_status.started()
        async with trio.open_nursery() as nursery:
            if self.watch_enabled:
                nursery.start_soon(self._watch.run, self._api.list_version)
            await self._resync_loop()

    def _wake_up(self, reason: str) -> None:
        self._wake_reasons.add(reason)
        self._wake.fire()

    async def _resync_loop(self) -> None:
        while True:
            with trio.move_on_after(self.resync_interval):
                await self._wake.wait_until(lambda: bool(self._wake_reasons))
            reasons, self._wake_reasons = self._wake_reasons, set()
            external = self._cache.take_external()
            if reasons == {"watch"} and not external:
                continue
            if not reasons:
                await self._resync()
                continue
            reason = next((r for r in _REASONS if r in reasons), "resync")
            if external:
                self.external_changes += len(external)
                names = ", ".join(sorted({f"{e.type.lower()} {e.name}" for e in external}))
                log.info("resourceslices changed by someone else (%s): reconciling", names)
            await self._sync_until_ok(reason)

    async def _resync(self) -> None:
        """The periodic resync. While a watch streams, the cache is as fresh as the
        server and the resync is a comparison (as an informer's resync replays its
        store without calling the API). While the watch is down the resync leaves the
        recovery to it (``WatchDown``): a reconnect resumes from the last version
        without missing anything, a relist after 410 is already on its way, a server
        that cannot be reached or throttles cannot answer a list either. Only without a
        watch, or when the server has refused the watch for a whole interval, does it
        list and apply, once."""
        if self.watch_enabled:
            if self.watch_streaming:
                self._resyncs_refused = 0
                if self.cache_in_sync():
                    self.cache_resyncs += 1
                    return
            elif self._watch.down is not WatchDown.REFUSED:
                self._resyncs_refused = 0
                return
            else:
                self._resyncs_refused += 1
                if self._resyncs_refused < 2:
                    return
        self.sync_reasons["resync"] += 1
        exc = await self._try_sync()
        if exc is not None:
            log.warning(
                "resourceslice resync failed (again in %.0fs or on the next change): %s",
                self.resync_interval,
                exc,
            )

    async def _sync_until_ok(self, reason: str) -> None:
        self.sync_reasons[reason] += 1
        attempt = 0
        while (exc := await self._try_sync()) is not None:
            delay = self._retry_delay(attempt, exc.retry_after)
            log.warning("resourceslice sync failed (retry in %.3fs): %s", delay, exc)
            attempt += 1
            await self._sleep(delay)

    async def _try_sync(self) -> K8sError | None:
        """One sync, counted for ``wait_next_sync`` and ``status``; its error if it failed."""
        self._syncs_started += 1
        try:
            await self.sync_once()
        except K8sError as exc:
            self.errors += 1
            self.last_error = str(exc)
            if not self.converged.is_set():
                self.ready.set_not_ready(f"not published: {exc}")
            return exc
        self.last_error = None
        self._syncs_done = self._syncs_started
        self.converged.set()
        self.ready.set_ready()
        self._sync_done.fire()
        return None

    async def _relist_for_watch(self) -> str | None:
        """The watch got 410 Gone: list again (a sync); the version to watch from."""
        self._wake_up("relist")
        await self.wait_next_sync()
        return self._api.list_version

    def _on_watch_change(self, event: WatchEvent) -> None:
        if self._cache.watch_change(event):
            self._wake_up("watch")

    async def sync_once(self) -> Plan:
        """List, plan and apply once; the first failing call raises its ``K8sError``."""
        with operation("PublishResources", v=4, node=self.node_name):
            plan = await self._api.publish(self._desired, current_generation=self.generation)
            self.generation = plan.generation
            return plan
