"""One claim named many times in one call is read from the API server once.

The API lets a pod list the same ResourceClaim under two of its spec.resourceClaims
entries, and the kubelet then sends it twice in one NodePrepareResources. A hostile client
can send one claim up to MAX_CLAIMS_PER_CALL times: without this, every copy was a GET.
The daemon's own claim source (``ApiClaimSource`` over ``KubeClient``) against the
simulated API server, which counts the GETs it answers.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from builders import allocation, device_result, resource_claim
from kubelet_harness import NODE, Node, make_node, short_dir

from dracpu.k8s.claims import ClaimNotFound
from dracpu.k8s.client import KubeClient
from dracpu.kubelet import ApiClaimSource
from dracpu.kubelet.dra import ClaimRef
from dracpu_sim.apiserver import SimAPIServer


@pytest.fixture
async def node_and_api(
    nursery: trio.Nursery, tmp_path: Path
) -> AsyncIterator[tuple[Node, SimAPIServer]]:
    server = SimAPIServer(seed=3)
    await nursery.start(server.serve)
    kube = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    cdi_dir = short_dir("dup.")
    node = make_node(cdi_dir)
    node.service.claims = ApiClaimSource(kube, NODE)
    await node.start_checkpoint(nursery, str(tmp_path / "state"))
    yield node, server
    kube.close()
    shutil.rmtree(cdi_dir, ignore_errors=True)


def _allocated_claim(server: SimAPIServer, name: str) -> ClaimRef:
    created = server.create("resourceclaims", resource_claim(name, 2), "default")
    server.patch(
        "resourceclaims",
        name,
        {"status": {"allocation": allocation(device_result("cpudevnuma000", 2))}},
        "default",
        subresource="status",
    )
    return ClaimRef(namespace="default", name=name, uid=created["metadata"]["uid"])


async def test_a_claim_named_three_times_is_read_once_and_prepared(
    node_and_api: tuple[Node, SimAPIServer],
) -> None:
    node, server = node_and_api
    web, db = _allocated_claim(server, "web"), _allocated_claim(server, "db")
    results = await node.service.prepare([web, db, web, web])
    assert server.calls.get("get", "resourceclaims") == 2
    assert set(results) == {web.uid, db.uid}
    assert all(not r.error and len(r.devices) == 1 for r in results.values())
    # One claim, prepared once: its CPUs are held once.
    assert len(node.view.claim(web.uid).cpus) == 2  # type: ignore[union-attr]
    assert node.view.claim(db.uid) is not None


async def test_a_missing_claim_named_many_times_is_one_lookup(
    node_and_api: tuple[Node, SimAPIServer],
) -> None:
    node, server = node_and_api
    ghost = ClaimRef(namespace="default", name="ghost", uid="6f1c2a3e-0b5d-4c1e-9a57-1d2e3f405162")
    with pytest.raises(ClaimNotFound, match='"ghost" not found'):
        await node.service.prepare([ghost] * 1000)
    assert server.calls.get("get", "resourceclaims") == 1
    assert node.view.claim(ghost.uid) is None
