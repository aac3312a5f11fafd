"""Publishing the node's ResourceSlices (behavior.md §6.4).

``plan_reconcile`` is the pure core: desired slices (from ``devices.build_slices``) versus
the slices that exist for this driver and node, giving the creates, updates and deletes
that converge them and the pool generation to write. ``SliceReconciler`` is the Trio
shell: list, apply the plan, retry API errors with backoff; then re-converge for the life
of the process when a watch on our slices reports a change we did not make, on a
periodic resync, and on ``trigger()``. On shutdown the slices are left in place (the
kubelet removes them once the plugin is gone, protocols.md §2.6).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import random
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from dracpu import DRIVER_NAME
from dracpu.k8s.client import Gone, K8sError, KubeClient, NotFound, TooManyRequests
from dracpu.k8s.watch import WatchEvent, WatchStream, watch_once
from dracpu.logs import operation

__all__ = [
    "Plan",
    "SliceReconciler",
    "SliceUpdate",
    "backoff_delay",
    "plan_reconcile",
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


def _with_generation(desired: Mapping[str, Any], generation: int) -> Obj:
    body = copy.deepcopy(dict(desired))
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
    body = copy.deepcopy(wanted)
    body["metadata"].pop("generateName", None)
    body["metadata"]["name"] = str(meta.get("name", ""))
    body["metadata"]["resourceVersion"] = str(meta.get("resourceVersion", ""))
    return SliceUpdate(
        name=str(meta.get("name", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        body=body,
    )


def backoff_delay(
    attempt: int, *, base: float, cap: float, rand: Callable[[], float] = random.random
) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): exponential, capped, then
    jittered into [50 %, 100 %] of that so that many nodes do not retry in lockstep."""
    if attempt < 0:
        raise ValueError(f"backoff attempt must be >= 0, got {attempt}")
    # 2**attempt overflows a float long after the cap is reached; stop growing early.
    ceiling = cap if attempt > 62 else min(cap, base * math.ldexp(1.0, attempt))
    return ceiling * (0.5 + 0.5 * rand())


Sleep = Callable[[float], Awaitable[None]]

# Why a sync ran, most important first: a sync woken for several reasons counts as the
# first of them ("resync" when only the interval ran out).
_REASONS = ("relist", "desired", "trigger", "watch")
# Our own writes remembered to recognise their watch events; far more than one sync makes.
_OWN_WRITES_KEPT = 4096
# A watch that ends sooner than this without delivering anything counts as a failure, so
# a server that closes watches at once is not hammered in a tight loop (as client-go).
_SHORT_WATCH = 1.0


class _WrittenMeta(msgspec.Struct):
    resourceVersion: str = ""


class _Written(msgspec.Struct):
    metadata: _WrittenMeta = msgspec.field(default_factory=_WrittenMeta)


_written_decoder = msgspec.json.Decoder(_Written)


class SliceReconciler:
    """Keeps this node's pool of ResourceSlices equal to ``desired``.

    ``run`` never raises for API errors: each failed sync is logged and retried after
    ``backoff_delay``, and a failing watch is retried the same way while the periodic
    resync goes on converging without it. ``is_published`` / ``wait_published()`` tell
    when the first sync succeeded. Every wait goes through Trio (``sleep``, default
    ``trio.sleep``; ``trio.move_on_after`` for the resync interval), so tests run it
    under ``trio.testing.MockClock``. ``resync_interval=math.inf`` turns the periodic
    resync off; ``watch=False`` turns the watch off.
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
        watch_timeout: float | None = 300.0,
        sleep: Sleep | None = None,
    ) -> None:
        if not resync_interval > 0:
            raise ValueError(f"resync interval must be > 0 seconds, got {resync_interval}")
        if not 0 < backoff_base <= backoff_cap:
            raise ValueError(
                f"backoff must satisfy 0 < base <= cap, got base {backoff_base}, cap {backoff_cap}"
            )
        if watch_timeout is not None and not watch_timeout >= 1:
            raise ValueError(f"watch timeout must be >= 1 second, got {watch_timeout}")
        self.kube = kube
        self.node_name = node_name
        self.resync_interval = resync_interval
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.watch_enabled = watch
        self.watch_timeout = watch_timeout
        self._rand = rand or random.Random().random
        self._sleep: Sleep = sleep or trio.sleep
        self._desired: list[Obj] = [copy.deepcopy(dict(d)) for d in desired]
        self.generation: int | None = None
        # Counters for /metrics and /debug/state.
        self.api_calls = 0  # list/create/update/delete calls, failed ones included
        self.errors = 0  # failed syncs
        self.last_error: str | None = None
        self.sync_reasons: Counter[str] = Counter()
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
        self._desired = [copy.deepcopy(dict(d)) for d in desired]
        self._wake_up("desired")

    async def wait_next_sync(self) -> None:
        """Return after a sync that started after this call has succeeded."""
        target = self._syncs_started + 1
        while self._syncs_done < target:
            await self._sync_done.wait()

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
            "watch": {
                "enabled": self.watch_enabled,
                "connected": self.watch_connected,
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
            reason = next((r for r in _REASONS if r in reasons), "resync")
            if external:
                self.external_changes += len(external)
                names = ", ".join(sorted({f"{e.type.lower()} {e.name}" for e in external}))
                log.info("resourceslices changed by someone else (%s): reconciling", names)
            await self._sync_until_ok(reason)

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
                delay = backoff_delay(
                    attempt, base=self.backoff_base, cap=self.backoff_cap, rand=self._rand
                )
                if isinstance(exc, TooManyRequests) and exc.retry_after is not None:
                    delay = max(delay, min(exc.retry_after, self.backoff_cap))
                log.warning("resourceslice sync failed (retry in %.3fs): %s", delay, exc)
                attempt += 1
                await self._sleep(delay)
                continue
            self.last_error = None
            self._syncs_done = self._syncs_started
            self.converged.set()
            done, self._sync_done = self._sync_done, trio.Event()
            done.set()
            return

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
                self._wake_up("relist")
                await self.wait_next_sync()
                self._watch_rv = self._list_rv
            started = trio.current_time()
            try:
                delivered = await self._watch_once()
            except Gone as exc:
                log.info("resourceslice watch: %s; listing again", exc)
                relist = True
                continue
            except K8sError as exc:
                self.watch_errors += 1
                failure = str(exc)
            else:
                if delivered or trio.current_time() - started >= _SHORT_WATCH:
                    attempt = 0
                    continue
                self.watch_errors += 1
                failure = "the watch ended at once without any event"
            delay = backoff_delay(
                attempt, base=self.backoff_base, cap=self.backoff_cap, rand=self._rand
            )
            log.warning("resourceslice watch failed (retry in %.3fs): %s", delay, failure)
            attempt += 1
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
        if self._is_own(event.resource_version):
            return
        self._external.append(event)
        self._wake_up("watch")

    def _is_own(self, resource_version: str) -> bool:
        if resource_version in self._own_writes:
            del self._own_writes[resource_version]
            return True
        return False

    def _remember_write(self, raw: bytes) -> None:
        try:
            rv = _written_decoder.decode(raw).metadata.resourceVersion
        except msgspec.DecodeError:
            return  # only costs one extra sync when its event comes back
        if rv:
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
                with contextlib.suppress(NotFound):  # already gone: that is what we wanted
                    self._remember_write(await self._call(api.delete_resource_slice, name))
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
            data = json.loads(raw)
        except ValueError as exc:
            raise K8sError(f"list resourceslices: decode: {exc}") from exc
        items = data.get("items") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise K8sError("list resourceslices: the answer has no items list")
        meta = data.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        self._list_rv = str(rv) if rv else None
        return [i for i in items if isinstance(i, dict)]
