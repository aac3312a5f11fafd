"""Prepare with claims read from the loopback API server through the real kubernetes
client (``ApiClaimSource``), over the DRA socket with grpcio."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import trio
from builders import allocation, claim, device_result, resource_claim, result
from kubelet_harness import (
    NODE,
    Node,
    in_thread,
    make_node,
    prepare_request,
    prepare_stub,
    rpc_error,
    serving,
)

from dracpu.k8s.client import KubeClient
from dracpu.kubelet import ApiClaimSource
from dracpu_sim.apiserver import SimAPIServer


@pytest.fixture
async def api(
    nursery: trio.Nursery, tmp_path: Path
) -> AsyncIterator[tuple[SimAPIServer, KubeClient]]:
    server = SimAPIServer(seed=7)
    await nursery.start(server.serve)
    kube = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    yield server, kube
    kube.close()


@pytest.fixture
def node(api: tuple[SimAPIServer, KubeClient], cdi_dir: str) -> Any:
    node = make_node(cdi_dir)
    node.claims = ApiClaimSource(api[1], pool=NODE)  # type: ignore[assignment]
    node.restart()
    return node


def create_claim(server: SimAPIServer, name: str, results: list[dict[str, Any]]) -> str:
    obj = server.create("resourceclaims", resource_claim(name), "default")
    server.patch(
        "resourceclaims",
        name,
        {"status": {"allocation": allocation(*results)}},
        "default",
        subresource="status",
    )
    return str(obj["metadata"]["uid"])


async def test_prepare_reads_the_claim_from_the_api(
    nursery: trio.Nursery, api: tuple[SimAPIServer, KubeClient], node: Node
) -> None:
    server, _ = api
    uid = create_claim(
        server,
        "web",
        [
            device_result("cpudevnuma002", 6),
            # Another node's pool and another driver are not ours to prepare.
            device_result("cpudevnuma000", 6, pool="node-b"),
            device_result("g0", request="gpu", driver="gpu.example.com"),
        ],
    )
    async with serving(nursery, node.service) as (_, ch):
        reply = await in_thread(
            lambda: prepare_stub(ch)(prepare_request("v1", claim(uid, name="web")), timeout=10)
        )
        missing = await in_thread(
            lambda: rpc_error(
                lambda: prepare_stub(ch)(
                    prepare_request("v1", claim("u-x", name="gone")), timeout=10
                )
            )
        )
    devices = reply.claims[uid].devices
    assert [(d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in devices] == [
        (NODE, "cpudevnuma002", [f"dra.k8s.io/cpu=claim-{uid}"])
    ]
    cpus = node.view.cpus_of(uid)
    assert cpus is not None and len(cpus) == 6 and cpus <= node.inventory.cpus_of("cpudevnuma002")
    assert (missing.code(), missing.details()) == (
        grpc.StatusCode.UNKNOWN,
        'retrieve claim default/gone: resourceclaims.resource.k8s.io "gone" not found',
    )


async def test_memory_source_errors_and_pool_filter() -> None:
    from dracpu.k8s.claims import ClaimNotAllocated, ClaimNotFound, ClaimReplaced
    from dracpu.kubelet import MemoryClaimSource

    mine = result("cpudevnuma000", 1)
    other_pool = result("cpudevnuma001", 1, pool="node-b")
    other_driver = result("g0", driver="gpu.example.com")
    source = MemoryClaimSource(
        [
            claim("u1", mine, other_pool, other_driver, name="web"),
            claim("u2", name="idle", allocated=False),
        ],
        pool=NODE,
    )
    assert (await source.get("default", "web", "u1")).results == (mine,)
    unfiltered = MemoryClaimSource([claim("u1", mine, other_pool, name="web")])
    assert (await unfiltered.get("default", "web", "u1")).results == (mine, other_pool)
    cases = [
        (
            ("default", "nope", "u9"),
            ClaimNotFound,
            'retrieve claim default/nope: resourceclaims.resource.k8s.io "nope" not found',
        ),
        (("default", "web", "u9"), ClaimReplaced, "claim default/web got replaced"),
        (("default", "idle", "u2"), ClaimNotAllocated, "claim default/idle not allocated"),
    ]
    for args, kind, message in cases:
        with pytest.raises(kind) as info:
            await source.get(*args)
        assert str(info.value) == message
    source.delete("default", "web")
    assert len(source) == 1
