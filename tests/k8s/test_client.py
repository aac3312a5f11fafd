"""KubeClient: raw GETs through the ApiClient, and generated API classes built on first use."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from dracpu.k8s.client import ConnectionFailed, KubeClient, NotFound, ServerError, load_api_client
from dracpu_sim.apiserver import SimAPIServer


@pytest.fixture
async def sim(
    nursery: trio.Nursery, tmp_path: Path
) -> AsyncIterator[tuple[SimAPIServer, KubeClient]]:
    server = SimAPIServer(seed=3)
    await nursery.start(server.serve)
    kube = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    yield server, kube
    kube.close()


async def test_get_raw_returns_the_object_json(sim: tuple[SimAPIServer, KubeClient]) -> None:
    server, kube = sim
    node = server.create("nodes", {"metadata": {"name": "node-a", "labels": {"x": "y"}}})
    doc = json.loads(await kube.get_raw("/api/v1/nodes/{name}", name="node-a"))
    assert doc["kind"] == "Node"
    assert doc["metadata"]["uid"] == node["metadata"]["uid"]
    assert doc["metadata"]["labels"] == {"x": "y"}


async def test_get_raw_missing_object_is_not_found(sim: tuple[SimAPIServer, KubeClient]) -> None:
    _, kube = sim
    with pytest.raises(NotFound) as info:
        await kube.get_raw("/api/v1/nodes/{name}", name="node-x")
    assert str(info.value) == 'nodes "node-x" not found'
    assert info.value.status == 404
    assert info.value.reason == "NotFound"


async def test_get_raw_encodes_path_parameters(sim: tuple[SimAPIServer, KubeClient]) -> None:
    server, kube = sim
    server.create("nodes", {"metadata": {"name": "node-a"}})
    # A slash in a name must not reach another path (here: the node list).
    with pytest.raises(NotFound) as info:
        await kube.get_raw("/api/v1/nodes/{name}", name="node-a/..")
    assert info.value.status == 404


async def test_get_raw_server_error(sim: tuple[SimAPIServer, KubeClient]) -> None:
    server, kube = sim
    server.create("nodes", {"metadata": {"name": "node-a"}})
    server.faults.inject("get", "nodes", 1, status=500)
    with pytest.raises(ServerError) as info:
        await kube.get_raw("/api/v1/nodes/{name}", name="node-a")
    assert str(info.value) == "Internal error occurred: injected fault"
    assert info.value.status == 500
    # The fault was one-shot: the next GET answers.
    assert json.loads(await kube.get_raw("/api/v1/nodes/{name}", name="node-a"))["kind"] == "Node"


async def test_get_raw_connection_refused(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    kube = KubeClient(load_api_client(str(kubeconfig), retries=0), request_timeout=5)
    try:
        with pytest.raises(ConnectionFailed) as info:
            await kube.get_raw("/api/v1/nodes/{name}", name="node-a")
    finally:
        kube.close()
    assert str(info.value).startswith("connection to the API server failed: ")


async def test_generated_apis_are_built_on_first_use(
    sim: tuple[SimAPIServer, KubeClient],
) -> None:
    server, kube = sim
    assert kube._core is None and kube._resource is None
    core = kube.core
    assert type(core).__name__ == "CoreV1Api" and kube.core is core
    assert core.api_client is kube.api_client
    resource = kube.resource
    assert type(resource).__name__ == "ResourceV1Api" and kube.resource is resource
    server.create("nodes", {"metadata": {"name": "node-a"}})
    raw = await kube.call_raw(kube.core.read_node, "node-a")
    assert json.loads(raw)["metadata"]["name"] == "node-a"
    with trio.fail_after(10):
        listed = json.loads(await kube.call_raw(kube.resource.list_resource_slice))
    assert listed["items"] == []
