"""Concurrent prepares never hand out a CPU twice; deadlines, cancellation and persist
failures leave the store as §8.6 says (behavior.md §7, §8.6, §8.7)."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
import trio
from builders import claim, result
from kubelet_harness import (
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

from dracpu.allocation.checkpoint import decode_checkpoint
from dracpu.allocation.prepare import ClaimAllocation
from dracpu.atomicfile import atomic_write
from dracpu.cdi import claim_spec_path, read_claim_specs
from dracpu.cpuset import CPUSet
from dracpu.kubelet import ClaimRef, MemoryClaimSource


def _prepare_all(channel: grpc.Channel, claims: list[ClaimAllocation]) -> list[Any]:
    stub = prepare_stub(channel)
    futures = [stub.future(prepare_request("v1", c), timeout=60) for c in claims]
    return [f.result() for f in futures]


def _assert_disjoint(node: Node) -> CPUSet:
    union = CPUSet()
    total = 0
    for record in node.view.claims():
        union |= record.cpus
        total += len(record.cpus)
    assert len(union) == total, "a CPU was given to two claims"
    assert union <= node.view.allocatable
    assert read_claim_specs(node.cdi_dir).claims == {r.uid: r.cpus for r in node.view.claims()}
    return union


async def test_100_concurrent_prepares_grouped(nursery: trio.Nursery, cdi_dir: str) -> None:
    node = make_node(cdi_dir, reserved="0-1")
    # 25 claims of 2 CPUs per NUMA node of 32 (30 on node 0): some must fail, none overlap.
    claims = [claim(f"g-{i:03d}", result(f"cpudevnuma{i % 4:03d}", 2)) for i in range(100)]
    for c in claims:
        node.claims.put(c)
    async with serving(nursery, node.service) as (_, ch):
        replies = await in_thread(lambda: _prepare_all(ch, claims))
    errors = [r.claims[c.uid].error for r, c in zip(replies, claims, strict=True)]
    ok = [c for c, e in zip(claims, errors, strict=True) if not e]
    assert len(ok) == 15 + 16 * 3
    assert {e for e in errors if e} == {
        "not enough cpus available to satisfy request: requested=2, available=0"
    }
    union = _assert_disjoint(node)
    assert len(union) == 2 * len(ok)
    assert not union & CPUSet.parse("0-1")
    for c in ok:
        group = node.inventory.cpus_of(c.results[0].device)
        cpus = node.view.cpus_of(c.uid)
        assert cpus is not None and cpus <= group


async def test_100_concurrent_prepares_individual(nursery: trio.Nursery, cdi_dir: str) -> None:
    node = make_node(cdi_dir, mode="individual")
    # Claims i and i+64 name the same device: exactly one of each pair may win it.
    claims = [claim(f"i-{i:03d}", result(f"cpudev{i % 64:03d}")) for i in range(100)]
    for c in claims:
        node.claims.put(c)
    async with serving(nursery, node.service) as (_, ch):
        replies = await in_thread(lambda: _prepare_all(ch, claims))
    errors = {c.uid: r.claims[c.uid].error for r, c in zip(replies, claims, strict=True)}
    assert sum(1 for e in errors.values() if not e) == 64
    for i in range(36):
        pair = [errors[f"i-{i:03d}"], errors[f"i-{i + 64:03d}"]]
        loser = next(e for e in pair if e)
        assert pair.count("") == 1
        assert loser.endswith("has overlapping device assignment with other claims")
    assert len(_assert_disjoint(node)) == 64


async def test_concurrent_prepare_and_unprepare_cycles(nursery: trio.Nursery, cdi_dir: str) -> None:
    node = make_node(cdi_dir, fixture="xeon-2s-ht")
    claims = [claim(f"c-{i:03d}", result(f"cpudevnuma{i % 2:03d}", 8)) for i in range(40)]
    for c in claims:
        node.claims.put(c)

    def cycle(ch: grpc.Channel, c: ClaimAllocation) -> list[str]:
        errors = []
        for _ in range(3):
            reply = prepare_stub(ch)(prepare_request("v1", c), timeout=60)
            errors.append(reply.claims[c.uid].error)
            unprepare_stub(ch)(unprepare_request("v1", c), timeout=60)
        return errors

    async with serving(nursery, node.service) as (_, ch), trio.open_nursery() as clients:
        for c in claims:
            clients.start_soon(in_thread, lambda c=c: cycle(ch, c))
    assert len(node.view.claims()) == 0
    assert os.listdir(cdi_dir) == []
    assert node.metric("dra_cpu_allocated_cpus") == 0
    assert node.metric("dra_cpu_available_cpus") == 80


class BlockingClaims(MemoryClaimSource):
    """Claims named "block" wait for ``release`` (or cancellation) before being returned."""

    def __init__(self) -> None:
        super().__init__()
        self.started = trio.Event()
        self.cancelled = trio.Event()
        self.release = trio.Event()

    async def get(self, namespace: str, name: str, uid: str) -> ClaimAllocation:
        if name == "block":
            self.started.set()
            try:
                await self.release.wait()
            except trio.Cancelled:
                self.cancelled.set()
                raise
        return await super().get(namespace, name, uid)


async def test_deadline_exceeded_changes_nothing(nursery: trio.Nursery, cdi_dir: str) -> None:
    node = make_node(cdi_dir)
    source = BlockingClaims()
    node.claims = source
    node.restart()
    slow = claim("slow", result("cpudevnuma000", 2), name="block")
    source.put(slow)
    async with serving(nursery, node.service) as (_, ch):
        err = await in_thread(
            lambda: rpc_error(lambda: prepare_stub(ch)(prepare_request("v1", slow), timeout=0.3))
        )
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        with trio.fail_after(5):
            await source.cancelled.wait()
        assert len(node.view.claims()) == 0
        source.release.set()
        reply = await in_thread(lambda: prepare_stub(ch)(prepare_request("v1", slow), timeout=5))
        assert reply.claims["slow"].error == ""


async def test_client_cancel_cancels_the_prepare(nursery: trio.Nursery, cdi_dir: str) -> None:
    node = make_node(cdi_dir)
    source = BlockingClaims()
    node.claims = source
    node.restart()
    slow = claim("slow", result("cpudevnuma000", 2), name="block")
    source.put(slow)
    async with serving(nursery, node.service) as (_, ch):
        future = prepare_stub(ch).future(prepare_request("v1", slow), timeout=30)
        with trio.fail_after(5):
            await source.started.wait()
        assert future.cancel()
        with trio.fail_after(5):
            await source.cancelled.wait()
        assert len(node.view.claims()) == 0
        # The lock was never taken, so the next call goes through.
        other = claim("other", result("cpudevnuma001", 1))
        source.put(other)
        reply = await in_thread(lambda: prepare_stub(ch)(prepare_request("v1", other), timeout=5))
        assert reply.claims["other"].error == ""


def failing_write(calls: list[int], node: Node, errno: int, text: str) -> Any:
    def write(path: str, data: bytes, **kw: Any) -> None:
        calls.append(len(node.view.durable_claims()))
        raise OSError(errno, text)

    return write


async def test_persist_failure_rolls_back(nursery: trio.Nursery, cdi_dir: str) -> None:
    calls: list[int] = []
    node = make_node(cdi_dir)
    state_dir = os.path.join(cdi_dir, "state")
    await node.start_checkpoint(
        nursery, state_dir, failing_write(calls, node, 28, "No space left on device")
    )
    c = claim("p1", result("cpudevnuma000", 2), name="web")
    node.claims.put(c)
    ref = ClaimRef(namespace="default", name="web", uid="p1")
    results = await node.service.prepare([ref])
    assert results["p1"].error == (
        "failed to record claim default/web: failed to write checkpoint "
        f'"{state_dir}/checkpoint.json": No space left on device'
    )
    assert results["p1"].devices == ()
    assert calls == [1]  # the checkpoint would have held the pending claim
    assert len(node.view.claims()) == 0
    assert node.view.durable_claims() == []
    assert not os.path.exists(claim_spec_path(cdi_dir, "p1"))
    assert node.changes == []
    assert node.metric("dra_cpu_prepare_claims_total", result="error") == 1


async def test_persist_failure_on_unprepare_keeps_the_claim(
    nursery: trio.Nursery, cdi_dir: str
) -> None:
    fail = False
    node = make_node(cdi_dir)

    def write(path: str, data: bytes, **kw: Any) -> None:
        if fail:
            raise OSError(5, "Input/output error")
        atomic_write(path, data, **kw)

    state_dir = os.path.join(cdi_dir, "state")
    await node.start_checkpoint(nursery, state_dir, write)
    c = claim("p2", result("cpudevnuma001", 4), name="web")
    node.claims.put(c)
    ref = ClaimRef(namespace="default", name="web", uid="p2")
    assert (await node.service.prepare([ref]))["p2"].error == ""
    cpus = node.view.cpus_of("p2")
    fail = True
    results = await node.service.unprepare([ref])
    assert results["p2"].error == (
        "failed to record claim default/web: failed to write checkpoint "
        f'"{state_dir}/checkpoint.json": Input/output error'
    )
    assert node.view.cpus_of("p2") == cpus
    assert [r.uid for r in node.view.durable_claims()] == ["p2"]
    assert read_claim_specs(cdi_dir).claims == {"p2": cpus}
    fail = False
    assert (await node.service.unprepare([ref]))["p2"].error == ""
    assert len(node.view.claims()) == 0
    on_disk = decode_checkpoint(Path(state_dir, "checkpoint.json").read_bytes())
    assert on_disk.claims == ()


async def test_cancelled_during_persist_still_commits(nursery: trio.Nursery, cdi_dir: str) -> None:
    entered = threading.Event()
    release = threading.Event()
    node = make_node(cdi_dir)

    def write(path: str, data: bytes, **kw: Any) -> None:
        entered.set()
        release.wait(10)
        atomic_write(path, data, **kw)

    state_dir = os.path.join(cdi_dir, "state")
    await node.start_checkpoint(nursery, state_dir, write)
    c = claim("p3", result("cpudevnuma002", 2), name="web")
    node.claims.put(c)
    ref = ClaimRef(namespace="default", name="web", uid="p3")
    async with trio.open_nursery() as n:
        n.start_soon(node.service.prepare, [ref])
        await trio.to_thread.run_sync(entered.wait, 10)
        n.cancel_scope.cancel()  # the caller goes away mid-commit
        release.set()
    # The shielded commit finished: memory, disk and the checkpoint agree.
    cpus = node.view.cpus_of("p3")
    assert cpus is not None and len(cpus) == 2
    assert read_claim_specs(cdi_dir).claims == {"p3": cpus}
    on_disk = decode_checkpoint(Path(state_dir, "checkpoint.json").read_bytes())
    assert [(r.uid, r.cpus) for r in on_disk.claims] == [("p3", cpus)]


@pytest.mark.parametrize("offload_io", [False, True, None])
async def test_file_io_inline_or_in_a_thread(offload_io: bool | None) -> None:
    # None decides by the filesystem: /dev/shm is a tmpfs, so the writes happen inline.
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    cdi_dir = tempfile.mkdtemp(dir=base, prefix="dracpu-cdi.")
    try:
        node = make_node(cdi_dir, offload_io=offload_io)
        c = claim("io-1", result("cpudevnuma000", 2), name="web")
        node.claims.put(c)
        ref = ClaimRef(namespace="default", name="web", uid="io-1")
        assert (await node.service.prepare([ref]))["io-1"].error == ""
        if offload_io is None and base is not None:
            assert node.service._offload_io is False
        assert read_claim_specs(cdi_dir).claims == {"io-1": node.view.cpus_of("io-1")}
        assert (await node.service.unprepare([ref]))["io-1"].error == ""
        assert os.listdir(cdi_dir) == []
    finally:
        shutil.rmtree(cdi_dir, ignore_errors=True)
