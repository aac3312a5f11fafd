"""Publishing the node's ResourceSlices (behavior.md §6.4).

``plan_reconcile`` is the pure core: desired slices (from ``devices.build_slices``) versus
the slices that exist for this driver and node, giving the creates, updates and deletes
that converge them and the pool generation to write. ``SliceReconciler`` is the Trio
shell: list, apply the plan, retry API errors with backoff, and resync periodically or
on ``trigger()`` for the life of the process. On shutdown the slices are left in place.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from dracpu import DRIVER_NAME
from dracpu.k8s.client import K8sError, KubeClient, NotFound, TooManyRequests

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


class SliceReconciler:
    """Keeps this node's pool of ResourceSlices equal to ``desired``.

    ``run`` never raises for API errors: each failed sync is logged and retried after
    ``backoff_delay``. ``converged`` is set once the first sync succeeded.
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
    ) -> None:
        self.kube = kube
        self.node_name = node_name
        self.resync_interval = resync_interval
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self._rand = rand or random.Random().random
        self._desired: list[Obj] = [copy.deepcopy(dict(d)) for d in desired]
        self.generation: int | None = None
        self.api_calls = 0
        self.errors = 0
        self.converged = trio.Event()
        self._wake = trio.Event()
        self._syncs_started = 0
        self._syncs_done = 0
        self._sync_done = trio.Event()

    @property
    def field_selector(self) -> str:
        return f"spec.nodeName={self.node_name},spec.driver={DRIVER_NAME}"

    def trigger(self) -> None:
        """Resync now instead of at the next interval."""
        self._wake.set()

    def set_desired(self, desired: Sequence[Mapping[str, Any]]) -> None:
        self._desired = [copy.deepcopy(dict(d)) for d in desired]
        self.trigger()

    async def wait_next_sync(self) -> None:
        """Return after a sync that started after this call has succeeded."""
        target = self._syncs_started + 1
        while self._syncs_done < target:
            await self._sync_done.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            self._wake = trio.Event()
            await self._sync_until_ok()
            if not started:
                started = True
                task_status.started()
            with trio.move_on_after(self.resync_interval):
                await self._wake.wait()

    async def _sync_until_ok(self) -> None:
        attempt = 0
        while True:
            self._syncs_started += 1
            try:
                await self.sync_once()
            except K8sError as exc:
                self.errors += 1
                delay = backoff_delay(
                    attempt, base=self.backoff_base, cap=self.backoff_cap, rand=self._rand
                )
                if isinstance(exc, TooManyRequests) and exc.retry_after is not None:
                    delay = max(delay, min(exc.retry_after, self.backoff_cap))
                log.warning("resourceslice sync failed (retry in %.3fs): %s", delay, exc)
                attempt += 1
                await trio.sleep(delay)
                continue
            self._syncs_done = self._syncs_started
            self.converged.set()
            done, self._sync_done = self._sync_done, trio.Event()
            done.set()
            return

    async def sync_once(self) -> Plan:
        """List, plan and apply once; the first failing call raises its ``K8sError``."""
        existing = await self._list()
        plan = plan_reconcile(self._desired, existing, current_generation=self.generation)
        api = self.kube.resource
        for name in plan.deletes:
            with contextlib.suppress(NotFound):  # already gone: that is what we wanted
                await self._call(api.delete_resource_slice, name)
        for update in plan.updates:
            await self._call(api.replace_resource_slice, update.name, update.body)
        for body in plan.creates:
            await self._call(api.create_resource_slice, body)
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

    async def _call(self, fn: Callable[..., Any], /, *args: Any) -> bytes:
        self.api_calls += 1
        return await self.kube.call_raw(fn, *args)

    async def _list(self) -> list[Obj]:
        raw = await self._call_list()
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise K8sError(f"list resourceslices: decode: {exc}") from exc
        items = data.get("items") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise K8sError("list resourceslices: the answer has no items list")
        return [i for i in items if isinstance(i, dict)]

    async def _call_list(self) -> bytes:
        self.api_calls += 1
        return await self.kube.call_raw(
            self.kube.resource.list_resource_slice, field_selector=self.field_selector
        )
