"""The simulated node's scheduler: allocates pending ResourceClaims and binds pods.

One round (``schedule_once``) does what kube-scheduler's DRA plugin and the resourceclaim
controller do for a one-node cluster:

1. release: reservations of pods that are gone (or finished) are dropped from
   ``status.reservedFor``; a claim reserved for nobody is deallocated, and deleted when it
   was generated for a pod that is gone, replaced or done;
2. generate: a pod's ``resourceClaimTemplateName`` entries get a claim made from the
   template and owned by the pod, its name recorded in ``status.resourceClaimStatuses``
   (``templates.py`` says how the resourceclaim controller shapes it);
3. schedule: every pod without ``spec.nodeName`` gets its claims (named by
   ``resourceClaimName``, or by the claim recorded in ``status.resourceClaimStatuses``
   for a template) allocated with the pure ``allocate`` — all of a pod's claims or none —
   then ``status.allocation`` and ``status.reservedFor`` are written through the status
   subresource, and the pod is bound to the node.

A claim that cannot be allocated leaves the pod pending with a ``PodScheduled=False``
condition carrying the reason, and is reported as a ``FailedScheduling`` outcome; the
next round tries again. ``run`` repeats rounds every ``poll_interval`` or on ``poke()``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import trio

from dracpu.k8s.client import Conflict, K8sError, KubeClient, NotFound
from dracpu_sim.scheduler.allocator import UnsatisfiableClaim, allocate
from dracpu_sim.scheduler.devices import AllocatedDevices
from dracpu_sim.scheduler.templates import (
    claim_from_template,
    find_generated_claim,
    generated_claim_names,
    owning_pod,
    template_entries,
)

__all__ = ["ScheduleOutcome", "Scheduler"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
_MAX_RESERVED_FOR = 256


@dataclass(frozen=True)
class ScheduleOutcome:
    """An event of one round: a pod bound, a pod left pending (and why), a claim freed."""

    kind: Literal["Scheduled", "FailedScheduling", "Deallocated"]
    pod: str  # "namespace/name"; "" for Deallocated
    message: str
    claims: tuple[str, ...] = ()  # "namespace/name" of the claims involved

    @property
    def scheduled(self) -> bool:
        return self.kind == "Scheduled"


def _ref(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _pod_done(pod: Obj) -> bool:
    """No container of the pod runs or will run (isPodDone of the resourceclaim controller)."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return True
    return bool(
        pod["metadata"].get("deletionTimestamp") and not (pod.get("spec") or {}).get("nodeName")
    )


def _items(raw: bytes) -> list[Obj]:
    items: list[Obj] = json.loads(raw).get("items") or []
    return items


class _PodUnschedulable(Exception):
    pass


@dataclass
class _Round:
    """What one round read from the API, updated as it writes."""

    pods: list[Obj]
    claims: dict[tuple[str, str], Obj]
    slices: list[Obj]
    classes: dict[str, Obj]
    templates: dict[tuple[str, str], Obj] = field(default_factory=dict)
    allocated: AllocatedDevices = field(default_factory=AllocatedDevices)
    # Pod ref -> why its claims could not be generated from a template (this round).
    template_problems: dict[str, str] = field(default_factory=dict)


class Scheduler:
    """Schedules every pending pod onto ``node_name``. Constructing it does no I/O."""

    def __init__(
        self,
        api: KubeClient,
        node_name: str,
        *,
        poll_interval: float = 0.5,
        new_share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.poll_interval = poll_interval
        self.new_share_id = new_share_id
        # Every distinct outcome so far, oldest first (the demo prints them).
        self.events: list[ScheduleOutcome] = []
        # The error of the last round (None when it went through) and how many failed.
        self.last_error: str | None = None
        self.failed_rounds = 0
        self._last_failure: dict[str, str] = {}
        self._wake = trio.Event()

    def poke(self) -> None:
        """Run the next round now instead of at the next poll."""
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                await self.schedule_once()
                self.last_error = None
            except K8sError as exc:
                # The API server may be restarting; the next round reads everything again.
                self.last_error = str(exc)
                self.failed_rounds += 1
                log.warning("scheduling round failed: %s", exc)
            with trio.move_on_after(self.poll_interval):
                await self._wake.wait()
            self._wake = trio.Event()

    # ---- one round ----------------------------------------------------------------------

    async def _read(self) -> _Round:
        api = self.api
        pods = _items(await api.call_raw(api.core.list_pod_for_all_namespaces))
        claims = _items(await api.call_raw(api.resource.list_resource_claim_for_all_namespaces))
        slices = _items(await api.call_raw(api.resource.list_resource_slice))
        classes = _items(await api.call_raw(api.resource.list_device_class))
        templates = _items(
            await api.call_raw(api.resource.list_resource_claim_template_for_all_namespaces)
        )
        return _Round(
            pods=pods,
            claims={(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims},
            slices=slices,
            classes={c["metadata"]["name"]: c for c in classes},
            templates={(t["metadata"]["namespace"], t["metadata"]["name"]): t for t in templates},
        )

    async def schedule_once(self) -> list[ScheduleOutcome]:
        """One release + schedule round; returns what happened in it."""
        state = await self._read()
        outcomes = await self._release(state)
        await self._delete_unused_generated(state)
        await self._generate_claims(state)
        state.allocated = AllocatedDevices.from_claims(state.claims.values())
        pending = [
            p
            for p in state.pods
            if not (p.get("spec") or {}).get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
        ]
        pending.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), _ref(p)))
        for pod in pending:
            outcome = await self._schedule_pod(state, pod)
            if outcome is not None:
                outcomes.append(outcome)
        for outcome in outcomes:
            self._record(outcome)
        return outcomes

    def _record(self, outcome: ScheduleOutcome) -> None:
        if outcome.kind == "FailedScheduling":
            if self._last_failure.get(outcome.pod) == outcome.message:
                return  # the same reason again: one event is enough
            self._last_failure[outcome.pod] = outcome.message
            log.info("pod %s unschedulable: %s", outcome.pod, outcome.message)
        else:
            self._last_failure.pop(outcome.pod, None)
        self.events.append(outcome)

    # ---- release ------------------------------------------------------------------------

    async def _release(self, state: _Round) -> list[ScheduleOutcome]:
        live = {
            p["metadata"]["uid"]
            for p in state.pods
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        }
        outcomes = []
        for key, claim in list(state.claims.items()):
            status = claim.get("status") or {}
            reserved = status.get("reservedFor") or []
            # Only pod reservations are ours to judge; other consumers keep theirs.
            kept = [
                r
                for r in reserved
                if r.get("uid") in live or r.get("resource") != "pods" or r.get("apiGroup")
            ]
            if len(kept) == len(reserved) and (kept or not status.get("allocation")):
                continue
            new_status = dict(status)
            if kept:
                new_status["reservedFor"] = kept
            else:
                new_status.pop("reservedFor", None)
                new_status.pop("allocation", None)
            try:
                state.claims[key] = await self._write_status(claim, new_status)
            except NotFound:
                del state.claims[key]
                continue
            except Conflict:
                continue  # changed under us; the next round looks again
            if not kept:
                outcomes.append(
                    ScheduleOutcome(
                        "Deallocated",
                        "",
                        f"claim {_ref(claim)} is reserved for no pod: allocation released",
                        (_ref(claim),),
                    )
                )
        return outcomes

    async def _delete_unused_generated(self, state: _Round) -> None:
        """Generated claims reserved for nobody whose pod is gone, replaced or done (what
        the resourceclaim controller and the garbage collector do together)."""
        pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in state.pods}
        api = self.api
        for key, claim in list(state.claims.items()):
            owner = owning_pod(claim)
            if owner is None or (claim.get("status") or {}).get("reservedFor"):
                continue
            pod = pods.get((key[0], owner[0]))
            if pod is not None and pod["metadata"]["uid"] == owner[1] and not _pod_done(pod):
                continue
            with contextlib.suppress(NotFound):
                await api.call_raw(api.resource.delete_namespaced_resource_claim, key[1], key[0])
            del state.claims[key]

    async def _generate_claims(self, state: _Round) -> None:
        """Claims from templates for every pod that still needs one (the resourceclaim
        controller's job); the pod's status then names them."""
        for pod in state.pods:
            if _pod_done(pod) or pod["metadata"].get("deletionTimestamp"):
                continue
            entries = template_entries(pod)
            known = generated_claim_names(pod)
            missing = [(c, t) for c, t in entries if c not in known]
            if not missing:
                continue
            try:
                for pod_claim, template_name in missing:
                    known[pod_claim] = await self._generated_claim(
                        state, pod, pod_claim, template_name
                    )
            except _PodUnschedulable as exc:
                state.template_problems[_ref(pod)] = str(exc)
                continue
            statuses = [{"name": c, "resourceClaimName": known[c]} for c, _ in entries]
            api = self.api
            try:
                await api.call_raw(
                    api.core.patch_namespaced_pod_status,
                    pod["metadata"]["name"],
                    pod["metadata"]["namespace"],
                    {"status": {"resourceClaimStatuses": statuses}},
                )
            except NotFound:
                continue  # deleted meanwhile; its claims go with it
            pod.setdefault("status", {})["resourceClaimStatuses"] = statuses

    async def _generated_claim(
        self, state: _Round, pod: Obj, pod_claim: str, template_name: str
    ) -> str:
        """The name of the pod's claim for ``pod_claim``: found, or created from the template."""
        ns = pod["metadata"]["namespace"]
        existing = find_generated_claim(state.claims.values(), pod, pod_claim)
        if existing is not None:
            return str(existing["metadata"]["name"])
        template = state.templates.get((ns, template_name))
        if template is None:
            raise _PodUnschedulable(
                f'pod claim {pod_claim!r}: resourceclaimtemplate "{ns}/{template_name}" not found'
            )
        api = self.api
        try:
            raw = await api.call_raw(
                api.resource.create_namespaced_resource_claim,
                ns,
                claim_from_template(pod, pod_claim, template),
            )
        except K8sError as exc:
            raise _PodUnschedulable(
                f"pod claim {pod_claim!r}: create ResourceClaim from template "
                f'"{ns}/{template_name}": {exc}'
            ) from exc
        created: Obj = json.loads(raw)
        state.claims[(ns, created["metadata"]["name"])] = created
        return str(created["metadata"]["name"])

    # ---- schedule -----------------------------------------------------------------------

    def _pod_claims(self, state: _Round, pod: Obj) -> list[Obj]:
        ns = pod["metadata"]["namespace"]
        statuses = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        out = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            pod_claim = entry.get("name", "")
            name = entry.get("resourceClaimName")
            if not name and entry.get("resourceClaimTemplateName"):
                name = statuses.get(pod_claim)
                if not name:
                    raise _PodUnschedulable(
                        state.template_problems.get(_ref(pod))
                        or f"pod claim {pod_claim!r}: waiting for its ResourceClaim to be "
                        f"generated from {entry['resourceClaimTemplateName']!r}"
                    )
            if not name:
                raise _PodUnschedulable(f"pod claim {pod_claim!r} names no ResourceClaim")
            claim = state.claims.get((ns, name))
            if claim is None:
                raise _PodUnschedulable(f'waiting for resourceclaim "{ns}/{name}" to be created')
            if claim["metadata"].get("deletionTimestamp"):
                raise _PodUnschedulable(f'resourceclaim "{ns}/{name}" is being deleted')
            out.append(claim)
        return out

    def _allocated_elsewhere(self, claim: Obj) -> bool:
        selector = (claim["status"]["allocation"].get("nodeSelector") or {}).get(
            "nodeSelectorTerms"
        ) or []
        for term in selector:
            for field_req in term.get("matchFields") or []:
                if field_req.get("key") == "metadata.name" and self.node_name not in (
                    field_req.get("values") or []
                ):
                    return True
        return False

    async def _plan(self, state: _Round, pod: Obj) -> list[tuple[Obj, Obj]]:
        """(claim, new status) for every claim of the pod, or _PodUnschedulable/Unsatisfiable."""
        working = state.allocated.copy()
        uid = pod["metadata"]["uid"]
        plans = []
        for claim in self._pod_claims(state, pod):
            status = dict(claim.get("status") or {})
            if status.get("allocation"):
                if self._allocated_elsewhere(claim):
                    raise _PodUnschedulable(
                        f"resourceclaim {_ref(claim)} is allocated to another node"
                    )
            else:
                # CEL evaluation over hundreds of devices takes a while: keep the event
                # loop (and a daemon sharing it) responsive.
                status["allocation"] = await trio.to_thread.run_sync(
                    partial(
                        allocate,
                        claim,
                        state.slices,
                        state.classes,
                        working,
                        self.node_name,
                        new_share_id=self.new_share_id,
                    )
                )
                working.add(status["allocation"])
            reserved = list(status.get("reservedFor") or [])
            if not any(r.get("uid") == uid for r in reserved):
                if len(reserved) >= _MAX_RESERVED_FOR:
                    raise _PodUnschedulable(
                        f"resourceclaim {_ref(claim)} is reserved for the maximum number of pods"
                    )
                reserved.append({"resource": "pods", "name": pod["metadata"]["name"], "uid": uid})
            status["reservedFor"] = reserved
            plans.append((claim, status))
        state.allocated = working
        return plans

    async def _schedule_pod(self, state: _Round, pod: Obj) -> ScheduleOutcome | None:
        ref = _ref(pod)
        try:
            plans = await self._plan(state, pod)
        except UnsatisfiableClaim as exc:
            await self._mark_unschedulable(pod, str(exc))
            return ScheduleOutcome("FailedScheduling", ref, str(exc), (exc.claim,))
        except _PodUnschedulable as exc:
            message = f"pod {ref}: {exc}"
            await self._mark_unschedulable(pod, message)
            return ScheduleOutcome("FailedScheduling", ref, message)
        claims = tuple(_ref(c) for c, _ in plans)
        for claim, status in plans:
            if status == claim.get("status"):
                continue
            try:
                written = await self._write_status(claim, status)
            except (Conflict, NotFound) as exc:
                # Another writer got there first: state.allocated may be stale, so stop
                # this round for the pod and let the next round re-read everything.
                return ScheduleOutcome(
                    "FailedScheduling", ref, f"pod {ref}: claim {_ref(claim)} changed: {exc}"
                )
            state.claims[(written["metadata"]["namespace"], written["metadata"]["name"])] = written
        try:
            await self._bind(pod)
        except NotFound:
            return ScheduleOutcome("FailedScheduling", ref, f"pod {ref} was deleted", claims)
        return ScheduleOutcome(
            "Scheduled", ref, f"Successfully assigned {ref} to {self.node_name}", claims
        )

    # ---- writes -------------------------------------------------------------------------

    async def _write_status(self, claim: Obj, status: Obj) -> Obj:
        meta = claim["metadata"]
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "resourceVersion": meta.get("resourceVersion"),
            },
            "spec": claim.get("spec"),
            "status": status,
        }
        api = self.api
        raw = await api.call_raw(
            api.resource.replace_namespaced_resource_claim_status,
            meta["name"],
            meta["namespace"],
            body,
        )
        written: Obj = json.loads(raw)
        return written

    async def _bind(self, pod: Obj) -> None:
        meta = pod["metadata"]
        api = self.api
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        try:
            await api.call_raw(
                api.core.create_namespaced_pod_binding, meta["name"], meta["namespace"], binding
            )
            return
        except NotFound:
            pass  # the loopback API server has no pods/binding: set spec.nodeName directly
        await api.call_raw(
            api.core.patch_namespaced_pod,
            meta["name"],
            meta["namespace"],
            {"spec": {"nodeName": self.node_name}},
        )

    async def _mark_unschedulable(self, pod: Obj, message: str) -> None:
        conditions = (pod.get("status") or {}).get("conditions") or []
        current = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
        if current and current.get("status") == "False" and current.get("message") == message:
            return
        others = [c for c in conditions if c.get("type") != "PodScheduled"]
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
        }
        api = self.api
        with contextlib.suppress(NotFound):  # deleted meanwhile
            await api.call_raw(
                api.core.patch_namespaced_pod_status,
                pod["metadata"]["name"],
                pod["metadata"]["namespace"],
                {"status": {"phase": "Pending", "conditions": [*others, condition]}},
            )
