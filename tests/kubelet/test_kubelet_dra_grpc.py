"""NodePrepareResources / NodeUnprepareResources through the real DRA socket with the
official grpcio client, on both DRA API versions (behavior.md §7, §8, §10, §11)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import grpc
import pytest
import trio
from builders import claim, result
from kubelet_harness import (
    NODE,
    VERSIONS,
    Node,
    in_thread,
    make_node,
    prepare_request,
    prepare_stub,
    rpc_error,
    serving,
    unprepare_request,
    unprepare_stub,
)

from dracpu.allocation.store import AllocationStore, ClaimRecord
from dracpu.cdi import claim_spec_path, read_claim_specs
from dracpu.cpuset import CPUSet

UID_A = "6f1c2a3e-0b5d-4c1e-9a57-1d2e3f405162"
UID_B = "7a2d3b4f-1c6e-4d2f-8b68-2e3f40516273"


@pytest.fixture
def node(cdi_dir: str) -> Node:
    return make_node(cdi_dir)


@pytest.fixture
async def channel(nursery: trio.Nursery, node: Node) -> AsyncIterator[grpc.Channel]:
    async with serving(nursery, node.service) as (_, ch):
        yield ch


def spec_cpus(node: Node, uid: str) -> CPUSet:
    return read_claim_specs(node.cdi_dir).claims[uid]


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_prepare_grouped_claim(node: Node, channel: grpc.Channel, version: str) -> None:
    pb = VERSIONS[version]
    share = "4c1b2f7e-0000-4000-8000-000000000001"
    c = claim(
        UID_A,
        result("cpudevnuma001", 2, share_id=share),
        result("cpudevnuma001", 1, request="more/sub"),
    )
    node.claims.put(c)
    reply = await in_thread(lambda: prepare_stub(channel, version)(prepare_request(version, c)))
    cdi_id = f"dra.k8s.io/cpu=claim-{UID_A}"
    first = pb.Device(
        request_names=["cpus"], pool_name=NODE, device_name="cpudevnuma001", cdi_device_ids=[cdi_id]
    )
    if version == "v1":
        first.share_id = share  # v1beta1 has no share_id field
    second = pb.Device(
        request_names=["more"], pool_name=NODE, device_name="cpudevnuma001", cdi_device_ids=[cdi_id]
    )
    assert reply == pb.NodePrepareResourcesResponse(
        claims={UID_A: pb.NodePrepareResourceResponse(devices=[first, second])}
    )
    cpus = node.view.cpus_of(UID_A)
    assert cpus is not None and len(cpus) == 3
    assert cpus <= node.inventory.cpus_of("cpudevnuma001")
    assert spec_cpus(node, UID_A) == cpus
    assert node.metric("dra_cpu_prepare_claims_total", result="success") == 1
    assert node.metric("dra_cpu_claim_allocated_cpus_sum") == 3
    assert node.metric("dra_cpu_allocated_cpus") == 3
    assert node.metric("dra_cpu_available_cpus") == 125
    assert node.metric("dra_cpu_resource_claims_active") == 1
    assert node.changes == [node.view.shared_pool.format()]


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_unprepare_releases_cpus_and_removes_spec(
    node: Node, channel: grpc.Channel, version: str
) -> None:
    pb = VERSIONS[version]
    c = claim(UID_A, result("cpudevnuma000", 4))
    node.claims.put(c)
    await in_thread(lambda: prepare_stub(channel, version)(prepare_request(version, c)))
    assert os.path.exists(claim_spec_path(node.cdi_dir, UID_A))
    unknown = claim("never-prepared")
    reply = await in_thread(
        lambda: unprepare_stub(channel, version)(unprepare_request(version, c, unknown))
    )
    assert reply == pb.NodeUnprepareResourcesResponse(
        claims={
            UID_A: pb.NodeUnprepareResourceResponse(),
            "never-prepared": pb.NodeUnprepareResourceResponse(),
        }
    )
    assert not node.view.has_claim(UID_A)
    assert node.view.shared_pool == node.topology.all_cpus
    assert not os.path.exists(claim_spec_path(node.cdi_dir, UID_A))
    assert node.metric("dra_cpu_unprepare_claims_total", result="success") == 2
    assert node.metric("dra_cpu_allocated_cpus") == 0
    assert len(node.changes) == 2
    assert node.changes[-1] == node.view.shared_pool.format()
    # Unpreparing again is still fine.
    again = await in_thread(lambda: unprepare_stub(channel, version)(unprepare_request(version, c)))
    assert again.claims[UID_A].error == ""


async def test_idempotent_replay_returns_same_cpus(node: Node, channel: grpc.Channel) -> None:
    c = claim(UID_A, result("cpudevnuma002", 3))
    node.claims.put(c)
    stub = prepare_stub(channel)
    first = await in_thread(lambda: stub(prepare_request("v1", c)))
    cpus = node.view.cpus_of(UID_A)
    os.unlink(claim_spec_path(node.cdi_dir, UID_A))  # a replay restores a deleted spec
    second = await in_thread(lambda: stub(prepare_request("v1", c)))
    assert second == first
    assert node.view.cpus_of(UID_A) == cpus
    assert spec_cpus(node, UID_A) == cpus
    assert sorted(os.listdir(node.cdi_dir)) == [f"dra.k8s.io-cpu_claim-{UID_A}.json"]
    assert node.metric("dra_cpu_prepare_claims_total", result="success") == 2
    assert node.metric("dra_cpu_claim_allocated_cpus_count") == 1  # new allocations only
    assert len(node.changes) == 1


async def test_replay_after_restart_from_cdi_specs(nursery: trio.Nursery, node: Node) -> None:
    a = claim(UID_A, result("cpudevnuma003", 8))
    node.claims.put(a)
    async with serving(nursery, node.service) as (_, ch):
        before = await in_thread(lambda: prepare_stub(ch)(prepare_request("v1", a)))
    cpus_a = node.view.cpus_of(UID_A)
    assert cpus_a is not None
    # The daemon restarts: a fresh store rebuilt from the specs on disk, a new service.
    scan = read_claim_specs(node.cdi_dir)
    assert scan.errors == []
    store = AllocationStore(node.view.allocatable, node.view.reserved)
    for uid, cpus in scan.claims.items():
        assert store.reserve(ClaimRecord(uid=uid, cpus=cpus))
    node.restart(store)
    b = claim(UID_B, result("cpudevnuma003", 24))
    node.claims.put(b)
    async with serving(nursery, node.service) as (_, ch):
        after = await in_thread(lambda: prepare_stub(ch)(prepare_request("v1", a)))
        reply_b = await in_thread(lambda: prepare_stub(ch)(prepare_request("v1", b)))
    assert after == before
    assert node.view.cpus_of(UID_A) == cpus_a
    assert reply_b.claims[UID_B].error == ""
    cpus_b = node.view.cpus_of(UID_B)
    assert cpus_b is not None and cpus_b.isdisjoint(cpus_a)
    assert cpus_a | cpus_b == node.inventory.cpus_of("cpudevnuma003")


@pytest.mark.parametrize(
    ("stored", "wanted", "message"),
    [
        (
            None,
            "not-there",
            'retrieve claim default/web: resourceclaims.resource.k8s.io "web" not found',
        ),
        ("other-uid", UID_A, "claim default/web got replaced"),
        ("unallocated", UID_A, "claim default/web not allocated"),
    ],
)
@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_unreadable_claim_fails_the_whole_call(
    node: Node, channel: grpc.Channel, version: str, stored: str | None, wanted: str, message: str
) -> None:
    good = claim(UID_B, result("cpudevnuma000", 2))
    node.claims.put(good)
    if stored == "other-uid":
        node.claims.put(claim("other-uid", name="web"))
    elif stored == "unallocated":
        node.claims.put(claim(UID_A, name="web", allocated=False))
    bad = claim(wanted, name="web")
    err = await in_thread(
        lambda: rpc_error(
            lambda: prepare_stub(channel, version)(prepare_request(version, good, bad), timeout=5)
        )
    )
    assert (err.code(), err.details()) == (grpc.StatusCode.UNKNOWN, message)
    assert len(node.view.claims()) == 0  # the readable claim before it was not prepared either
    assert os.listdir(node.cdi_dir) == []


async def test_allocation_errors_are_per_claim(node: Node, channel: grpc.Channel) -> None:
    too_big = claim("big", result("cpudevnuma000", 33))
    fine = claim("fine", result("cpudevnuma000", 32))
    bad_device = claim("bad-dev", result("cpudevnuma009", 1))
    fractional = claim("frac", result("cpudevnuma001", "1500m"))
    unallocated_results = claim("nothing", result("gpu0", driver="gpu.example.com"))
    for c in (too_big, fine, bad_device, fractional, unallocated_results):
        node.claims.put(c)
    request = prepare_request("v1", too_big, fine, bad_device, fractional, unallocated_results)
    reply = await in_thread(lambda: prepare_stub(channel)(request, timeout=5))
    errors = {uid: r.error for uid, r in reply.claims.items()}
    assert errors == {
        "big": "not enough cpus available to satisfy request: requested=33, available=32",
        "fine": "",
        "bad-dev": "no valid NUMA node ID found for device cpudevnuma009",
        "frac": 'CPU capacity for device "cpudevnuma001" must be a whole number, got 1500m',
        "nothing": "",
    }
    assert len(reply.claims["fine"].devices) == 1
    assert list(reply.claims["nothing"].devices) == []
    assert [r.uid for r in node.view.claims()] == ["fine"]
    assert os.listdir(node.cdi_dir) == ["dra.k8s.io-cpu_claim-fine.json"]
    assert node.metric("dra_cpu_prepare_claims_total", result="error") == 3
    assert node.metric("dra_cpu_prepare_claims_total", result="success") == 2
    assert node.metric("dra_cpu_prepare_claim_duration_seconds_count") == 5


async def test_invalid_claim_uid_is_a_claim_error(node: Node, channel: grpc.Channel) -> None:
    c = claim("../../etc/x", result("cpudevnuma000", 1), name="evil")
    node.claims.put(c)
    reply = await in_thread(lambda: prepare_stub(channel)(prepare_request("v1", c), timeout=5))
    assert reply.claims["../../etc/x"].error == (
        "invalid claim UID \"../../etc/x\": must not contain '/', '..' or NUL"
    )
    assert len(node.view.claims()) == 0
    done = await in_thread(lambda: unprepare_stub(channel)(unprepare_request("v1", c), timeout=5))
    assert done.claims["../../etc/x"].error == ""


async def test_cdi_write_failure_rolls_back_new_claim(node: Node, channel: grpc.Channel) -> None:
    c = claim(UID_A, result("cpudevnuma000", 2))
    node.claims.put(c)
    # A directory where the spec goes makes the final rename fail.
    blocker = claim_spec_path(node.cdi_dir, UID_A)
    os.makedirs(os.path.join(blocker, "x"))
    reply = await in_thread(lambda: prepare_stub(channel)(prepare_request("v1", c), timeout=5))
    error = reply.claims[UID_A].error
    assert error.startswith(f'failed to write CDI spec "{blocker}": ')
    assert "Is a directory" in error or "Directory not empty" in error
    assert list(reply.claims[UID_A].devices) == []
    assert len(node.view.claims()) == 0
    assert node.view.shared_pool == node.topology.all_cpus
    assert os.listdir(node.cdi_dir) == [os.path.basename(blocker)]  # no temp file left
    assert node.metric("dra_cpu_claim_allocated_cpus_count") == 0
    assert node.changes == []


async def test_cdi_write_failure_keeps_prepared_claim(node: Node, channel: grpc.Channel) -> None:
    c = claim(UID_A, result("cpudevnuma000", 2))
    node.claims.put(c)
    await in_thread(lambda: prepare_stub(channel)(prepare_request("v1", c), timeout=5))
    cpus = node.view.cpus_of(UID_A)
    path = claim_spec_path(node.cdi_dir, UID_A)
    os.unlink(path)
    os.makedirs(os.path.join(path, "x"))
    reply = await in_thread(lambda: prepare_stub(channel)(prepare_request("v1", c), timeout=5))
    assert reply.claims[UID_A].error.startswith(f'failed to write CDI spec "{path}": ')
    assert node.view.cpus_of(UID_A) == cpus  # §8.6: the stored allocation is kept


async def test_cdi_remove_failure_keeps_allocation(node: Node, channel: grpc.Channel) -> None:
    c = claim(UID_A, result("cpudevnuma000", 2))
    node.claims.put(c)
    await in_thread(lambda: prepare_stub(channel)(prepare_request("v1", c), timeout=5))
    path = claim_spec_path(node.cdi_dir, UID_A)
    os.unlink(path)
    os.makedirs(os.path.join(path, "x"))
    reply = await in_thread(lambda: unprepare_stub(channel)(unprepare_request("v1", c), timeout=5))
    assert reply.claims[UID_A].error.startswith(f'failed to remove CDI spec "{path}": ')
    assert node.view.has_claim(UID_A)
    assert node.metric("dra_cpu_unprepare_claims_total", result="error") == 1


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_malformed_protobuf_then_next_call(
    node: Node, channel: grpc.Channel, version: str
) -> None:
    from kubelet_harness import dra_path

    raw = channel.unary_unary(dra_path(version, "NodePrepareResources"))
    err = await in_thread(lambda: rpc_error(lambda: raw(b"\x0a\x05ab", timeout=5)))
    assert err.code() == grpc.StatusCode.INTERNAL
    assert err.details().startswith("failed to decode request message: ")
    c = claim(UID_A, result("cpudevnuma000", 1))
    node.claims.put(c)
    reply = await in_thread(
        lambda: prepare_stub(channel, version)(prepare_request(version, c), timeout=5)
    )
    assert reply.claims[UID_A].error == ""


async def test_oversized_request_then_next_call(node: Node, nursery: trio.Nursery) -> None:
    async with serving(nursery, node.service) as (served, _):
        ch = grpc.insecure_channel(
            "unix:" + served.plugin.dra_socket,
            options=[("grpc.max_send_message_length", 8 * 1024 * 1024)],
        )
        try:
            big = prepare_request(
                "v1", *(claim(f"u{i:07d}", name="n" * 400) for i in range(10_000))
            )
            assert big.ByteSize() > 4 * 1024 * 1024
            err = await in_thread(lambda: rpc_error(lambda: prepare_stub(ch)(big, timeout=10)))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert err.details().startswith("received message larger than max (")
            c = claim(UID_A, result("cpudevnuma000", 1))
            node.claims.put(c)
            reply = await in_thread(lambda: prepare_stub(ch)(prepare_request("v1", c), timeout=5))
            assert reply.claims[UID_A].error == ""
        finally:
            ch.close()


async def test_unknown_method(channel: grpc.Channel) -> None:
    path = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeFrobnicate"
    err = await in_thread(lambda: rpc_error(lambda: channel.unary_unary(path)(b"", timeout=5)))
    assert (err.code(), err.details()) == (
        grpc.StatusCode.UNIMPLEMENTED,
        "unknown method NodeFrobnicate for service k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    )
