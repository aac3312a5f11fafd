"""Verify, don't trust (issue #15): after a pool push the cgroupfs writer's pass reads every
cgroup back and writes what the runtime did not apply, whichever way the runtime failed."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from builders import grid
from nri_sim_node import SimNode, sim_node
from owner_steps import exact_devices, prepare_cpus, unprepare
from prometheus_client import CollectorRegistry

from dracpu.cgroupfs.writer import CgroupWriter
from dracpu.messages import VerifyCpusets
from dracpu.metrics import DriverMetrics
from dracpu.nri.pusher import PoolPusher


class Node:
    def __init__(self, sim: SimNode, registry: CollectorRegistry, writer: CgroupWriter) -> None:
        self.sim = sim
        self.registry = registry
        self.writer = writer

    def fallback(self, cause: str, result: str = "success") -> float:
        value = self.registry.get_sample_value(
            "dracpu_cgroup_fallback_writes_total", {"result": result, "cause": cause}
        )
        return value or 0.0

    async def prepare(self, uid: str, cpus: str) -> None:
        await prepare_cpus(self.sim.state, uid, cpus)

    async def unprepare(self, uid: str) -> None:
        assert (await unprepare(self.sim.state, uid)).released is not None


@asynccontextmanager
async def verified_node(short_tmp: str, cgroup_root: Path) -> AsyncIterator[Node]:
    async with sim_node(short_tmp, cgroup_root) as sim:
        exact_devices(sim.state, grid(1, 1, 4))  # CPUs 0-7, as the simulated node
        registry = CollectorRegistry()
        metrics = DriverMetrics(registry)
        writer = CgroupWriter(str(cgroup_root), metrics=metrics)
        pusher = PoolPusher(
            sim.state.pool_changes(),
            sim.plugin,
            sim.session,
            verify=writer.inbox(),
            writer=writer,
        )
        sim.session._verify = writer.inbox()
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run, sim.state.view)
            await nursery.start(pusher.run)
            yield Node(sim, registry, writer)
            nursery.cancel_scope.cancel()


async def shared_containers(node: Node, count: int) -> list[str]:
    await node.sim.sim.create_pod("p0", "shared")
    return [await node.sim.sim.create_container("p0", f"s{i}") for i in range(count)]


@pytest.mark.parametrize("mode", ["containerd-drop", "cgroup-differs"])
async def test_a_pool_update_the_runtime_did_not_apply_is_written_within_200ms(
    short_tmp: str, tmp_path: Path, mode: str
) -> None:
    async with verified_node(short_tmp, tmp_path / "cg") as node:
        sim = node.sim.sim
        await node.prepare("A", "0-3")
        ids = await shared_containers(node, 3)
        assert {sim.cpuset_of(c) for c in ids} == {"4-7"}
        sim.set_update_mode(mode)
        await node.unprepare("A")  # the pool grows back to 0-7; the runtime does not apply it
        with trio.fail_after(0.2):
            while {sim.cpuset_of(c) for c in ids} != {"0-7"}:
                await trio.sleep(0.005)
        assert sim.update_requests[-1] == ids  # the runtime was asked, and said yes
        with trio.fail_after(1):  # the count follows the write's return from its thread
            while node.writer.tally.rewritten < 3:
                await trio.sleep(0.005)
        assert node.fallback("verify-mismatch") == 3
        assert node.fallback("runtime-reported") == 0
        convergence = node.registry.get_sample_value("dracpu_pool_convergence_seconds_count")
        assert convergence == 1


async def test_a_runtime_that_reports_the_failure_is_written_by_the_one_pass(
    short_tmp: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dracpu.cgroupfs")
    async with verified_node(short_tmp, tmp_path / "cg") as node:
        sim = node.sim.sim
        await node.prepare("A", "0-3")
        ids = await shared_containers(node, 2)
        sim.set_update_mode("report", calls=1)
        await node.unprepare("A")
        # The reported failures ride in the change's one pass, which verifies every update
        # whatever the runtime answered: each is written once, under the runtime's reason,
        # and the convergence is recorded for this case too.
        with trio.fail_after(2):
            while node.writer.tally.rewritten < len(ids):
                await trio.sleep(0.005)
        assert {sim.cpuset_of(c) for c in ids} == {"0-7"}
        assert node.fallback("runtime-reported") == len(ids)
        assert node.fallback("verify-mismatch") == 0
        assert sorted(
            r.getMessage()
            for r in caplog.records
            if r.getMessage().startswith("fallback cpuset write container_id=")
        ) == sorted(
            f"fallback cpuset write container_id={c} cpus=0-7 "
            "reason=listed as failed by the runtime"
            for c in ids
        )
        convergence = node.registry.get_sample_value("dracpu_pool_convergence_seconds_count")
        assert convergence == 1


async def test_applied_updates_are_read_back_and_left_alone(short_tmp: str, tmp_path: Path) -> None:
    async with verified_node(short_tmp, tmp_path / "cg") as node:
        sim = node.sim.sim
        ids = await shared_containers(node, 2)
        await node.prepare("A", "6-7")
        with trio.fail_after(2):
            while node.writer.tally.verified < 2:
                await trio.sleep(0.005)
        assert {sim.cpuset_of(c) for c in ids} == {"0-5"}
        assert node.fallback("verify-mismatch") == 0


async def test_a_claim_holder_is_verified_once_its_container_exists(
    short_tmp: str, tmp_path: Path
) -> None:
    async with verified_node(short_tmp, tmp_path / "cg") as node:
        sim = node.sim.sim
        node.sim.prepare("B", "2-3")
        await sim.create_pod("p1", "holder")
        holder = await sim.create_container("p1", "app", ["DRA_CPUSET_B=2-3"])
        assert sim.cpuset_of(holder) == "2-3"
        with trio.fail_after(2):
            while node.writer.tally.verified < 1:
                await trio.sleep(0.005)
        assert node.fallback("verify-mismatch") == 0
        # Behind everyone's back the cgroup changes, then the holder is created again
        # (same name): the new container's adjustment is verified and written.
        sim.tree.write(sim.container(holder).cgroups_path, cpus="0-7")
        assert (
            await node.writer.verify(
                VerifyCpusets(intents=tuple(node.sim.plugin.intents()), cause="create"),
                node.sim.state.view,
            )
        ) == [holder]
        assert sim.cpuset_of(holder) == "2-3"
        assert node.fallback("verify-mismatch") == 1


async def test_a_stale_intent_is_not_written(short_tmp: str, tmp_path: Path) -> None:
    async with verified_node(short_tmp, tmp_path / "cg") as node:
        sim = node.sim.sim
        (shared,) = await shared_containers(node, 1)
        intent = node.sim.plugin.intents()[0]
        old = VerifyCpusets(
            intents=(type(intent)(**{**_fields(intent), "cpus": "1"}),), cause="pool"
        )
        # The owner intends 0-7 for it now: a verify carrying an older pool writes nothing.
        assert await node.writer.verify(old, node.sim.state.view) == []
        assert sim.cpuset_of(shared) == "0-7"


def _fields(intent: object) -> dict[str, object]:
    import msgspec

    return msgspec.structs.asdict(intent)  # type: ignore[arg-type]
