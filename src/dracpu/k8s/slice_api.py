"""This node's ResourceSlices on the API server: the calls of one publication, and the
wait before trying again after one failed.

``SliceAPI.publish`` lists the slices of this driver and node, plans with
``slice_plan.plan_reconcile`` and applies the plan (deletes, updates, then creates); the
first failing call raises its ``K8sError``. What the server answers goes into the
``SliceCache``: the list replaces it, each write's answer is remembered so that its watch
event is known as ours. ``RetryDelays`` is the backoff both the sync and the watch wait.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from dracpu.k8s.client import K8sError, KubeClient, NotFound
from dracpu.k8s.slice_cache import SliceCache
from dracpu.k8s.slice_plan import Obj, Plan, plan_reconcile
from dracpu.nursery.backoff import restart_delay, retry_after_delay

__all__ = ["RetryDelays", "SliceAPI"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetryDelays:
    """``self(attempt, retry_after)``: seconds before retry ``attempt`` (0-based)."""

    base: float
    cap: float
    rand: Callable[[], float]

    def __post_init__(self) -> None:
        if not 0 < self.base <= self.cap:
            raise ValueError(
                f"backoff must satisfy 0 < base <= cap, got base {self.base}, cap {self.cap}"
            )

    def __call__(self, attempt: int, retry_after: float | None) -> float:
        """The shared backoff (``base`` doubling up to ``cap``, jittered into its upper
        half), and never sooner than the server's ``Retry-After``, itself spread
        (``retry_after_delay``)."""
        delay = restart_delay(
            attempt + 1, initial=self.base, factor=2.0, cap=self.cap, jitter=0.5, rand=self.rand
        )
        if retry_after is not None:
            asked = retry_after_delay(retry_after, cap=self.cap, rand=self.rand)
            delay = max(delay, asked)
        return delay


class SliceAPI:
    """The API calls of one node's slice reconciler. ``calls`` counts them (list, create,
    update, delete; failed ones included); ``list_version`` is the resource version of
    the last successful list, where the watch starts."""

    def __init__(self, kube: KubeClient, *, field_selector: str, cache: SliceCache) -> None:
        self._kube = kube
        self._field_selector = field_selector
        self._cache = cache
        self.calls = 0
        self.list_version: str | None = None

    async def publish(
        self, desired: Sequence[Mapping[str, Any]], *, current_generation: int | None
    ) -> Plan:
        """List, plan and apply once."""
        existing = await self._list()
        plan = plan_reconcile(desired, existing, current_generation=current_generation)
        await self._apply(plan)
        if not plan.empty:
            log.info(
                "resourceslices: generation %d, %d created, %d updated, %d deleted",
                plan.generation,
                len(plan.creates),
                len(plan.updates),
                len(plan.deletes),
            )
        return plan

    async def _apply(self, plan: Plan) -> None:
        api = self._kube.resource
        for name in plan.deletes:
            try:
                self._cache.remember_delete(name, await self._call(api.delete_resource_slice, name))
            except NotFound:  # already gone: that is what we wanted
                self._cache.forget(name)
        for update in plan.updates:
            self._cache.remember_write(
                await self._call(api.replace_resource_slice, update.name, update.body)
            )
        for body in plan.creates:
            self._cache.remember_write(await self._call(api.create_resource_slice, body))

    async def _call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> bytes:
        self.calls += 1
        return await self._kube.call_raw(fn, *args, **kwargs)

    async def _list(self) -> list[Obj]:
        raw = await self._call(
            self._kube.resource.list_resource_slice, field_selector=self._field_selector
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
        self.list_version = str(rv) if rv else None
        objects = [i for i in items if isinstance(i, dict)]
        self._cache.reset(objects)
        return objects
