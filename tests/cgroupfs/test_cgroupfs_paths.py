"""Cgroup path resolution: both drivers, both hierarchies, and refused escapes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cgroup_trees import make_cgroup, v1_root, v2_root
from hypothesis import given
from hypothesis import strategies as st

from dracpu.cgroupfs.paths import (
    CgroupLayout,
    CgroupPathError,
    detect_layout,
    expand_slice,
    layout_from_listing,
    relative_parts,
    resolve,
    resolve_lexical,
)

V1 = CgroupLayout(root="/cg", hierarchy="/cg/cpuset", version=1)
V2 = CgroupLayout(root="/cg", hierarchy="/cg", version=2)


# -- layout detection ---------------------------------------------------------------------
def test_listing_v2_unified() -> None:
    layout = layout_from_listing("/cg/", ["cgroup.controllers", "cpuset"], ["x"])
    assert layout == V2
    assert layout.effective_cpus_file == "cpuset.cpus.effective"
    assert not layout.parents_must_contain_children


def test_listing_v1_cpuset_mount() -> None:
    layout = layout_from_listing("/cg", ["cpuset", "memory", "unified"], ["cpuset.cpus"])
    assert layout == V1
    assert layout.effective_cpus_file == "cpuset.effective_cpus"
    assert layout.parents_must_contain_children


def test_listing_v1_mount_given_directly() -> None:
    layout = layout_from_listing("/sys/fs/cgroup/cpuset", ["cpuset.cpus", "tasks"], None)
    assert layout.hierarchy == "/sys/fs/cgroup/cpuset"
    assert layout.version == 1


def test_listing_without_cpuset_is_refused() -> None:
    with pytest.raises(CgroupPathError, match=r"no cpuset cgroup hierarchy under '/cg'"):
        layout_from_listing("/cg", ["memory", "pids"], None)


def test_detect_fake_v1_and_v2(tmp_path: Path) -> None:
    root1 = v1_root(tmp_path / "one")
    assert detect_layout(str(root1)) == CgroupLayout(
        root=str(root1), hierarchy=f"{root1}/cpuset", version=1
    )
    root2 = v2_root(tmp_path / "two")
    assert detect_layout(str(root2)).version == 2


def test_detect_missing_root(tmp_path: Path) -> None:
    with pytest.raises(CgroupPathError, match=r"cannot read cgroup root .*nope.*No such file"):
        detect_layout(str(tmp_path / "nope"))


def test_detect_simulator_tree_without_root_files(tmp_path: Path) -> None:
    # The NRI simulator only creates container directories below <root>/cpuset.
    (tmp_path / "cpuset" / "kubepods" / "podu" / "c1").mkdir(parents=True)
    assert detect_layout(str(tmp_path)).hierarchy == f"{tmp_path}/cpuset"


# -- systemd driver -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("slice_name", "parts"),
    [
        ("kubepods.slice", ["kubepods.slice"]),
        (
            "kubepods-burstable-pod1234.slice",
            ["kubepods.slice", "kubepods-burstable.slice", "kubepods-burstable-pod1234.slice"],
        ),
        ("a-b-c-d.slice", ["a.slice", "a-b.slice", "a-b-c.slice", "a-b-c-d.slice"]),
        ("-.slice", []),
    ],
)
def test_expand_slice(slice_name: str, parts: list[str]) -> None:
    assert expand_slice(slice_name) == parts


@pytest.mark.parametrize(
    ("slice_name", "why"),
    [
        ("kubepods", "must end in '.slice'"),
        (".slice", "must end in '.slice'"),
        ("a--b.slice", "empty component"),
        ("-a.slice", "empty component"),
        ("a-.slice", "empty component"),
        ("a/b.slice", "contains '/'"),
    ],
)
def test_expand_slice_rejects(slice_name: str, why: str) -> None:
    with pytest.raises(CgroupPathError, match=f"invalid systemd slice '{slice_name}': {why}"):
        expand_slice(slice_name)


@pytest.mark.parametrize(
    ("cgroups_path", "rel"),
    [
        (
            "kubepods-burstable-pod1234.slice:cri-containerd:abcd",
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/"
            "cri-containerd-abcd.scope",
        ),
        (
            "kubepods-pod9_8.slice:crio:ff00",
            "kubepods.slice/kubepods-pod9_8.slice/crio-ff00.scope",
        ),
        # runc: an empty slice is system.slice; a name ending in .slice is used as is.
        (":docker:abc", "system.slice/docker-abc.scope"),
        ("kubepods.slice:x:inner.slice", "kubepods.slice/inner.slice"),
        ("-.slice:p:n", "p-n.scope"),
    ],
)
def test_resolve_systemd(cgroups_path: str, rel: str) -> None:
    assert resolve_lexical(V1, cgroups_path) == f"/cg/cpuset/{rel}"
    assert resolve_lexical(V2, cgroups_path) == f"/cg/{rel}"


@pytest.mark.parametrize(
    ("cgroups_path", "message"),
    [
        ("a.slice:b", "expected 'slice:prefix:name'"),
        ("a.slice:b:c:d", "expected 'slice:prefix:name'"),
        ("a.slice:b:", "bad unit name ''"),
        ("a.slice:b:..", "bad unit name '..'"),
        ("a.slice:b:x/../../etc", "bad unit name"),
        ("a.slice:../..:c", "bad unit name"),
        ("kube/../../pods.slice:p:c", "contains '/'"),
    ],
)
def test_systemd_bad_paths(cgroups_path: str, message: str) -> None:
    with pytest.raises(CgroupPathError, match=message):
        resolve_lexical(V1, cgroups_path)


# -- cgroupfs driver ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cgroups_path", "rel"),
    [
        ("/kubepods/pod1234/abcd", "kubepods/pod1234/abcd"),
        ("/kubepods/burstable/pod1234/abcd", "kubepods/burstable/pod1234/abcd"),
        ("kubepods/besteffort/pod1/c", "kubepods/besteffort/pod1/c"),
        ("//kubepods/./pod1//c/", "kubepods/pod1/c"),
        ("/kubepods/other/../pod1/c", "kubepods/pod1/c"),
        # An absolute path is taken inside the hierarchy, never as a host path.
        ("/etc/passwd", "etc/passwd"),
    ],
)
def test_resolve_cgroupfs(cgroups_path: str, rel: str) -> None:
    assert resolve_lexical(V1, cgroups_path) == f"/cg/cpuset/{rel}"


@pytest.mark.parametrize(
    ("cgroups_path", "message"),
    [
        ("/../etc", "escapes the cgroup root through '..'"),
        ("/kubepods/../../x", "escapes the cgroup root through '..'"),
        ("../../../../proc/1", "escapes the cgroup root through '..'"),
        ("/", "names the cgroup root itself"),
        ("/kubepods/..", "names the cgroup root itself"),
        ("", "empty cgroups path"),
        ("/kubepods/\x00/c", "contains NUL"),
    ],
)
def test_cgroupfs_escapes_refused(cgroups_path: str, message: str) -> None:
    with pytest.raises(CgroupPathError, match=message):
        resolve_lexical(V1, cgroups_path)


@given(st.text(alphabet="/.:-abk\x00", max_size=30))
def test_any_path_stays_inside_or_is_refused(text: str) -> None:
    try:
        parts = relative_parts(text)
    except CgroupPathError:
        return
    assert parts
    for part in parts:
        assert part not in ("", ".", "..")
        assert "/" not in part
        assert "\x00" not in part
    assert resolve_lexical(V1, text).startswith("/cg/cpuset/")


# -- on disk: symlinks --------------------------------------------------------------------
def test_resolve_on_disk_and_from_root_string(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podu/c1")
    assert resolve(str(root), "/kubepods/podu/c1") == str(leaf)


def test_symlink_pointing_out_is_refused(tmp_path: Path) -> None:
    root = v1_root(tmp_path / "cg")
    outside = tmp_path / "outside"
    make_cgroup(outside, "c1")
    (root / "cpuset" / "kubepods").mkdir()
    os.symlink(outside, root / "cpuset" / "kubepods" / "podu")
    with pytest.raises(CgroupPathError, match=r"resolves to '.*outside/c1', outside the cgroup"):
        resolve(detect_layout(str(root)), "/kubepods/podu/c1")


def test_symlink_to_the_hierarchy_root_is_refused(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    os.symlink(root / "cpuset", root / "cpuset" / "kubepods")
    with pytest.raises(CgroupPathError, match="outside the cgroup hierarchy"):
        resolve(str(root), "/kubepods")


def test_symlink_inside_is_allowed(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    real = make_cgroup(root / "cpuset", "kubepods/real/c1")
    os.symlink(real.parent, root / "cpuset" / "kubepods" / "podu")
    assert resolve(str(root), "/kubepods/podu/c1") == f"{root}/cpuset/kubepods/podu/c1"
