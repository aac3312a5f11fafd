"""get_node_uid against the loopback API server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from dracpu.k8s.client import KubeClient, NotFound, ServerError
from dracpu.k8s.nodes import get_node_uid
from dracpu_sim.apiserver import SimAPIServer


@pytest.fixture
async def sim(
    nursery: trio.Nursery, tmp_path: Path
) -> AsyncIterator[tuple[SimAPIServer, KubeClient]]:
    server = SimAPIServer(seed=9)
    await nursery.start(server.serve)
    kube = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    yield server, kube
    kube.close()


async def test_get_node_uid(sim: tuple[SimAPIServer, KubeClient]) -> None:
    server, kube = sim
    node = server.create("nodes", {"metadata": {"name": "node-a"}})
    assert await get_node_uid(kube, "node-a") == node["metadata"]["uid"]


async def test_missing_node(sim: tuple[SimAPIServer, KubeClient]) -> None:
    _, kube = sim
    with pytest.raises(NotFound) as info:
        await get_node_uid(kube, "node-x")
    assert str(info.value) == 'get node node-x: nodes "node-x" not found'
    assert info.value.status == 404


async def test_server_error(sim: tuple[SimAPIServer, KubeClient]) -> None:
    server, kube = sim
    server.create("nodes", {"metadata": {"name": "node-a"}})
    server.faults.inject("get", "nodes", 1, status=500)
    with pytest.raises(ServerError) as info:
        await get_node_uid(kube, "node-a")
    assert str(info.value) == "get node node-a: Internal error occurred: injected fault"
