"""``ClaimStatusWriter``: the service that writes dracpu's entries in claims' ``status.devices``.

It subscribes to the state owner's claim events (``NodeState.claim_events``, with repeated
prepares) like the IRQ service: a ``ClaimPrepared`` (a prepare committed, or the kubelet
prepared a prepared claim again) is applied as one server-side apply of the claim's entries
(``claim_status_body.apply_body``: what the entries hold and what the API server allows), a
``ClaimUnprepared`` takes them away again (``removal_body``). Writing is beside the
prepare, never in its path: the owner sends without waiting, ``run`` applies the events one
at a time, the last word per claim wins, an identical status is not written twice, and a
failed write is counted (``dracpu_claim_status_writes_total``), logged and retried with
backoff.

The field is behind the ``DRAResourceClaimDeviceStatus`` gate: alpha in 1.32, beta and on
by default from 1.33, GA in 1.37 (kubernetes/kubernetes pkg/features/kube_features.go).
With the gate off the server drops the field silently
(``dropDisabledDRAResourceClaimDeviceStatusFields`` in
pkg/registry/resource/resourceclaim/strategy.go): the writer notices its entries missing
from the answer, says so once and stops writing. From 1.36 the
``DRAResourceClaimGranularStatusAuthorization`` gate (beta, on) also asks for verb
``associated-node:patch`` on the synthetic ``resourceclaims/driver`` subresource named
``dra.cpu`` (pkg/registry/resource/authz.go ``AuthorizedForDeviceStatus``): deploy/base
grants it with ``resourceclaims/status`` ``patch``. A writer that writes nothing (turned
off, or the gate off) closes its inbox, so the owner stops building events for it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import trio

from dracpu.k8s.claim_status_body import (
    APPLY_PATCH,
    FIELD_MANAGER,
    apply_body,
    decode_answer,
    entry_keys,
    removal_body,
    wanted_keys,
)
from dracpu.k8s.client import K8sError, KubeClient, NotFound
from dracpu.k8s.slice_api import RetryDelays
from dracpu.logs import get_logger
from dracpu.messages import ClaimEvent, ClaimPrepared, ClaimUnprepared
from dracpu.topology.model import Topology

__all__ = ["ClaimStatusWriter"]

log = get_logger("dracpu.k8s.claim_status")


@dataclass(slots=True)
class _Pending:
    change: ClaimEvent
    attempt: int = 0
    due: float = 0.0


class ClaimStatusWriter:
    """Applies the owner's claim events as they come, one call at a time, out of the
    prepare's way. The constructor does no I/O; ``run`` is the service.

    ``topology`` returns the node's topology now (it changes with CPU hotplug); ``count``
    is called with (operation, result) for each write (``DriverMetrics``). ``enabled``
    False writes nothing at all (``run`` closes its inbox at once)."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        topology: Callable[[], Topology | None],
        count: Callable[[str, str], None] = lambda operation, result: None,
        enabled: bool = True,
        backoff_base: float = 0.5,
        backoff_cap: float = 60.0,
        forbidden_retry: float = 300.0,
        rand: Callable[[], float] = random.random,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._kube = kube
        self._node_name = node_name
        self._topology = topology
        self._count = count
        self._delays = RetryDelays(backoff_base, backoff_cap, rand)
        if not forbidden_retry > 0:
            raise ValueError(f"forbidden_retry must be > 0 seconds, got {forbidden_retry}")
        self._forbidden_retry = forbidden_retry
        self._now = now
        self._pending: dict[str, _Pending] = {}
        # What we applied last per claim (to skip a repeat) and since when it is Ready.
        self._applied: dict[str, bytes] = {}
        self._since: dict[str, datetime] = {}
        self._errors: dict[str, str] = {}
        self.disabled = "" if enabled else "turned off"
        self._forbidden_logged = False
        self.writes = 0

    # -- what /debug/state shows ---------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        claims: dict[str, str] = {uid: "written" for uid in self._applied}
        for uid, pending in self._pending.items():
            error = self._errors.get(uid)
            what = "removing" if isinstance(pending.change, ClaimUnprepared) else "writing"
            claims[uid] = f"{what} (retrying: {error})" if error else what
        return {"disabled": self.disabled or None, "writes": self.writes, "claims": claims}

    # -- the service -----------------------------------------------------------------------
    async def run(
        self,
        events: trio.MemoryReceiveChannel[ClaimEvent],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Take ``events`` (the owner's ``claim_events(repeated_prepares=True)``; the owner
        sends without waiting, into an unbounded inbox this drains at every wake-up) and
        write them. The channel ending (the owner stopped publishing: the daemon stops)
        ends the service at its next wait; a write still waiting for its retry then is
        left undone, as a stop always left it."""
        task_status.started()
        while True:
            if self.disabled:
                # Nothing will be written: a closed inbox is dropped by the owner at its
                # next event, so it builds none for us. Wait for the stop.
                events.close()
                await trio.sleep_forever()
            item = self._next_due()
            if item is None or item.due > trio.current_time():
                deadline = item.due if item is not None else math.inf
                with trio.move_on_at(deadline):
                    try:
                        self._take(await events.receive())
                    except trio.EndOfChannel:
                        return
                    while True:  # everything queued: the last word per claim wins
                        try:
                            self._take(events.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                continue
            await self._write(item)

    def _next_due(self) -> _Pending | None:
        return min(self._pending.values(), key=lambda p: p.due, default=None)

    def _take(self, change: ClaimEvent) -> None:
        if self.disabled:
            return
        uid = change.uid
        if isinstance(change, ClaimUnprepared) and uid not in self._applied:
            queued = self._pending.get(uid)
            if queued is not None and isinstance(queued.change, ClaimPrepared):
                # Never written: nothing to take back.
                self._forget(uid)
                return
        if isinstance(change, ClaimPrepared):
            self._since.setdefault(uid, self._now())
        self._pending[uid] = _Pending(change, due=trio.current_time())
        self._errors.pop(uid, None)

    def _forget(self, uid: str) -> None:
        self._pending.pop(uid, None)
        self._applied.pop(uid, None)
        self._since.pop(uid, None)
        self._errors.pop(uid, None)

    async def _write(self, item: _Pending) -> None:
        change = item.change
        uid = change.uid
        if isinstance(change, ClaimPrepared):
            operation = "apply"
            body = apply_body(
                change,
                topology=self._topology(),
                node_name=self._node_name,
                since=self._since.get(uid) or self._now(),
            )
            encoded = msgspec.json.encode(body)
            if self._applied.get(uid) == encoded:
                self._pending.pop(uid, None)  # the same again (a repeated prepare)
                return
        else:
            operation = "remove"
            body = removal_body(change.namespace, change.name)
        where = f"{change.namespace}/{change.name}"
        try:
            raw = await self._kube.call_raw(
                self._kube.resource.patch_namespaced_resource_claim_status,
                change.name,
                change.namespace,
                body,
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type=APPLY_PATCH,
            )
        except NotFound:
            # The claim is gone: its status went with it.
            self._finish(uid, operation, "gone")
            log.info("claim gone before its status was written", claim=where, uid=uid, v=4)
            return
        except K8sError as exc:
            self._failed(item, operation, where, exc)
            return
        finally:
            self.writes += 1
        # One task takes changes and writes them, so none arrived while the call was out.
        self._answered(item, operation, where, raw, body)

    def _answered(
        self, item: _Pending, operation: str, where: str, raw: bytes, body: Mapping[str, Any]
    ) -> None:
        change = item.change
        uid = change.uid
        answer = decode_answer(raw)
        answer_uid = answer.metadata.get("uid")
        if answer_uid and answer_uid != uid:
            # The name now holds another claim (ours was deleted and recreated): what we
            # applied belongs to no claim of ours, so take it back.
            self._finish(uid, operation, "gone")
            log.info("claim replaced; its status is not ours to write", claim=where, uid=uid)
            if isinstance(change, ClaimPrepared):
                removal = ClaimUnprepared(
                    uid=uid, namespace=change.namespace, name=change.name, cpus=change.cpus
                )
                self._pending[uid] = _Pending(removal, due=trio.current_time())
            return
        if isinstance(change, ClaimPrepared):
            present = entry_keys(answer.status.get("devices"))
            if not wanted_keys(change) <= present:
                self._finish(uid, operation, "refused")
                self.disabled = (
                    "the API server dropped status.devices: is the DRAResourceClaimDeviceStatus "
                    "feature gate off? (beta and on by default from Kubernetes 1.33)"
                )
                log.warning("claim status not written, and no more will be", reason=self.disabled)
                self._pending.clear()
                return
            self._applied[uid] = msgspec.json.encode(body)
            self._pending.pop(uid, None)
            self._errors.pop(uid, None)
            self._count(operation, "success")
            log.info("claim status written", claim=where, uid=uid, cpus=change.cpus, v=4)
            return
        self._finish(uid, operation, "success")
        log.info("claim status removed", claim=where, uid=uid, v=4)

    def _finish(self, uid: str, operation: str, result: str) -> None:
        self._count(operation, result)
        self._forget(uid)

    def _failed(self, item: _Pending, operation: str, where: str, exc: K8sError) -> None:
        uid = item.change.uid
        status = exc.status
        if status == 403:
            # RBAC without resourceclaims/status patch (or, from 1.36, associated-node:patch
            # on resourceclaims/driver): keep trying, rarely, and say it once.
            self._count(operation, "refused")
            if not self._forbidden_logged:
                self._forbidden_logged = True
                log.warning(
                    "claim status refused: the ClusterRole needs patch on "
                    "resourceclaims/status and associated-node:patch on resourceclaims/driver "
                    "(resourceNames dra.cpu); retrying every few minutes",
                    claim=where,
                    err=str(exc),
                )
            item.attempt += 1
            item.due = trio.current_time() + self._forbidden_retry
            self._errors[uid] = str(exc)
            return
        if status is not None and 400 <= status < 500 and status not in (408, 409, 429):
            # Invalid (422) or otherwise refused: the same body would be refused again.
            self._count(operation, "refused")
            log.warning("claim status refused", claim=where, uid=uid, err=str(exc))
            self._forget(uid)
            return
        self._count(operation, "error")
        delay = self._delays(item.attempt, exc.retry_after)
        item.attempt += 1
        item.due = trio.current_time() + delay
        self._errors[uid] = str(exc)
        log.info(
            "claim status not written; retrying",
            claim=where,
            uid=uid,
            err=str(exc),
            retryIn=round(delay, 2),
        )
