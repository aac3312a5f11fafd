"""The Node UID lookup (a raw GET, no generated CoreV1Api): against the loopback API
server, and against answers no API server should give."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from dracpu.k8s.client import KubeClient, NotFound, ServerError
from dracpu.k8s.nodes import NodeLookupError, get_node_uid
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


async def test_reads_the_uid_without_the_generated_core_api(
    sim: tuple[SimAPIServer, KubeClient],
) -> None:
    server, kube = sim
    node = server.create("nodes", {"metadata": {"name": "node-a"}})
    assert await get_node_uid(kube, "node-a") == node["metadata"]["uid"]
    assert kube._core is None


async def test_missing_node_keeps_not_found(sim: tuple[SimAPIServer, KubeClient]) -> None:
    _, kube = sim
    with pytest.raises(NotFound) as info:
        await get_node_uid(kube, "node-x")
    assert str(info.value) == 'get node node-x: nodes "node-x" not found'
    assert info.value.status == 404


async def test_server_error_names_the_node(sim: tuple[SimAPIServer, KubeClient]) -> None:
    server, kube = sim
    server.create("nodes", {"metadata": {"name": "node-a"}})
    server.faults.inject("get", "nodes", 1, status=500)
    with pytest.raises(ServerError) as info:
        await get_node_uid(kube, "node-a")
    assert str(info.value) == "get node node-a: Internal error occurred: injected fault"
    assert info.value.status == 500


class _Answers:
    """A client whose raw GET returns one fixed body."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.asked: list[tuple[str, dict[str, str]]] = []

    async def get_raw(self, resource_path: str, **params: str) -> bytes:
        self.asked.append((resource_path, params))
        return self.body


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "get node node-a: decode: Input data was truncated"),
        (b"<html>", "get node node-a: decode: JSON is malformed: invalid character (byte 0)"),
        (
            b'{"metadata": {"uid": 7}}',
            "get node node-a: decode: Expected `str`, got `int` - at `$.metadata.uid`",
        ),
        (b'{"metadata": {}}', "get node node-a: the node has no metadata.uid"),
        (b"{}", "get node node-a: the node has no metadata.uid"),
    ],
)
async def test_an_answer_without_a_usable_uid_is_a_lookup_error(body: bytes, message: str) -> None:
    api: Any = _Answers(body)
    with pytest.raises(NodeLookupError) as info:
        await get_node_uid(api, "node-a")
    assert str(info.value) == message
    assert api.asked == [("/api/v1/nodes/{name}", {"name": "node-a"})]
