"""The CPUs on the claim's status: dracpu's entries in ``ResourceClaim.status.devices``.

After a prepare commits, dracpu tells the cluster which CPUs the claim got: one
``AllocatedDeviceStatus`` per device dracpu prepared (the claim's
``status.allocation.devices.results`` of driver ``dra.cpu`` in this node's pool), written
through the ``resourceclaims/status`` subresource with server-side apply under dracpu's
own field manager. At unprepare the entries go again. ``kubectl get resourceclaim -o
yaml`` then shows, with no access to the node::

    status:
      devices:
      - driver: dra.cpu
        pool: node-1
        device: cpudevnuma000
        conditions:
        - type: Ready
          status: "True"
          reason: CPUsAssigned
          message: 4 exclusive CPUs 4-7 on node node-1
          lastTransitionTime: "2026-12-03T15:00:00Z"
        data:
          cpuset: 4-7
          numaNodes: "0"
          fullCores: true
          sharedPoolAccess: false

``data`` (docs/troubleshooting.md documents the keys): ``cpuset`` is the claim's CPUs in
the Linux list format, what its containers' ``cpuset.cpus`` holds (plus the shared pool
when ``sharedPoolAccess``); ``numaNodes`` the NUMA nodes of those CPUs, list format as in
``cpuset.mems``; ``fullCores`` whether every physical core touched is the claim's whole
(all its hardware threads); ``cpuCount`` the number of CPUs. Every entry of one claim
carries the same data: the claim's containers get the union of its devices.

What the API server allows (kubernetes/kubernetes, resource.k8s.io/v1 ``AllocatedDeviceStatus``
in staging/src/k8s.io/api/resource/v1/types.go, checked by ``validateDeviceStatus`` in
pkg/apis/resource/validation/validation.go): an entry must name an allocated device of the
claim (driver, pool, device, and ``shareID`` when the result has one), at most 8
conditions, ``data`` a JSON object of at most 10 KiB. ``status.devices`` is a
``listType=map`` keyed on driver, device, pool and shareID, so server-side apply merges our
entries with other drivers' and a manager that applies again without an entry it applied
before removes it (SSA semantics since 1.19, kubernetes#92661). The field is behind the
``DRAResourceClaimDeviceStatus`` gate: alpha in 1.32, beta and on by default from 1.33, GA
in 1.37 (pkg/features/kube_features.go). With the gate off the server drops the field
silently (``dropDisabledDRAResourceClaimDeviceStatusFields`` in
pkg/registry/resource/resourceclaim/strategy.go): the writer notices its entries missing
from the answer, says so once and stops writing. From 1.36 the
``DRAResourceClaimGranularStatusAuthorization`` gate (beta, on) also asks for verb
``associated-node:patch`` on the synthetic ``resourceclaims/driver`` subresource named
``dra.cpu`` (pkg/registry/resource/authz.go ``AuthorizedForDeviceStatus``): deploy/base
grants it with ``resourceclaims/status`` ``patch``.

Writing is a service beside the prepare, never in its path: ``ClaimStatusWriter.send`` takes
a ``ClaimPrepared`` or ``ClaimUnprepared`` without waiting; ``run`` applies them one at a
time, the last word per claim wins, and a failed write is counted
(``dracpu_claim_status_writes_total``), logged and retried with backoff. The body is built
by the pure ``apply_body`` / ``removal_body``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec
import trio

from dracpu import DRIVER_NAME, RESOURCE_API_VERSION
from dracpu.cpuset import CPUSet
from dracpu.k8s.client import K8sError, KubeClient, NotFound
from dracpu.k8s.slice_api import RetryDelays
from dracpu.logs import get_logger
from dracpu.topology.model import Topology

__all__ = [
    "API_VERSION",
    "APPLY_PATCH",
    "DATA_MAX_BYTES",
    "FIELD_MANAGER",
    "ClaimPrepared",
    "ClaimStatusChange",
    "ClaimStatusWriter",
    "ClaimUnprepared",
    "StatusDevice",
    "apply_body",
    "claim_prepared",
    "device_data",
    "removal_body",
]

log = get_logger("dracpu.k8s.claim_status")

API_VERSION = RESOURCE_API_VERSION
APPLY_PATCH = "application/apply-patch+yaml"
# dracpu's field manager: the entries it applied are its own, other drivers' are theirs.
FIELD_MANAGER = "dracpu"
# AllocatedDeviceStatusDataMaxLength (k8s.io/api resource/v1): the raw JSON of `data`.
DATA_MAX_BYTES = 10 * 1024
READY = "Ready"
READY_REASON = "CPUsAssigned"

# dracpu_claim_status_writes_total{operation, result}
OPERATIONS = ("apply", "remove")
RESULTS = ("success", "error", "gone", "refused")


class StatusDevice(msgspec.Struct, frozen=True, kw_only=True):
    """One allocated device of ours, as its allocation result names it."""

    pool: str
    device: str
    share_id: str = ""


class ClaimPrepared(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A prepare committed: the claim holds ``cpus`` (Linux list format) for ``devices``."""

    uid: str
    namespace: str
    name: str
    cpus: str
    devices: tuple[StatusDevice, ...]
    shared_pool_access: bool = False


class ClaimUnprepared(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """An unprepare committed: dracpu's entries leave the claim's status."""

    uid: str
    namespace: str
    name: str


ClaimStatusChange = ClaimPrepared | ClaimUnprepared


class _ClaimName(Protocol):
    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...


class _Holding(Protocol):
    @property
    def cpus(self) -> CPUSet: ...
    @property
    def shared_pool_access(self) -> bool: ...


class _ReplyDevice(Protocol):
    @property
    def pool_name(self) -> str: ...
    @property
    def device_name(self) -> str: ...
    @property
    def share_id(self) -> str: ...


def claim_prepared(
    claim: _ClaimName, record: _Holding, devices: Iterable[_ReplyDevice]
) -> ClaimPrepared:
    """The message of a committed prepare: the claim (``ClaimAllocation``), what it holds
    (``ClaimRecord``) and the devices the kubelet is told about (the prepare reply's)."""
    return ClaimPrepared(
        uid=claim.uid,
        namespace=claim.namespace,
        name=claim.name,
        cpus=record.cpus.format(),
        devices=tuple(
            StatusDevice(pool=d.pool_name, device=d.device_name, share_id=d.share_id)
            for d in devices
        ),
        shared_pool_access=record.shared_pool_access,
    )


# -- the pure part ---------------------------------------------------------------------


def device_data(
    cpus: CPUSet, topology: Topology | None, *, shared_pool_access: bool = False
) -> dict[str, Any]:
    """The ``data`` object of each of a claim's entries (keys in the module docstring).

    NUMA nodes and full cores come from the topology; CPUs it does not know (offline now)
    are left out of both, and without a topology the two keys are left out."""
    data: dict[str, Any] = {"cpuset": cpus.format(), "cpuCount": len(cpus)}
    if topology is not None:
        known = [topology.cpus[c] for c in cpus if c in topology.cpus]
        data["numaNodes"] = CPUSet(info.numa for info in known).format()
        cores = topology.by_core_key
        data["fullCores"] = bool(known) and all(cores[info.core_key] <= cpus for info in known)
    data["sharedPoolAccess"] = shared_pool_access
    if len(msgspec.json.encode(data)) > DATA_MAX_BYTES:
        # Thousands of scattered CPUs: the list would not fit the API's 10 KiB. The count
        # and the rest still go; /debug/state on the node has the list.
        del data["cpuset"]
        data["cpusetOmitted"] = f"longer than the {DATA_MAX_BYTES} bytes the API allows"
    return data


def _meta(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
    }


def apply_body(
    change: ClaimPrepared,
    *,
    topology: Topology | None,
    node_name: str,
    since: datetime,
) -> dict[str, Any]:
    """The applied configuration of a prepared claim: one entry per device of ours.

    ``since`` is when the claim became Ready (the condition's ``lastTransitionTime``,
    RFC 3339 in UTC, whole seconds as metav1.Time serialises)."""
    cpus = CPUSet.parse(change.cpus)
    data = device_data(cpus, topology, shared_pool_access=change.shared_pool_access)
    noun = "exclusive CPU" if len(cpus) == 1 else "exclusive CPUs"
    where = f" on node {node_name}" if node_name else ""
    condition = {
        "type": READY,
        "status": "True",
        "reason": READY_REASON,
        "message": f"{len(cpus)} {noun} {change.cpus}{where}",
        "lastTransitionTime": since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    entries = []
    for device in change.devices:
        entry: dict[str, Any] = {
            "driver": DRIVER_NAME,
            "pool": device.pool,
            "device": device.device,
        }
        if device.share_id:
            entry["shareID"] = device.share_id
        entry["conditions"] = [condition]
        entry["data"] = data
        entries.append(entry)
    return {**_meta(change.namespace, change.name), "status": {"devices": entries}}


def removal_body(namespace: str, name: str) -> dict[str, Any]:
    """The applied configuration that takes dracpu's entries away: nothing. Fields this
    manager applied before and no longer applies are removed when no other manager owns
    them (kubernetes#92661), so other drivers' entries stay."""
    return _meta(namespace, name)


class _Answer(msgspec.Struct, kw_only=True):
    """What the apply's answer is checked for: the claim's UID and our entries."""

    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    status: dict[str, Any] = msgspec.field(default_factory=dict)


_answer_decoder = msgspec.json.Decoder(_Answer)


def _entry_keys(entries: Any) -> set[tuple[str, str, str]]:
    """(pool, device, shareID) of each of our entries in a ``status.devices`` list."""
    out: set[tuple[str, str, str]] = set()
    for e in entries if isinstance(entries, list) else ():
        if isinstance(e, dict) and e.get("driver") == DRIVER_NAME:
            out.add((str(e.get("pool", "")), str(e.get("device", "")), str(e.get("shareID") or "")))
    return out


def _wanted_keys(change: ClaimPrepared) -> set[tuple[str, str, str]]:
    return {(d.pool, d.device, d.share_id) for d in change.devices}


# -- the service ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Pending:
    change: ClaimStatusChange
    attempt: int = 0
    due: float = 0.0


class ClaimStatusWriter:
    """Applies claim status changes as they come, one call at a time, out of the prepare's
    way. The constructor does no I/O; ``run`` is the service.

    ``topology`` returns the node's topology now (it changes with CPU hotplug); ``count``
    is called with (operation, result) for each write (``DriverMetrics``). ``enabled``
    False makes ``send`` drop everything (the status is not written at all)."""

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
        # Unbounded: ``send`` is called from the prepare path, which must never wait for
        # the API server; the task drains the inbox at every wake-up and keeps the last
        # word per claim, so the queue holds at most the calls since its last wake-up.
        self._send, self._recv = trio.open_memory_channel[ClaimStatusChange](math.inf)
        self._pending: dict[str, _Pending] = {}
        # What we applied last per claim (to skip a repeat) and since when it is Ready.
        self._applied: dict[str, bytes] = {}
        self._since: dict[str, datetime] = {}
        self._errors: dict[str, str] = {}
        self.disabled = "" if enabled else "turned off"
        self._forbidden_logged = False
        self.writes = 0

    # -- the sending side (the DRA service's hook): never waits ------------------------
    def send(self, change: ClaimStatusChange) -> None:
        if not self.disabled:
            self._send.send_nowait(change)

    # -- what /debug/state shows ---------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        claims: dict[str, str] = {uid: "written" for uid in self._applied}
        for uid, pending in self._pending.items():
            error = self._errors.get(uid)
            what = "removing" if isinstance(pending.change, ClaimUnprepared) else "writing"
            claims[uid] = f"{what} (retrying: {error})" if error else what
        return {"disabled": self.disabled or None, "writes": self.writes, "claims": claims}

    # -- the service -----------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            item = self._next_due()
            if item is None or item.due > trio.current_time():
                deadline = item.due if item is not None else math.inf
                with trio.move_on_at(deadline):
                    self._take(await self._recv.receive())
                    while True:  # everything queued: the last word per claim wins
                        try:
                            self._take(self._recv.receive_nowait())
                        except trio.WouldBlock:
                            break
                continue
            await self._write(item)

    def _next_due(self) -> _Pending | None:
        return min(self._pending.values(), key=lambda p: p.due, default=None)

    def _take(self, change: ClaimStatusChange) -> None:
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
        try:
            answer = _answer_decoder.decode(raw)
        except msgspec.DecodeError:
            answer = _Answer()
        answer_uid = answer.metadata.get("uid")
        if answer_uid and answer_uid != uid:
            # The name now holds another claim (ours was deleted and recreated): what we
            # applied belongs to no claim of ours, so take it back.
            self._finish(uid, operation, "gone")
            log.info("claim replaced; its status is not ours to write", claim=where, uid=uid)
            if isinstance(change, ClaimPrepared):
                self._pending[uid] = _Pending(
                    ClaimUnprepared(uid=uid, namespace=change.namespace, name=change.name),
                    due=trio.current_time(),
                )
            return
        if isinstance(change, ClaimPrepared):
            present = _entry_keys(answer.status.get("devices"))
            if not _wanted_keys(change) <= present:
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
