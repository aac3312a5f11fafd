"""DRAService without sockets: claim owners released on unprepare."""

from __future__ import annotations

from builders import claim, result
from kubelet_harness import make_node

from dracpu.allocation.store import ContainerRecord, Owner
from dracpu.kubelet import ClaimRef


async def test_unprepare_releases_the_claim_owner(cdi_dir: str) -> None:
    node = make_node(cdi_dir)
    node.claims.put(claim("o1", result("cpudevnuma000", 1), name="web"))
    ref = ClaimRef(namespace="default", name="web", uid="o1")
    assert (await node.service.prepare([ref]))["o1"].error == ""
    cpus = node.view.cpus_of("o1")
    assert cpus is not None
    holder = ContainerRecord(pod_uid="pod-1", name="app", container_id="c1")
    assert node.state.admit(holder, {"o1": cpus}).claim_uids == ("o1",)
    assert node.view.owner_of("o1") == Owner("pod-1", "app")
    assert (await node.service.unprepare([ref]))["o1"].error == ""
    assert node.view.owner_of("o1") is None
