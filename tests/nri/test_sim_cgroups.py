"""The simulator's cgroup trees (runc-style writes, kernel rules; v1 and v2) and more
simulator paths: memory alignment over the wire, automatic Synchronize splitting above
4 MiB, readiness."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import trio
from nri_sim_node import sim_node

from dracpu.cgroupfs.paths import detect_layout, resolve
from dracpu.cpuset import CPUSet
from dracpu_sim.runtime import CgroupTree, CgroupTreeError


def make_tree(tmp_path: Path) -> CgroupTree:
    tree = CgroupTree(tmp_path / "cg")
    tree.ensure_root("0-7", "0-1")
    return tree


def test_new_cgroups_inherit_their_parents_values(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    tree.write("/kubepods/podA", cpus="0-5")
    tree.write("/kubepods/podA/c1", mems="1")
    c1 = tmp_path / "cg" / "cpuset" / "kubepods" / "podA" / "c1"
    assert (c1 / "cpuset.cpus").read_text() == "0-5\n"
    assert (c1 / "cpuset.mems").read_text() == "1\n"
    assert tree.read("/kubepods") == "0-7"


def test_wider_leaf_widens_ancestors_first(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    tree.write("/kubepods/podA", cpus="0-1")
    tree.write("/kubepods/podA/c1", cpus="0-1")
    tree.write("/kubepods/podA/c1", cpus="0-1,6")
    assert tree.read("/kubepods/podA") == "0-1,6"
    assert tree.read("/kubepods/podA/c1") == "0-1,6"


def test_parent_widened_by_another_writer_is_seen(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    tree.write("/kubepods/podA", cpus="0-1")
    tree.write("/kubepods/podA/c1", cpus="0")
    pod = tmp_path / "cg" / "cpuset" / "kubepods" / "podA" / "cpuset.cpus"
    pod.write_text("0-3\n")
    tree.write("/kubepods/podA/c1", cpus="2-3")
    assert tree.read("/kubepods/podA") == "0-3"


@pytest.mark.parametrize(
    ("path", "cpus", "message"),
    [
        ("/kubepods/podA/c1", "0-9", "is not within the node's 0-7"),
        ("/kubepods/podA/c1", "x", "cpuset.cpus 'x'"),
        ("/kubepods/../../etc", "0", "is not a cgroup in the tree"),
        ("kubepods-pod.slice:cri-containerd:../c1", "0", "is not a systemd"),
        ("kubepods--x.slice:cri-containerd:c1", "0", "has an empty word"),
    ],
)
def test_refused_writes(tmp_path: Path, path: str, cpus: str, message: str) -> None:
    tree = make_tree(tmp_path)
    with pytest.raises(CgroupTreeError) as err:
        tree.write(path, cpus=cpus)
    assert err.value.errno == errno.EINVAL
    assert message in str(err.value)


def test_remove_forgets_and_tolerates_missing(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    tree.write("/kubepods/podA/c1", cpus="1")
    tree.remove("/kubepods/podA/c1")
    tree.remove("/kubepods/podA/c1")
    assert not (tmp_path / "cg" / "cpuset" / "kubepods" / "podA" / "c1").exists()
    tree.write("/kubepods/podA/c1", cpus="2")
    assert tree.read("/kubepods/podA/c1") == "2"


def make_v2(tmp_path: Path) -> CgroupTree:
    tree = CgroupTree(tmp_path / "cg", version=2)
    tree.ensure_root("0-7", "0-1")
    return tree


def read(path: Path) -> str:
    return path.read_text().strip()


def test_v2_root_is_detected_as_v2_and_children_inherit(tmp_path: Path) -> None:
    tree = make_v2(tmp_path)
    root = tmp_path / "cg"
    layout = detect_layout(str(root))
    assert (layout.version, layout.hierarchy) == (2, str(root))
    # The root has the effective files but no cpuset.cpus, as on a kernel.
    assert read(root / "cpuset.cpus.effective") == "0-7"
    assert not (root / "cpuset.cpus").exists()
    leaf = tree.ensure("/kubepods/burstable/podA/c1")
    for d in (
        root,
        root / "kubepods",
        root / "kubepods/burstable",
        root / "kubepods/burstable/podA",
    ):
        assert read(d / "cgroup.subtree_control") == "cpuset"
    assert read(leaf / "cgroup.controllers") == "cpuset"
    assert read(leaf / "cgroup.subtree_control") == ""
    assert read(leaf / "cpuset.cpus") == read(leaf / "cpuset.mems") == ""
    assert not (leaf / "cpuset.cpus.effective").exists()
    assert tree.effective_cpus("/kubepods/burstable/podA/c1") == CPUSet.parse("0-7")
    assert tree.effective_mems("/kubepods/burstable/podA/c1") == CPUSet.parse("0-1")
    assert resolve(layout, "/kubepods/burstable/podA/c1") == str(leaf)


def test_v2_effective_is_the_intersection_or_the_parents(tmp_path: Path) -> None:
    tree = make_v2(tmp_path)
    tree.write("/kubepods/podA", cpus="0-3")
    tree.write("/kubepods/podA/c1", cpus="2-5")  # a child may name CPUs its parent lacks
    assert tree.read("/kubepods/podA/c1") == "2-5"
    assert tree.read("/kubepods/podA") == "0-3"  # no widening on v2
    assert tree.effective_cpus("/kubepods/podA/c1") == CPUSet.parse("2-3")
    tree.write("/kubepods/podA/c1", cpus="6-7")  # nothing in common: the parent's
    assert tree.effective_cpus("/kubepods/podA/c1") == CPUSet.parse("0-3")
    tree.ensure("/kubepods/podA/c2")  # empty: the parent's
    assert tree.effective_cpus("/kubepods/podA/c2") == CPUSet.parse("0-3")
    with pytest.raises(CgroupTreeError) as err:
        tree.write("/kubepods/podA/c1", cpus="8")
    assert err.value.errno == errno.EINVAL
    assert "is not within the node's 0-7" in str(err.value)
    with pytest.raises(FileNotFoundError):
        tree.effective_cpus("/kubepods/podA/gone")


def test_v1_child_outside_its_parent_is_einval_on_disk(tmp_path: Path) -> None:
    """The v1 rule the tree enforces for runc is also what the copies on disk show: a
    writer that skips the widening (the daemon's fallback would not) leaves a child outside
    its parent, which the kernel refuses; here the tree's own write widens first."""
    tree = make_tree(tmp_path)
    tree.write("/kubepods/podA", cpus="0-1")
    tree.write("/kubepods/podA/c1", cpus="4")
    assert tree.read("/kubepods/podA") == "0-1,4"
    assert tree.effective_cpus("/kubepods/podA/c1") == CPUSet.parse("4")


def test_systemd_paths_expand_as_runc_does(tmp_path: Path) -> None:
    tree = make_v2(tmp_path)
    path = "kubepods-burstable-podab_cd.slice:cri-containerd:c1"
    leaf = tree.ensure(path)
    want = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podab_cd.slice/"
    assert leaf == tmp_path / "cg" / (want + "cri-containerd-c1.scope")
    # The daemon's resolver lands in the same directory.
    assert resolve(str(tmp_path / "cg"), path) == str(leaf)
    tree.write(path, cpus="1")
    assert tree.write_count(path) == 2  # created empty, then the update
    tree.remove(path)
    assert not leaf.exists()


async def test_align_memory_sets_mems_over_the_wire(short_tmp: str, tmp_path: Path) -> None:
    def mems_of(cpus: CPUSet) -> str:
        return "0" if cpus <= CPUSet.parse("0-3") else "0-1"

    async with sim_node(
        short_tmp,
        tmp_path / "cg",
        sim_kw={"node_mems": "0-1"},
        mems_of=mems_of,
    ) as node:
        node.prepare("A", "0-1")
        await node.sim.create_pod("p1", "pod")
        g = await node.sim.create_container("p1", "app", ["DRA_CPUSET_A=0-1"])
        s = await node.sim.create_container("p1", "side")
        assert (node.sim.cpuset_of(g), node.sim.mems_of(g)) == ("0-1", "0")
        assert (node.sim.cpuset_of(s), node.sim.mems_of(s)) == ("2-7", "0-1")


async def test_synchronize_splits_above_4_mib(short_tmp: str, tmp_path: Path) -> None:
    async with sim_node(short_tmp, tmp_path / "cg", start_session=False) as node:
        big = "X=" + "y" * 400_000
        ids = []
        for p in range(4):
            await node.sim.create_pod(f"p{p}", f"pod{p}")
            for c in range(3):
                ids.append(await node.sim.create_container(f"p{p}", f"c{c}", [big]))
        node.prepare("A", "0")
        node.start_session()
        await node.sim.wait_plugin_ready()
        assert len(node.sim.sync_chunks) >= 2
        assert [more for *_, more in node.sim.sync_chunks][-1] is False
        assert all(more for *_, more in node.sim.sync_chunks[:-1])
        assert {node.sim.cpuset_of(i) for i in ids} == {"1-7"}


async def test_wait_synchronized_survives_a_session_that_never_synced(
    short_tmp: str, tmp_path: Path
) -> None:
    async with sim_node(short_tmp, tmp_path / "cg", start_session=False) as node:
        # The first connection is dropped before it can synchronize.
        node.sim.registration_timeout = 0.0
        node.start_session()
        with trio.move_on_after(0.2):
            await node.session.wait_synchronized()
        assert not node.session.is_synchronized
        assert node.sim.dropped_reasons
        node.sim.registration_timeout = 5.0
        with trio.fail_after(5):
            await node.session.wait_synchronized()
        assert node.session.is_synchronized
