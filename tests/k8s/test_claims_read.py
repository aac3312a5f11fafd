"""read_claim against the loopback API server, through the real kubernetes client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from dracpu.allocation.opaque import DeviceConfig
from dracpu.allocation.prepare import AllocationResult, ClaimAllocation
from dracpu.k8s.claims import (
    ClaimNotAllocated,
    ClaimNotFound,
    ClaimReadError,
    ClaimReplaced,
    decode_claim,
    read_claim,
)
from dracpu.k8s.client import KubeClient
from dracpu_sim.apiserver import SimAPIServer


@pytest.fixture
async def sim(
    nursery: trio.Nursery, tmp_path: Path
) -> AsyncIterator[tuple[SimAPIServer, KubeClient]]:
    server = SimAPIServer(seed=5)
    await nursery.start(server.serve)
    kube = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    yield server, kube
    kube.close()


ALLOCATION = {
    "devices": {
        "results": [
            {
                "request": "cpus",
                "driver": "dra.cpu",
                "pool": "node-a",
                "device": "cpudev000",
                "shareID": "4c1b2f7e-0000-4000-8000-000000000001",
                "consumedCapacity": {"dra.cpu/cpu": "4"},
            },
            {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu0"},
            {"request": "cpus", "driver": "dra.cpu", "pool": "node-b", "device": "cpudev009"},
            {"request": "more/sub", "driver": "dra.cpu", "pool": "node-a", "device": "cpudev001"},
        ],
        "config": [
            {
                "source": "FromClaim",
                "requests": ["cpus"],
                "opaque": {
                    "driver": "dra.cpu",
                    "parameters": {"apiVersion": "dra.cpu/v1", "kind": "CPUConfig"},
                },
            },
            {
                "source": "FromClass",
                "opaque": {"driver": "gpu.example.com", "parameters": {"x": 1}},
            },
        ],
    },
    "nodeSelector": {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
        ]
    },
}


def make_claim(server: SimAPIServer, allocation: dict[str, Any] | None = ALLOCATION) -> str:
    claim = server.create(
        "resourceclaims",
        {
            "metadata": {"name": "web"},
            "spec": {
                "devices": {
                    "requests": [{"name": "cpus", "exactly": {"deviceClassName": "dra.cpu"}}]
                }
            },
        },
        "ns1",
    )
    if allocation is not None:
        server.patch(
            "resourceclaims",
            "web",
            {"status": {"allocation": allocation}},
            "ns1",
            subresource="status",
        )
    return str(claim["metadata"]["uid"])


async def test_read_claim_extracts_this_drivers_results(
    sim: tuple[SimAPIServer, KubeClient],
) -> None:
    server, kube = sim
    uid = make_claim(server)
    got = await read_claim(kube, "ns1", "web", uid, pool="node-a")
    assert got == ClaimAllocation(
        uid=uid,
        namespace="ns1",
        name="web",
        allocated=True,
        results=(
            AllocationResult(
                request="cpus",
                driver="dra.cpu",
                pool="node-a",
                device="cpudev000",
                consumed_capacity={"dra.cpu/cpu": "4"},
                share_id="4c1b2f7e-0000-4000-8000-000000000001",
            ),
            AllocationResult(
                request="more/sub", driver="dra.cpu", pool="node-a", device="cpudev001"
            ),
        ),
        configs=(
            DeviceConfig(
                source="FromClaim",
                requests=("cpus",),
                driver="dra.cpu",
                parameters=b'{"apiVersion":"dra.cpu/v1","kind":"CPUConfig"}',
            ),
            DeviceConfig(source="FromClass", driver="gpu.example.com", parameters=b'{"x":1}'),
        ),
    )
    every_pool = await read_claim(kube, "ns1", "web", uid)
    assert [r.device for r in every_pool.results] == ["cpudev000", "cpudev009", "cpudev001"]
    assert server.calls.get("get", "resourceclaims") == 2


async def test_claim_not_found(sim: tuple[SimAPIServer, KubeClient]) -> None:
    _, kube = sim
    with pytest.raises(ClaimNotFound) as info:
        await read_claim(kube, "ns1", "web", "uid-1")
    assert str(info.value) == (
        'retrieve claim ns1/web: resourceclaims.resource.k8s.io "web" not found'
    )
    assert (info.value.namespace, info.value.name) == ("ns1", "web")


async def test_claim_replaced(sim: tuple[SimAPIServer, KubeClient]) -> None:
    server, kube = sim
    make_claim(server)
    with pytest.raises(ClaimReplaced) as info:
        await read_claim(kube, "ns1", "web", "an-older-uid")
    assert str(info.value) == "claim ns1/web got replaced"


async def test_claim_not_allocated(sim: tuple[SimAPIServer, KubeClient]) -> None:
    server, kube = sim
    uid = make_claim(server, allocation=None)
    with pytest.raises(ClaimNotAllocated) as info:
        await read_claim(kube, "ns1", "web", uid)
    assert str(info.value) == "claim ns1/web not allocated"


async def test_server_error_is_a_retrieve_error(sim: tuple[SimAPIServer, KubeClient]) -> None:
    server, kube = sim
    uid = make_claim(server)
    server.faults.inject("get", "resourceclaims", 1, status=403, message="forbidden by test")
    with pytest.raises(ClaimReadError) as info:
        await read_claim(kube, "ns1", "web", uid)
    assert type(info.value) is ClaimReadError
    assert str(info.value) == "retrieve claim ns1/web: forbidden by test"


def test_decode_claim_only_other_drivers() -> None:
    raw = (
        b'{"metadata":{"uid":"u"},"status":{"allocation":{"devices":{"results":'
        b'[{"request":"r","driver":"other","pool":"p","device":"d"}]}}}}'
    )
    assert decode_claim(raw, "ns", "c", "u") == ClaimAllocation(
        uid="u", namespace="ns", name="c", allocated=True
    )


def test_decode_claim_bad_json() -> None:
    with pytest.raises(ClaimReadError) as info:
        decode_claim(b'{"metadata": {"uid": 5}}', "ns", "c", "u")
    assert str(info.value) == (
        "retrieve claim ns/c: decode: Expected `str`, got `int` - at `$.metadata.uid`"
    )


LONG = "x" * (4 * 1024 * 1024)


@pytest.mark.parametrize(
    ("namespace", "name", "message"),
    [
        (
            "ns1",
            LONG,
            f"retrieve claim ns1/{'x' * 64}...(4194304 characters): invalid name: must be 1 "
            "to 253 characters, not 4194304",
        ),
        (
            "n" * 65536,
            "web",
            f"retrieve claim {'n' * 64}...(65536 characters)/web: invalid namespace: must be 1 "
            "to 63 characters, not 65536",
        ),
        (
            "ns1",
            "Web_1",
            "retrieve claim ns1/Web_1: invalid name: a lowercase RFC 1123 subdomain must "
            "consist of lower case alphanumeric characters, '-' or '.', and must start and end "
            "with an alphanumeric character",
        ),
        (
            "NS",
            "web",
            "retrieve claim NS/web: invalid namespace: a lowercase RFC 1123 label must consist "
            "of lower case alphanumeric characters or '-', and must start and end with an "
            "alphanumeric character",
        ),
        ("", "web", "retrieve claim /web: invalid namespace: must be 1 to 63 characters, not 0"),
        ("ns1", "", "retrieve claim ns1/: invalid name: must be 1 to 253 characters, not 0"),
    ],
)
async def test_names_no_claim_can_have_are_refused_before_any_lookup(
    sim: tuple[SimAPIServer, KubeClient], namespace: str, name: str, message: str
) -> None:
    server, kube = sim
    # Any request would fail this way: none is made.
    server.faults.inject("get", "resourceclaims", 1, status=500, message="looked up")
    with pytest.raises(ClaimReadError) as info:
        await read_claim(kube, namespace, name, "uid-1")
    assert str(info.value) == message
    assert type(info.value) is ClaimReadError


async def test_the_longest_names_a_claim_can_have_are_looked_up(
    sim: tuple[SimAPIServer, KubeClient],
) -> None:
    _, kube = sim
    name = ".".join(["a" * 63] * 3) + "." + "b" * 61  # 253 characters
    with pytest.raises(ClaimNotFound):
        await read_claim(kube, "n" * 63, name, "uid-1")


async def test_read_claim_is_a_raw_get_without_the_generated_api(
    sim: tuple[SimAPIServer, KubeClient],
) -> None:
    # ResourceV1Api pulls in the client's model classes and validates every argument of
    # every call: the claim is read without ever building it.
    server, kube = sim
    uid = make_claim(server)
    for _ in range(3):
        await read_claim(kube, "ns1", "web", uid, pool="node-a")
    assert kube._resource is None
    assert server.calls.get("get", "resourceclaims") == 3
