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
``associated-node:patch`` (or ``arbitrary-node:patch``) on the synthetic
``resourceclaims/driver`` subresource named ``dra.cpu`` (pkg/registry/resource/authz.go
``AuthorizedForDeviceStatus``): deploy/base grants it with ``resourceclaims/status``
``patch``. That check runs in the status strategy's validation, so a missing grant comes
back as a 422 Invalid whose message names ``resourceclaims/driver``, not as a 403; both
are taken as a refusal by RBAC (said once, retried every few minutes). A writer that
writes nothing (turned off, or the gate off) closes its inbox, so the owner stops building
events for it.

Both bodies carry the claim's UID, so a write for a claim deleted and recreated under the
same name is refused (422 on ``metadata.uid``) instead of landing on the new claim, and is
taken as "gone" (``claim_status_body``). After a restart the kubelet prepares its claims
again (``ClaimPrepared.repeated``): for a claim this process has not seen before, the
writer first reads the claim, keeps the Ready condition's ``lastTransitionTime`` a previous
process wrote (a restart is no transition) and writes nothing when the stored entries are
already the ones it would apply. An unprepare is dropped unsent only when this process
saw the claim's first prepare and sent nothing for it; otherwise the previous process may
have written entries, and the removal goes out.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec
import trio

from dracpu import RESOURCE_API_VERSION
from dracpu.k8s.claim_status_body import (
    APPLY_PATCH,
    FIELD_MANAGER,
    Answer,
    already_written,
    apply_body,
    decode_answer,
    entry_keys,
    granular_authz_denied,
    ready_since,
    removal_body,
    replaced_claim,
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
        # Claims whose first (not repeated) prepare this process saw, and claims a write
        # was sent for (answered or not): together they tell whether an unprepare may be
        # dropped unsent.
        self._first_seen: set[str] = set()
        self._sent: set[str] = set()
        # The claim as read after a restart, until its first write is decided.
        self._stored: dict[str, Answer] = {}
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
        if isinstance(change, ClaimUnprepared):
            if uid in self._first_seen and uid not in self._sent:
                # This process saw the claim prepared for the first time and sent nothing
                # for it: nobody wrote entries, there is nothing to take back. After a
                # restart (only repeated prepares seen) the previous process may have.
                self._forget(uid)
                return
        elif not change.repeated:
            self._first_seen.add(uid)
            self._since.setdefault(uid, self._now())
        self._pending[uid] = _Pending(change, due=trio.current_time())
        self._errors.pop(uid, None)

    def _forget(self, uid: str) -> None:
        self._pending.pop(uid, None)
        self._applied.pop(uid, None)
        self._since.pop(uid, None)
        self._errors.pop(uid, None)
        self._first_seen.discard(uid)
        self._sent.discard(uid)

    async def _stored_since(self, change: ClaimPrepared) -> datetime | Literal[False] | None:
        """Read the claim (a prepare this process did not see first, after a restart):
        its Ready time as stored, None when it has none, False when the claim is gone or
        replaced. A failed read only loses the stored time (the write goes on)."""
        where = f"{change.namespace}/{change.name}"
        try:
            raw = await self._kube.get_raw(
                f"/apis/{RESOURCE_API_VERSION}/namespaces/{{namespace}}/resourceclaims/{{name}}",
                namespace=change.namespace,
                name=change.name,
            )
        except NotFound:
            return False
        except K8sError as exc:
            log.info("claim not read; its Ready time starts now", claim=where, err=str(exc))
            return None
        answer = decode_answer(raw)
        if answer.metadata.get("uid", change.uid) != change.uid:
            return False
        self._stored[change.uid] = answer
        return ready_since(answer, change)

    async def _write(self, item: _Pending) -> None:
        change = item.change
        uid = change.uid
        where = f"{change.namespace}/{change.name}"
        if isinstance(change, ClaimPrepared):
            operation = "apply"
            if uid not in self._since:
                stored = await self._stored_since(change)
                if stored is False:
                    self._finish(uid, operation, "gone")
                    log.info("claim gone before its status was written", claim=where, uid=uid)
                    return
                self._since[uid] = stored if isinstance(stored, datetime) else self._now()
            body = apply_body(
                change, topology=self._topology(), node_name=self._node_name, since=self._since[uid]
            )
            encoded = msgspec.json.encode(body)
            stored_claim = self._stored.pop(uid, None)
            if self._applied.get(uid) == encoded or (
                stored_claim is not None and already_written(stored_claim, body)
            ):
                # The same again (a repeated prepare), or what a previous process wrote.
                self._applied[uid] = encoded
                self._pending.pop(uid, None)
                return
        else:
            operation = "remove"
            body = removal_body(change.namespace, change.name, uid)
        self._sent.add(uid)
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
            # The body named our UID, so a real API server refuses it on another claim
            # (422, handled in _failed); one that answers with another claim anyway has
            # nothing of ours left to write to.
            self._finish(uid, operation, "gone")
            log.info("claim replaced; its status is not ours to write", claim=where, uid=uid)
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
        if status == 422 and replaced_claim(exc.message, uid):
            # The name holds another claim now (ours was deleted and recreated): ours is gone.
            self._finish(uid, operation, "gone")
            log.info("claim replaced; its status is not ours to write", claim=where, uid=uid)
            return
        if status == 403 or (status == 422 and granular_authz_denied(exc.message)):
            # RBAC without resourceclaims/status patch (403), or, from 1.36, without
            # associated-node:patch on resourceclaims/driver (the status strategy's
            # validation refuses it: 422): keep trying, rarely, and say it once.
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
