"""The writer and the watcher on the NRI runtime simulator's cgroup tree (shared convention)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cgroup_trees import FakeView, check

from dracpu.cgroupfs.watcher import DriftWatcher
from dracpu.cgroupfs.writer import CgroupWriter
from dracpu.messages import ContainerIntent
from dracpu_sim.runtime import CgroupTree


def _intent(uid: str, cid: str, cpus: str) -> ContainerIntent:
    return ContainerIntent(
        container_id=cid, cgroups_path=f"/kubepods/pod{uid}/{cid}", cpus=cpus, pod_uid=uid
    )


@pytest.mark.parametrize("version", [1, 2])
def test_writer_and_watcher_on_the_simulator_tree(tmp_path: Path, version: int) -> None:
    sim = CgroupTree(tmp_path, version=version)
    sim.ensure_root("0-7", "0")
    for cid in ("a", "b", "stray"):
        sim.ensure(f"/kubepods/podu1/{cid}")
    sim.write("/kubepods/podu1/a", cpus="0-1")
    sim.write("/kubepods/podu1/b", cpus="0-1")
    # The runtime failed to apply a's update: dracpu writes it in the simulator's tree.
    writer = CgroupWriter(str(tmp_path))
    outcome = writer.write(_intent("u1", "a", "6-7"))
    assert outcome.ok
    assert sim.read("/kubepods/podu1/a") == "6-7"
    # The simulator (like runc) then changes b behind dracpu's back; the watcher repairs it
    # and confines the container nobody told dracpu about.
    intents = [_intent("u1", "a", "6-7"), _intent("u1", "b", "2-3")]
    view = FakeView(intents, "0-5")
    report = check(DriftWatcher(writer, view), view)
    assert (report.drifted, report.repaired, report.unknown_confined) == (1, 1, 1)
    assert sim.read("/kubepods/podu1/b") == "2-3"
    assert sim.read("/kubepods/podu1/stray") == "0-5"
    # The simulator keeps enforcing its rules on what dracpu left: a sibling write still fits.
    sim.write("/kubepods/podu1/b", cpus="4")
    assert sim.read("/kubepods/podu1/b") == "4"
    # What the kernel would enforce is what dracpu reads back.
    for cid, cpus in (("a", "6-7"), ("b", "4"), ("stray", "0-5")):
        assert sim.effective_cpus(f"/kubepods/podu1/{cid}").format() == cpus
