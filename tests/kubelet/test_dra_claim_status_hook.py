"""DRAService tells the claim status writer of each committed prepare and unprepare
(dracpu.k8s.claim_status), without waiting for it, and of nothing that did not commit."""

from __future__ import annotations

from builders import claim, result
from kubelet_harness import make_node

from dracpu.k8s.claim_status import (
    ClaimPrepared,
    ClaimStatusChange,
    ClaimUnprepared,
    StatusDevice,
)
from dracpu.kubelet import ClaimRef

SHARE = "6a1b0f0e-8d39-4f6e-9c38-2f4a0a1b2c3d"


async def test_committed_prepares_and_unprepares_are_told(cdi_dir: str) -> None:
    node = make_node(cdi_dir)
    told: list[ClaimStatusChange] = []
    service = node.restart(claim_status=told.append)
    node.claims.put(claim("o1", result("cpudevnuma000", 2, share_id=SHARE), name="web"))
    ref = ClaimRef(namespace="default", name="web", uid="o1")
    assert (await service.prepare([ref]))["o1"].error == ""
    record = node.view.claim("o1")
    assert record is not None
    assert told == [
        ClaimPrepared(
            uid="o1",
            namespace="default",
            name="web",
            cpus=record.cpus.format(),
            devices=(StatusDevice(pool="node-a", device="cpudevnuma000", share_id=SHARE),),
            shared_pool_access=False,
        )
    ]
    assert (await service.unprepare([ref]))["o1"].error == ""
    assert told[1:] == [ClaimUnprepared(uid="o1", namespace="default", name="web")]


async def test_nothing_is_told_of_what_did_not_commit(cdi_dir: str) -> None:
    node = make_node(cdi_dir)
    told: list[ClaimStatusChange] = []
    service = node.restart(claim_status=told.append)
    # A device this node does not publish: the prepare fails.
    node.claims.put(claim("o2", result("cpudevnuma999", 1), name="bad"))
    bad = ClaimRef(namespace="default", name="bad", uid="o2")
    assert (await service.prepare([bad]))["o2"].error
    # An unprepare of a claim never prepared here releases nothing.
    assert (await service.unprepare([bad]))["o2"].error == ""
    assert told == []
