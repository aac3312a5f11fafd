"""DRAService without sockets: claim owners released on unprepare."""

from __future__ import annotations

from builders import claim, result
from kubelet_harness import make_node

from dracpu.kubelet import ClaimRef


async def test_unprepare_releases_the_claim_owner(cdi_dir: str) -> None:
    node = make_node(cdi_dir)
    node.claims.put(claim("o1", result("cpudevnuma000", 1), name="web"))
    ref = ClaimRef(namespace="default", name="web", uid="o1")
    assert (await node.service.prepare([ref]))["o1"].error == ""
    assert node.state.bind("pod-1", "app", ["o1"]) == ["o1"]
    assert (await node.service.unprepare([ref]))["o1"].error == ""
    assert node.state.tracker.owner_of("o1") is None
