"""No container is ever pinned to the CPUs of a half-prepared claim (issue #14 item 2).

A prepare keeps its claim pending until the CDI spec and the checkpoint are on disk. These
tests block the checkpoint's write in its worker thread, send NRI events for the claim in
that window, then let the write fail or succeed.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import trio
from builders import claim, nri_container, nri_pod, result
from kubelet_harness import Node, make_node

from dracpu.atomicfile import atomic_write
from dracpu.cdi import claim_spec_path
from dracpu.kubelet import ClaimRef
from dracpu.nri.plugin import NRIPlugin, NRIPluginError
from dracpu.proto.nri import api_pb2


class BlockedWrite:
    """A checkpoint write that waits in its worker thread until released, then fails or
    writes for real."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail = False

    def __call__(self, path: str, data: bytes, **kw: Any) -> None:
        self.entered.set()
        self.release.wait(10)
        if self.fail:
            raise OSError(28, "No space left on device")
        atomic_write(path, data, **kw)


def holder(uid: str, cpus: str) -> tuple[api_pb2.PodSandbox, api_pb2.Container]:
    """Pod ``p1`` and its container ``c1``, which holds claim ``uid`` (its CDI env)."""
    container = nri_container("p1", "c1", f"DRA_CPUSET_{uid}={cpus}", name="app")
    return nri_pod("p1", name="p1"), container


async def prepare_blocked(
    nursery: trio.Nursery, node: Node, cdi_dir: str, write: BlockedWrite, uid: str
) -> tuple[ClaimRef, str, list[Any]]:
    """Start a prepare and return once its checkpoint write is blocked; the pending
    claim's CPUs as a string, and a list that receives the prepare's result."""
    await node.start_checkpoint(nursery, os.path.join(cdi_dir, "state"), write)
    node.claims.put(claim(uid, result("cpudevnuma000", 2), name="web"))
    ref = ClaimRef(namespace="default", name="web", uid=uid)
    results: list[Any] = []

    async def run() -> None:
        results.append(await node.service.prepare([ref]))

    nursery.start_soon(run)
    await trio.to_thread.run_sync(write.entered.wait, 10)
    (pending,) = node.view.durable_claims()
    assert os.path.exists(claim_spec_path(cdi_dir, uid))  # the spec is written already
    return ref, pending.cpus.format(), results


async def test_create_container_during_the_fsync_is_not_pinned_to_rolled_back_cpus(
    nursery: trio.Nursery, cdi_dir: str
) -> None:
    node = make_node(cdi_dir)
    plugin = NRIPlugin(node.state)
    write = BlockedWrite()
    write.fail = True
    ref, cpus, results = await prepare_blocked(nursery, node, cdi_dir, write, "half")

    # The claim holder's container arrives while the checkpoint is being written.
    pod, container = holder("half", cpus)
    with pytest.raises(NRIPluginError, match='claim "half" is not prepared by this driver'):
        plugin.create_container(pod, container)
    # A shared container created meanwhile is not confined away from CPUs nobody holds.
    shared = nri_container("p1", "s1", name="side")
    assert plugin.create_container(pod, shared).cpus == node.view.shared_pool
    assert node.view.shared_pool == node.view.allocatable

    write.release.set()
    while not results:
        await trio.sleep(0.01)
    assert results[0][ref.uid].error.startswith("failed to record claim default/web: ")
    # Rolled back, and nothing was ever pinned to its CPUs.
    assert len(node.view.claims()) == 0 and node.view.durable_claims() == []
    assert not os.path.exists(claim_spec_path(cdi_dir, "half"))
    assert [i.container_id for i in plugin.intents()] == ["s1"]
    assert node.view.owners() == {}
    assert node.changes == []  # the shared pool never changed


async def test_claim_becomes_visible_only_after_its_checkpoint(
    nursery: trio.Nursery, cdi_dir: str
) -> None:
    node = make_node(cdi_dir)
    plugin = NRIPlugin(node.state)
    write = BlockedWrite()
    ref, cpus, results = await prepare_blocked(nursery, node, cdi_dir, write, "slow")
    pod, container = holder("slow", cpus)
    with pytest.raises(NRIPluginError, match="not prepared by this driver"):
        plugin.create_container(pod, container)
    # Another prepare cannot take the pending claim's CPUs either.
    assert not node.view.free & node.view.durable_claims()[0].cpus

    write.release.set()
    while not results:
        await trio.sleep(0.01)
    assert results[0][ref.uid].error == ""
    assert node.view.cpus_of("slow") is not None
    assert plugin.create_container(pod, container).cpus.format() == cpus
    assert node.changes == [node.view.shared_pool.format()]


async def _settled(results: list[Any], count: int) -> None:
    while len(results) < count:
        await trio.sleep(0.01)


async def test_a_second_prepare_of_the_claim_waits_for_the_first_to_be_durable(
    nursery: trio.Nursery, cdi_dir: str
) -> None:
    node = make_node(cdi_dir)
    write = BlockedWrite()
    ref, cpus, first = await prepare_blocked(nursery, node, cdi_dir, write, "twice")
    second: list[Any] = []

    async def again() -> None:
        second.append(await node.service.prepare([ref]))

    nursery.start_soon(again)
    await trio.sleep(0.2)
    # Before: the second call found the claim pending and answered (or failed) at once.
    assert second == [] and first == []
    write.release.set()
    await _settled(first, 1)
    await _settled(second, 1)
    assert first[0][ref.uid].error == second[0][ref.uid].error == ""
    assert first[0][ref.uid].devices == second[0][ref.uid].devices
    assert node.view.cpus_of("twice") == node.view.durable_claims()[0].cpus
    assert node.view.cpus_of("twice").format() == cpus  # one reservation, not two


async def test_an_unprepare_during_the_prepare_waits_and_then_releases_the_claim(
    nursery: trio.Nursery, cdi_dir: str
) -> None:
    node = make_node(cdi_dir)
    write = BlockedWrite()
    ref, _, prepared = await prepare_blocked(nursery, node, cdi_dir, write, "gone")
    unprepared: list[Any] = []

    async def unprepare() -> None:
        unprepared.append(await node.service.unprepare([ref]))

    nursery.start_soon(unprepare)
    await trio.sleep(0.2)
    # Before: the unprepare removed the spec of the pending claim, which then committed
    # without one.
    assert unprepared == []
    assert os.path.exists(claim_spec_path(cdi_dir, "gone"))
    write.release.set()
    await _settled(prepared, 1)
    await _settled(unprepared, 1)
    assert prepared[0][ref.uid].error == "" and unprepared[0][ref.uid].error == ""
    assert len(node.view.claims()) == 0 and node.view.durable_claims() == []
    assert not os.path.exists(claim_spec_path(cdi_dir, "gone"))
