"""The owner's claim events, built from what a transaction holds (pure).

``NodeState`` calls these only when someone subscribed to ``claim_events``, so a node
without subscribers builds nothing. A ``ClaimPrepared`` names each device of the claim
as its allocation result does, share ID included: a ``status.devices`` entry of a device
shared through consumable capacity must carry the result's ``shareID``, or the API
server refuses it (kubernetes/kubernetes pkg/apis/resource/validation/validation.go,
``validateDeviceStatus``: the entry's driver/pool/device/shareID must name an allocated
device). The checkpoint does not keep share IDs, so they come from the claim as the
kubelet's prepare read it.
"""

from __future__ import annotations

from dracpu import DRIVER_NAME
from dracpu.allocation.prepare import ClaimAllocation
from dracpu.allocation.store import ClaimRecord
from dracpu.messages import ClaimDevice, ClaimPrepared, ClaimUnprepared

__all__ = ["claim_prepared", "claim_unprepared"]


def claim_prepared(
    record: ClaimRecord, claim: ClaimAllocation | None = None, *, repeated: bool = False
) -> ClaimPrepared:
    """The event of a prepare that left ``record`` prepared.

    ``claim`` is the claim the prepare read: its namespace and name, and its results'
    share IDs. ``record.devices`` holds one device per allocation result of this driver,
    in order (``plan_claim``), so the n-th takes the n-th such result's share ID. Without
    the claim (a test that drives the owner's steps alone) the record's names are used and
    no device has a share ID."""
    if claim is None:
        namespace, name, shares = record.namespace, record.name, []
    else:
        namespace, name = claim.namespace, claim.name
        shares = [r.share_id for r in claim.results if r.driver == DRIVER_NAME]
    devices = tuple(
        ClaimDevice(
            pool=d.pool_name,
            device=d.device_name,
            share_id=shares[i] if i < len(shares) else "",
        )
        for i, d in enumerate(record.devices)
    )
    return ClaimPrepared(
        uid=record.uid,
        namespace=namespace,
        name=name,
        cpus=record.cpus.format(),
        devices=devices,
        shared_pool_access=record.shared_pool_access,
        repeated=repeated,
    )


def claim_unprepared(record: ClaimRecord, namespace: str = "", name: str = "") -> ClaimUnprepared:
    """The event of an unprepare that released ``record``, named as the kubelet named it
    (the record's names when none are given)."""
    return ClaimUnprepared(
        uid=record.uid,
        namespace=namespace or record.namespace,
        name=name or record.name,
        cpus=record.cpus.format(),
    )
