"""What dracpu writes in a claim's ``status.devices``: the pure body builders.

After a prepare commits, dracpu tells the cluster which CPUs the claim got: one
``AllocatedDeviceStatus`` per device dracpu prepared (the claim's
``status.allocation.devices.results`` of driver ``dra.cpu`` in this node's pool), written
through the ``resourceclaims/status`` subresource with server-side apply under dracpu's
own field manager (``dracpu.k8s.claim_status`` does the writing). At unprepare the entries
go again. ``kubectl get resourceclaim -o yaml`` then shows, with no access to the node::

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
before removes it (SSA semantics since 1.19, kubernetes#92661).

Both bodies name the claim's UID (``metadata.uid``): an apply is not a precondition
(the patch handler gives the store no UID to check, apiserver
pkg/endpoints/handlers/patch.go), but ``rest.BeforeUpdate`` validates the merged object's
metadata against the stored one (``ValidateObjectMetaAccessorUpdate``, pkg/registry/rest/
update.go), so a body naming another UID than the stored claim's is refused with a 422
``metadata.uid: Invalid value: "<uid>": field is immutable``. A write meant for a claim
that was deleted and recreated under the same name therefore never lands on the new one
(``replaced_claim`` recognises that answer); a name with no claim at all answers 404, as
the status subresource never creates.

The bodies are built from the state owner's ``ClaimPrepared`` (``dracpu.messages``); the
answer to an apply, or the claim read after a restart, is read for the claim's UID and our
entries (``Answer``, ``ready_since``, ``already_written``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec

from dracpu import DRIVER_NAME, RESOURCE_API_VERSION
from dracpu.cpuset import CPUSet
from dracpu.messages import ClaimPrepared
from dracpu.topology.model import Topology

__all__ = [
    "API_VERSION",
    "APPLY_PATCH",
    "DATA_MAX_BYTES",
    "FIELD_MANAGER",
    "Answer",
    "already_written",
    "apply_body",
    "decode_answer",
    "device_data",
    "entry_keys",
    "granular_authz_denied",
    "ready_since",
    "removal_body",
    "replaced_claim",
    "wanted_keys",
]

API_VERSION = RESOURCE_API_VERSION
APPLY_PATCH = "application/apply-patch+yaml"
# dracpu's field manager: the entries it applied are its own, other drivers' are theirs.
FIELD_MANAGER = "dracpu"
# AllocatedDeviceStatusDataMaxLength (k8s.io/api resource/v1): the raw JSON of `data`.
DATA_MAX_BYTES = 10 * 1024
READY = "Ready"
READY_REASON = "CPUsAssigned"


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


def _meta(namespace: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
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
    RFC 3339 in UTC, whole seconds as metav1.Time serialises). Raises ``ValueError`` for
    a cpuset that is not a Linux list."""
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
    meta = _meta(change.namespace, change.name, change.uid)
    return {**meta, "status": {"devices": entries}}


def removal_body(namespace: str, name: str, uid: str) -> dict[str, Any]:
    """The applied configuration that takes dracpu's entries away from the claim ``uid``:
    nothing. Fields this manager applied before and no longer applies are removed when no
    other manager owns them (kubernetes#92661), so other drivers' entries stay; the UID
    keeps it off a claim recreated under the same name (module docstring)."""
    return _meta(namespace, name, uid)


def replaced_claim(message: str, uid: str) -> bool:
    """Whether a 422's message is the API server refusing our UID: the name now holds
    another claim (``ValidateImmutableField`` on ``metadata.uid``; the message prints the
    value we sent, quoted)."""
    return f'metadata.uid: Invalid value: "{uid}": field is immutable' in message


# The field error AuthorizedForDeviceStatus (pkg/registry/resource/authz.go) adds when the
# caller may not change a driver's entries: the status strategy's validation returns it, so
# it reaches us as a 422 Invalid, not a 403.
_DRIVER_SUBRESOURCE = 'changing status.devices requires resource="resourceclaims/driver"'


def granular_authz_denied(message: str) -> bool:
    """Whether a 422's message is the 1.36 granular authorization's refusal (the
    ``DRAResourceClaimGranularStatusAuthorization`` gate): RBAC lacks ``associated-node:``
    or ``arbitrary-node:patch`` on ``resourceclaims/driver`` for this driver."""
    return _DRIVER_SUBRESOURCE in message


class Answer(msgspec.Struct, kw_only=True):
    """What the apply's answer is checked for: the claim's UID and our entries."""

    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    status: dict[str, Any] = msgspec.field(default_factory=dict)


_answer_decoder = msgspec.json.Decoder(Answer)


def decode_answer(raw: bytes) -> Answer:
    """The apply's answer; an empty one when it does not decode (then no UID is known and
    no entry is seen)."""
    try:
        return _answer_decoder.decode(raw)
    except msgspec.DecodeError:
        return Answer()


def entry_keys(entries: Any) -> set[tuple[str, str, str]]:
    """(pool, device, shareID) of each of our entries in a ``status.devices`` list."""
    out: set[tuple[str, str, str]] = set()
    for e in entries if isinstance(entries, list) else ():
        if isinstance(e, dict) and e.get("driver") == DRIVER_NAME:
            out.add((str(e.get("pool", "")), str(e.get("device", "")), str(e.get("shareID") or "")))
    return out


def wanted_keys(change: ClaimPrepared) -> set[tuple[str, str, str]]:
    """(pool, device, shareID) of the entries ``apply_body`` writes for ``change``."""
    return {(d.pool, d.device, d.share_id) for d in change.devices}


def _our_entries(answer: Answer) -> dict[tuple[str, str, str], dict[str, Any]]:
    entries = answer.status.get("devices")
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for e in entries if isinstance(entries, list) else ():
        if isinstance(e, dict) and e.get("driver") == DRIVER_NAME:
            key = (str(e.get("pool", "")), str(e.get("device", "")), str(e.get("shareID") or ""))
            out[key] = e
    return out


def ready_since(answer: Answer, change: ClaimPrepared) -> datetime | None:
    """When the claim became Ready, as its stored status says: the ``lastTransitionTime``
    of a Ready "True" condition on one of ``change``'s entries (a previous dracpu process
    wrote it). None when there is none, or it does not parse as RFC 3339."""
    wanted = wanted_keys(change)
    for key, entry in sorted(_our_entries(answer).items()):
        if key not in wanted:
            continue
        for condition in entry.get("conditions") or ():
            if not isinstance(condition, dict):
                continue
            if condition.get("type") != READY or condition.get("status") != "True":
                continue
            try:
                when = datetime.fromisoformat(str(condition.get("lastTransitionTime")))
            except ValueError:
                continue
            return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    return None


def already_written(answer: Answer, body: Mapping[str, Any]) -> bool:
    """Whether the stored claim already holds exactly the entries ``body`` applies, and no
    other entry of ours: applying it again would change nothing. Fields another manager
    added to our entries do not count (our apply leaves them as they are)."""
    ours = _our_entries(answer)
    wanted = body.get("status", {}).get("devices", [])
    if len(ours) != len(wanted):
        return False
    for entry in wanted:
        key = (entry["pool"], entry["device"], entry.get("shareID", ""))
        stored = ours.get(key)
        if stored is None or {k: stored.get(k) for k in entry} != entry:
            return False
    return True
