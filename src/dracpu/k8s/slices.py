"""Publishing the node's ResourceSlices (behavior.md §6.4).

``plan_reconcile`` is the pure core: desired slices (from ``devices.build_slices``) versus
the slices that exist for this driver and node, giving the creates, updates and deletes
that converge them and the pool generation to write. ``SliceReconciler`` is the Trio
shell: list, apply the plan, retry API errors with backoff; then re-converge for the life
of the process when a watch on our slices reports a change we did not make, on a
periodic resync, and on ``trigger()``. On shutdown the slices are left in place (the
kubelet removes them once the plugin is gone, protocols.md §2.6).

What it costs the API server at rest (docs/scale.md): the watch keeps a cache of our
slices (``SliceDigest``: name, version, generation and a digest of what we own), and
the periodic resync, like a client-go informer's, replays that cache instead of calling
the API (``cache_in_sync``): it lists only when the watch is down. Watches are long
(``watch_timeout``) and kept alive by the server's bookmarks; a watch that breaks after
it was established, and a relist after 410 Gone, wait a random part of
``reconnect_spread`` first, so that a fleet hit by the same event (an API server
restart, every watch dropped) does not come back in the same second; a 429 or 5xx with
``Retry-After`` is honoured, spread the same way.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import random
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from dracpu import DRIVER_NAME
from dracpu.k8s.client import (
    ConnectionFailed,
    Gone,
    K8sError,
    KubeClient,
    NotFound,
    TooManyRequests,
)
from dracpu.k8s.watch import WatchEvent, WatchStream, watch_once
from dracpu.logs import operation
from dracpu.nursery.backoff import restart_delay, retry_after_delay

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

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class SliceUpdate:
    """Replace the existing slice ``name`` (at ``resource_version``) with ``body``."""

    name: str
    resource_version: str
    body: Obj


@dataclass(frozen=True, slots=True)
class Plan:
    generation: int
    creates: list[Obj] = field(default_factory=list)
    updates: list[SliceUpdate] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.creates or self.updates or self.deletes)


def _generation(obj: Mapping[str, Any]) -> int:
    gen = obj.get("spec", {}).get("pool", {}).get("generation", 0)
    return gen if isinstance(gen, int) else 0


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def _clone(obj: Mapping[str, Any]) -> Obj:
    # A JSON round trip: a deep copy of JSON-shaped data at a fraction of copy.deepcopy's
    # cost (a 768-device pool is some 280 kB of JSON).
    return msgspec.json.decode(msgspec.json.encode(obj))  # type: ignore[no-any-return]


def _with_generation(desired: Mapping[str, Any], generation: int) -> Obj:
    body = _clone(desired)
    body["spec"]["pool"]["generation"] = generation
    return body


def _same_content(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    # Only what we own: the spec and the owner reference. Server-set metadata (uid,
    # resourceVersion, managedFields, ...) never counts as a difference.
    return existing.get("spec") == wanted.get("spec") and existing.get("metadata", {}).get(
        "ownerReferences"
    ) == wanted.get("metadata", {}).get("ownerReferences")


def _match_index(name: str, prefixes: Sequence[str]) -> int | None:
    for index, prefix in enumerate(prefixes):
        if name.startswith(prefix):
            return index
    return None


def plan_reconcile(
    desired: Sequence[Mapping[str, Any]],
    existing: Sequence[Mapping[str, Any]],
    *,
    current_generation: int | None,
) -> Plan:
    """What to create, update and delete so that ``existing`` becomes ``desired``.

    ``desired`` carries ``metadata.generateName`` (index prefix) and any generation (it is
    overwritten). ``current_generation`` is the last generation this process wrote, if
    any: the pool generation never goes backwards even when every slice was deleted.
    """
    prefixes = [str(d["metadata"]["generateName"]) for d in desired]
    seen = [_generation(e) for e in existing]
    known = [g for g in seen if g > 0] + ([current_generation] if current_generation else [])
    pool_gen = max(known) if known else None

    deletes: list[str] = []
    matched: dict[int, Mapping[str, Any]] = {}
    # Sorted by name so that the choice among duplicates is stable between runs.
    for obj in sorted(existing, key=_name):
        index = _match_index(_name(obj), prefixes)
        if pool_gen is None or _generation(obj) < pool_gen or index is None:
            deletes.append(_name(obj))
            continue
        kept = matched.get(index)
        if kept is None:
            matched[index] = obj
            continue
        # A duplicate for one index (e.g. a create whose answer was lost): keep the one
        # that already has the wanted content, delete the other.
        wanted = _with_generation(desired[index], pool_gen)
        if _same_content(obj, wanted) and not _same_content(kept, wanted):
            deletes.append(_name(kept))
            matched[index] = obj
        else:
            deletes.append(_name(obj))

    if pool_gen is None:
        return Plan(
            generation=1, creates=[_with_generation(d, 1) for d in desired], deletes=deletes
        )

    missing = [i for i in range(len(desired)) if i not in matched]
    changed = [
        i
        for i, obj in sorted(matched.items())
        if not _same_content(obj, _with_generation(desired[i], pool_gen))
    ]
    if not missing and len(changed) <= 1:
        updates = [_update(matched[i], _with_generation(desired[i], pool_gen)) for i in changed]
        return Plan(generation=pool_gen, updates=updates, deletes=deletes)

    generation = pool_gen + 1
    return Plan(
        generation=generation,
        creates=[_with_generation(desired[i], generation) for i in missing],
        updates=[
            _update(obj, _with_generation(desired[i], generation))
            for i, obj in sorted(matched.items())
        ],
        deletes=deletes,
    )


def _update(existing: Mapping[str, Any], wanted: Obj) -> SliceUpdate:
    meta = existing.get("metadata", {})
    body = wanted  # already a fresh copy (_with_generation)
    body["metadata"].pop("generateName", None)
    body["metadata"]["name"] = str(meta.get("name", ""))
    body["metadata"]["resourceVersion"] = str(meta.get("resourceVersion", ""))
    return SliceUpdate(
        name=str(meta.get("name", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        body=body,
    )


@dataclass(frozen=True, slots=True)
class SliceDigest:
    """What the reconciler remembers of one of its slices: enough to tell, without the
    API, whether ``plan_reconcile`` would find anything to do."""

    name: str
    resource_version: str
    generation: int
    content: bytes  # content_digest(): spec without the generation, owner references


def content_digest(obj: Mapping[str, Any]) -> bytes:
    """A digest of what ``plan_reconcile`` compares (the spec and the owner references),
    the pool generation left out: a slice and the desired slice it matches have equal
    digests exactly when they differ at most in generation."""
    spec = obj.get("spec")
    if isinstance(spec, Mapping) and isinstance(spec.get("pool"), Mapping):
        spec = {**spec, "pool": {**spec["pool"], "generation": 0}}
    meta = obj.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    encoded = msgspec.json.encode([spec, owners], order="sorted")
    return hashlib.blake2b(encoded, digest_size=16).digest()


def slice_digest(obj: Mapping[str, Any]) -> SliceDigest | None:
    """The digest of a slice as the server returned it; None without a name."""
    name = _name(obj)
    if not name:
        return None
    rv = obj.get("metadata", {}).get("resourceVersion", "")
    return SliceDigest(name, str(rv), _generation(obj), content_digest(obj))


def cache_in_sync(
    desired: Sequence[Mapping[str, Any]],
    cached: Sequence[SliceDigest],
    *,
    current_generation: int | None,
    desired_digests: Sequence[bytes] | None = None,
) -> bool:
    """Whether ``plan_reconcile(desired, <the slices cached stands for>)`` is empty: one
    slice per desired index, no strays, all at one generation no older than the last one
    written, each with the wanted content. ``desired_digests`` (``content_digest`` of
    each desired slice) saves computing them again."""
    if not desired:
        return not cached
    if len(cached) != len(desired):
        return False
    generations = {c.generation for c in cached}
    if len(generations) != 1:
        return False
    (generation,) = generations
    if generation <= 0 or (current_generation is not None and generation < current_generation):
        return False
    prefixes = [str(d["metadata"]["generateName"]) for d in desired]
    wanted = (
        list(desired_digests)
        if desired_digests is not None
        else [content_digest(d) for d in desired]
    )
    seen: set[int] = set()
    for c in cached:
        index = _match_index(c.name, prefixes)
        if index is None or index in seen or c.content != wanted[index]:
            return False
        seen.add(index)
    return True


def _not_older(new: str, old: str) -> bool:
    # Resource versions are opaque strings to clients; the API server's are etcd
    # revisions, so compare them as numbers when both are, and trust order otherwise.
    try:
        return int(new) >= int(old)
    except ValueError:
        return True


Sleep = Callable[[float], Awaitable[None]]

# Why a sync ran, most important first: a sync woken for several reasons counts as the
# first of them ("resync" when only the interval ran out and the cache could not answer).
_REASONS = ("relist", "desired", "trigger", "watch")
# Our own writes remembered to recognise their watch events; far more than one sync makes.
_OWN_WRITES_KEPT = 4096
# A watch that ends sooner than this without delivering anything counts as a failure, so
# a server that closes watches at once is not hammered in a tight loop (as client-go).
_SHORT_WATCH = 1.0


class _WatchDown(enum.Enum):
    """Why the watch is not streaming, as far as the periodic resync is concerned."""

    # Each holds until the next attempt's outcome: a refused watch stays refused while
    # it is tried again.
    CONNECTING = "connecting"  # a request is on its way (or a stream just ended cleanly)
    BROKEN = "broken"  # an open stream broke: reconnecting within the spread
    UNREACHABLE = "unreachable"  # the last attempt could not connect
    THROTTLED = "throttled"  # the server answered 429
    RELISTING = "relisting"  # 410 Gone: a relist is on its way
    REFUSED = "refused"  # the server answered the watch with another error


def _watch_down_after(exc: K8sError, *, established: bool) -> _WatchDown:
    if established:
        return _WatchDown.BROKEN
    if isinstance(exc, ConnectionFailed):
        return _WatchDown.UNREACHABLE
    if isinstance(exc, TooManyRequests):
        return _WatchDown.THROTTLED
    return _WatchDown.REFUSED


class _WrittenMeta(msgspec.Struct):
    resourceVersion: str = ""


class _Written(msgspec.Struct):
    metadata: _WrittenMeta = msgspec.field(default_factory=_WrittenMeta)


_written_decoder = msgspec.json.Decoder(_Written)


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
    ) -> None:
        if not resync_interval > 0:
            raise ValueError(f"resync interval must be > 0 seconds, got {resync_interval}")
        if not 0 < backoff_base <= backoff_cap:
            raise ValueError(
                f"backoff must satisfy 0 < base <= cap, got base {backoff_base}, cap {backoff_cap}"
            )
        if watch_timeout is not None and not watch_timeout >= 1:
            raise ValueError(f"watch timeout must be >= 1 second, got {watch_timeout}")
        if watch_idle_timeout is not None and not watch_idle_timeout >= 1:
            raise ValueError(f"watch idle timeout must be >= 1 second, got {watch_idle_timeout}")
        if not 0 <= reconnect_spread < float("inf"):
            raise ValueError(f"reconnect spread must be >= 0 seconds, got {reconnect_spread}")
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
        self._desired: list[Obj] = [_clone(d) for d in desired]
        self._desired_digests = [content_digest(d) for d in self._desired]
        self.generation: int | None = None
        # Counters for /metrics and /debug/state.
        self.api_calls = 0  # list/create/update/delete calls, failed ones included
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
        self._list_rv: str | None = None
        self._watch_rv: str | None = None
        self._own_writes: OrderedDict[str, None] = OrderedDict()
        self._external: list[WatchEvent] = []
        self._cache: dict[str, SliceDigest] = {}
        self._resyncs_refused = 0  # consecutive resyncs that found the watch refused
        self._watch_down = _WatchDown.CONNECTING  # why, when it is not streaming
        self._watch_limiter = trio.CapacityLimiter(1)
        self._wake = trio.Event()
        self._wake_reasons: set[str] = set()
        self._syncs_started = 0
        self._syncs_done = 0
        self._sync_done = trio.Event()

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
        self._desired = [_clone(d) for d in desired]
        self._desired_digests = [content_digest(d) for d in self._desired]
        self._wake_up("desired")

    async def wait_next_sync(self) -> None:
        """Return after a sync that started after this call has succeeded."""
        target = self._syncs_started + 1
        while self._syncs_done < target:
            await self._sync_done.wait()

    @property
    def watch_streaming(self) -> bool:
        """A watch is open now, so the cache follows the server."""
        stream = self.watch_stream
        return self.watch_enabled and stream is not None and stream.streaming

    def cache_in_sync(self) -> bool:
        """The cached slices are what ``desired`` wants (no API call)."""
        return cache_in_sync(
            self._desired,
            list(self._cache.values()),
            current_generation=self.generation,
            desired_digests=self._desired_digests,
        )

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
                "state": "streaming" if self.watch_streaming else self._watch_down.value,
                "requests": self.watch_requests,
                "errors": self.watch_errors,
                "events": self.watch_events,
                "externalChanges": self.external_changes,
                "relists": self.relists,
            },
        }

    def _wake_up(self, reason: str) -> None:
        self._wake_reasons.add(reason)
        self._wake.set()

    def _retry_delay(self, attempt: int, retry_after: float | None) -> float:
        """Before retry ``attempt`` (0-based): the shared backoff (``backoff_base`` doubling
        up to ``backoff_cap``, jittered into its upper half), and never sooner than the
        server's ``Retry-After``, itself spread (``retry_after_delay``)."""
        delay = restart_delay(
            attempt + 1,
            initial=self.backoff_base,
            factor=2.0,
            cap=self.backoff_cap,
            jitter=0.5,
            rand=self._rand,
        )
        if retry_after is not None:
            asked = retry_after_delay(retry_after, cap=self.backoff_cap, rand=self._rand)
            delay = max(delay, asked)
        return delay

    # ---- the loops ----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Publish (``started`` once the first sync succeeded), then keep the pool
        converged until cancelled. Cancelling deletes nothing."""
        await self._sync_until_ok("start")
        task_status.started()
        async with trio.open_nursery() as nursery:
            if self.watch_enabled:
                nursery.start_soon(self._watch_loop)
            await self._resync_loop()

    async def _resync_loop(self) -> None:
        while True:
            with trio.move_on_after(self.resync_interval):
                await self._wake.wait()
            reasons, self._wake_reasons = self._wake_reasons, set()
            self._wake = trio.Event()
            # An event may have come back before the answer to the write that caused it:
            # only now, after that sync, is every write of ours known.
            external = [e for e in self._external if not self._is_own(e.resource_version)]
            self._external = []
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
        recovery to it (``_WatchDown``): a reconnect resumes from the last version
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
            elif self._watch_down is not _WatchDown.REFUSED:
                self._resyncs_refused = 0
                return
            else:
                self._resyncs_refused += 1
                if self._resyncs_refused < 2:
                    return
        self.sync_reasons["resync"] += 1
        self._syncs_started += 1
        try:
            await self.sync_once()
        except K8sError as exc:
            self.errors += 1
            self.last_error = str(exc)
            log.warning(
                "resourceslice resync failed (again in %.0fs or on the next change): %s",
                self.resync_interval,
                exc,
            )
            return
        self._sync_succeeded()

    async def _sync_until_ok(self, reason: str) -> None:
        self.sync_reasons[reason] += 1
        attempt = 0
        while True:
            self._syncs_started += 1
            try:
                await self.sync_once()
            except K8sError as exc:
                self.errors += 1
                self.last_error = str(exc)
                delay = self._retry_delay(attempt, exc.retry_after)
                log.warning("resourceslice sync failed (retry in %.3fs): %s", delay, exc)
                attempt += 1
                await self._sleep(delay)
                continue
            self._sync_succeeded()
            return

    def _sync_succeeded(self) -> None:
        self.last_error = None
        self._syncs_done = self._syncs_started
        self.converged.set()
        done, self._sync_done = self._sync_done, trio.Event()
        done.set()

    async def _watch_loop(self) -> None:
        """Watch our slices from the version of the last list; any change that is not
        one of our own writes wakes the resync loop. 410 Gone: list again and watch
        from there. Other failures: back off and watch again from the last version."""
        self._watch_rv = self._list_rv
        attempt = 0
        relist = False
        while True:
            if relist:
                relist = False
                self.relists += 1
                self._watch_down = _WatchDown.RELISTING
                # Every watcher of a restarted or compacted server gets its 410 at
                # about the same moment: spread the relists.
                await self._sleep(self.reconnect_spread * self._rand())
                self._wake_up("relist")
                await self.wait_next_sync()
                self._watch_rv = self._list_rv
                self._watch_down = _WatchDown.CONNECTING
            started = trio.current_time()
            retry_after: float | None = None
            established = False
            try:
                delivered = await self._watch_once()
            except Gone as exc:
                log.info("resourceslice watch: %s; listing again", exc)
                relist = True
                continue
            except K8sError as exc:
                self.watch_errors += 1
                failure = str(exc)
                retry_after = exc.retry_after
                established = self.watch_stream is not None and self.watch_stream.attached
                self._watch_down = _watch_down_after(exc, established=established)
            else:
                self._watch_down = _WatchDown.CONNECTING
                if delivered or trio.current_time() - started >= _SHORT_WATCH:
                    attempt = 0
                    continue
                self.watch_errors += 1
                self._watch_down = _WatchDown.REFUSED
                failure = "the watch ended at once without any event"
            if established and attempt == 0:
                # A stream that was open broke (dropped connection, restarted server):
                # likely every node's did. Resuming from our version loses nothing, so
                # there is no hurry; come back at a random moment of the spread.
                delay = self.reconnect_spread * self._rand()
            else:
                delay = self._retry_delay(attempt, retry_after)
                attempt += 1
            log.warning("resourceslice watch failed (retry in %.3fs): %s", delay, failure)
            await self._sleep(delay)

    async def _watch_once(self) -> int:
        stream = WatchStream()
        self.watch_stream = stream
        self.watch_requests += 1
        timeout = (
            None if self.watch_timeout is None else int(self.watch_timeout * (1 + self._rand()))
        )
        self.watch_connected = True
        try:
            return await watch_once(
                self.kube,
                self.kube.resource.list_resource_slice,
                on_event=self._on_watch_event,
                resource_version=self._watch_rv,
                timeout_seconds=timeout,
                limiter=self._watch_limiter,
                stream=stream,
                what="resourceslices",
                idle_timeout=self.watch_idle_timeout,
                field_selector=self.field_selector,
            )
        finally:
            self.watch_connected = False

    def _on_watch_event(self, event: WatchEvent) -> None:
        if event.resource_version:
            self._watch_rv = event.resource_version
        if event.type == "BOOKMARK":
            return
        self.watch_events += 1
        self._cache_event(event)
        if self._is_own(event.resource_version):
            return
        self._external.append(event)
        self._wake_up("watch")

    def _is_own(self, resource_version: str) -> bool:
        if resource_version in self._own_writes:
            del self._own_writes[resource_version]
            return True
        return False

    # ---- the cache ----------------------------------------------------------------------

    def _cache_put(self, digest: SliceDigest) -> None:
        cached = self._cache.get(digest.name)
        if cached is None or _not_older(digest.resource_version, cached.resource_version):
            self._cache[digest.name] = digest

    def _cache_event(self, event: WatchEvent) -> None:
        if event.type == "DELETED":
            cached = self._cache.get(event.name)
            if cached is not None and _not_older(event.resource_version, cached.resource_version):
                del self._cache[event.name]
            return
        try:
            obj = msgspec.json.decode(event.object)
        except msgspec.DecodeError:
            return  # unreadable: the sync this event wakes lists and refills the cache
        digest = slice_digest(obj) if isinstance(obj, dict) else None
        if digest is not None:
            self._cache_put(digest)

    def _remember_write(self, raw: bytes) -> None:
        """A create's or update's answer: the object as stored, and its version, so that
        its watch event is known as ours."""
        try:
            rv = _written_decoder.decode(raw).metadata.resourceVersion
            obj = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return  # only costs one extra sync when its event comes back
        digest = slice_digest(obj) if isinstance(obj, dict) else None
        if digest is not None:
            self._cache_put(digest)
        if rv:
            self._remember_version(rv)

    def _remember_delete(self, name: str, raw: bytes) -> None:
        self._cache.pop(name, None)
        try:
            rv = _written_decoder.decode(raw).metadata.resourceVersion
        except msgspec.DecodeError:
            return
        if rv:
            self._remember_version(rv)

    def _remember_version(self, rv: str) -> None:
        self._own_writes[rv] = None
        while len(self._own_writes) > _OWN_WRITES_KEPT:
            self._own_writes.popitem(last=False)

    # ---- one sync -----------------------------------------------------------------------

    async def sync_once(self) -> Plan:
        """List, plan and apply once; the first failing call raises its ``K8sError``."""
        with operation("PublishResources", v=4, node=self.node_name):
            existing = await self._list()
            plan = plan_reconcile(self._desired, existing, current_generation=self.generation)
            api = self.kube.resource
            for name in plan.deletes:
                try:
                    self._remember_delete(name, await self._call(api.delete_resource_slice, name))
                except NotFound:  # already gone: that is what we wanted
                    self._cache.pop(name, None)
            for update in plan.updates:
                self._remember_write(
                    await self._call(api.replace_resource_slice, update.name, update.body)
                )
            for body in plan.creates:
                self._remember_write(await self._call(api.create_resource_slice, body))
            self.generation = plan.generation
            if not plan.empty:
                log.info(
                    "resourceslices: generation %d, %d created, %d updated, %d deleted",
                    plan.generation,
                    len(plan.creates),
                    len(plan.updates),
                    len(plan.deletes),
                )
            return plan

    async def _call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> bytes:
        self.api_calls += 1
        return await self.kube.call_raw(fn, *args, **kwargs)

    async def _list(self) -> list[Obj]:
        raw = await self._call(
            self.kube.resource.list_resource_slice, field_selector=self.field_selector
        )
        try:
            data = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise K8sError(f"list resourceslices: decode: {exc}") from exc
        items = data.get("items") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise K8sError("list resourceslices: the answer has no items list")
        meta = data.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        self._list_rv = str(rv) if rv else None
        objects = [i for i in items if isinstance(i, dict)]
        digests = (slice_digest(o) for o in objects)
        self._cache = {d.name: d for d in digests if d is not None}
        return objects
