"""Discovery over broken sysfs trees: fatal errors name the file, per-CPU gaps skip the CPU."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from dracpu.cpuset import CPUSet
from dracpu.topology import (
    NO_ID,
    CoreType,
    SysfsError,
    SysfsReader,
    TopologyError,
    discover_from_root,
    discover_topology,
)

LOGGER = "dracpu.topology.discover"
CPU = "devices/system/cpu"


@pytest.fixture
def holes(fake_sysfs: Path, tmp_path: Path) -> Path:
    """A writable copy of offline-holes (online 0-5,8-11,14; core c%8; siblings c, c+8)."""
    root = tmp_path / "sys"
    shutil.copytree(fake_sysfs / "offline-holes", root, symlinks=True)
    return root


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def skipped(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


# -- fatal ----------------------------------------------------------------------------------


def test_missing_online_file(holes: Path) -> None:
    (holes / CPU / "online").unlink()
    with pytest.raises(TopologyError) as info:
        discover_from_root(holes)
    assert str(info.value) == (
        f"failed to get online CPUs: open {holes}/{CPU}/online: No such file or directory"
    )
    assert isinstance(info.value, SysfsError) is False  # the wrapper is a plain TopologyError


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("0-3,\n", "invalid cpuset '0-3,': empty item: ''"),
        ("3-1\n", "invalid cpuset '3-1': range end below its start: '3-1'"),
        ("zero\n", "invalid cpuset 'zero': not a cpu id or range: 'zero'"),
    ],
)
def test_unparsable_online_file(holes: Path, text: str, detail: str) -> None:
    write(holes, f"{CPU}/online", text)
    with pytest.raises(TopologyError) as info:
        discover_from_root(holes)
    assert str(info.value) == f"failed to get online CPUs: parse {holes}/{CPU}/online: {detail}"


def test_bad_cpu_atom_list_is_fatal(holes: Path) -> None:
    write(holes, "devices/cpu_atom/cpus", "4-x\n")
    with pytest.raises(TopologyError) as info:
        discover_from_root(holes)
    assert str(info.value) == (
        f"failed to get E-core CPUs: parse {holes}/devices/cpu_atom/cpus: "
        "invalid cpuset '4-x': not a cpu id or range: '4-x'"
    )


def test_cpu_atom_first_line_only_and_empty(holes: Path) -> None:
    write(holes, "devices/cpu_atom/cpus", "4-5\ngarbage\n")
    topo = discover_from_root(holes)
    types = {c: i.core_type for c, i in topo.cpus.items()}
    assert types == {c: CoreType.E_CORE if c in (4, 5) else CoreType.P_CORE for c in topo.all_cpus}
    write(holes, "devices/cpu_atom/cpus", "")
    topo = discover_from_root(holes)
    assert {i.core_type for i in topo.cpus.values()} == {CoreType.P_CORE}


# -- skipped CPUs ---------------------------------------------------------------------------


def test_unparsable_core_id_skips_cpu(holes: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(holes, f"{CPU}/cpu2/topology/core_id", "two\n")
    caplog.set_level(logging.INFO, logger=LOGGER)
    topo = discover_from_root(holes)
    assert 2 not in topo.cpus
    assert str(topo.online) == "0-5,8-11,14"  # a skipped CPU stays online (§4.5)
    assert topo.cpus[10].sibling == NO_ID  # its thread partner lost its sibling
    assert skipped(caplog) == [
        "skipping CPU due to incomplete topology cpu=2 reason=parse "
        f"{holes}/{CPU}/cpu2/topology/core_id: not an integer: 'two'"
    ]
    assert caplog.records[0].levelno == logging.INFO


def test_missing_package_id_skips_cpu(holes: Path, caplog: pytest.LogCaptureFixture) -> None:
    (holes / CPU / "cpu3/topology/physical_package_id").unlink()
    caplog.set_level(logging.INFO, logger=LOGGER)
    topo = discover_from_root(holes)
    assert str(topo.all_cpus) == "0-2,4-5,8-11,14"
    assert skipped(caplog) == [
        "skipping CPU due to incomplete topology cpu=3 reason=open "
        f"{holes}/{CPU}/cpu3/topology/physical_package_id: No such file or directory"
    ]


def test_online_cpu_without_topology_dir_is_skipped(
    holes: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(holes, f"{CPU}/online", "0-6\n")  # cpu6 is offline in the tree: no topology/
    caplog.set_level(logging.INFO, logger=LOGGER)
    topo = discover_from_root(holes)
    assert str(topo.all_cpus) == "0-5"
    assert str(topo.online) == "0-6"
    assert len(skipped(caplog)) == 1
    assert skipped(caplog)[0].startswith("skipping CPU due to incomplete topology cpu=6 ")


def test_negative_package_id_skips_cpu(holes: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(holes, f"{CPU}/cpu1/topology/physical_package_id", "-1\n")
    caplog.set_level(logging.INFO, logger=LOGGER)
    topo = discover_from_root(holes)
    assert 1 not in topo.cpus
    assert skipped(caplog) == [
        "skipping CPU due to incomplete topology cpu=1 reason=negative id: socket=-1 core=1 numa=0"
    ]


def test_no_node_entry_skips_cpu(holes: Path, caplog: pytest.LogCaptureFixture) -> None:
    (holes / CPU / "cpu4/node0").unlink()
    caplog.set_level(logging.INFO, logger=LOGGER)
    topo = discover_from_root(holes)
    assert 4 not in topo.cpus
    assert skipped(caplog) == [
        f"skipping CPU due to incomplete topology cpu=4 reason=no node* entry in {holes}/{CPU}/cpu4"
    ]


def test_node_cpulist_fallbacks(holes: Path) -> None:
    # cpu0: node0's cpulist missing, then node1 readable -> NUMA 1 with node1's list.
    os.symlink("../../node/node1", holes / CPU / "cpu0/node1")
    write(holes, "devices/system/node/node1/cpulist", "0\n")
    (holes / "devices/system/node/node0/cpulist").unlink()
    # cpu1: an entry that only looks like a node ("nodex") is ignored.
    write(holes, f"{CPU}/cpu1/nodex", "")
    topo = discover_from_root(holes)
    assert (topo.cpus[0].numa, str(topo.cpus[0].numa_cpus)) == (1, "0")
    # every other CPU keeps NUMA 0 with an empty cpuset: its only cpulist is unreadable
    assert (topo.cpus[1].numa, str(topo.cpus[1].numa_cpus)) == (0, "")
    assert topo.by_numa == {0: CPUSet.parse("1-5,8-11,14"), 1: CPUSet([0])}


def test_cluster_and_die_fallbacks(holes: Path) -> None:
    write(holes, f"{CPU}/cpu0/topology/cluster_id", "65535\n")
    write(holes, f"{CPU}/cpu1/topology/cluster_id", "one\n")
    (holes / CPU / "cpu2/topology/cluster_id").unlink()
    write(holes, f"{CPU}/cpu3/topology/die_id", "x\n")
    write(holes, f"{CPU}/cpu4/topology/die_id", " 7 \n")
    topo = discover_from_root(holes)
    assert [topo.cpus[c].cluster for c in range(5)] == [NO_ID, NO_ID, NO_ID, 3, 4]
    assert [topo.cpus[c].die for c in range(5)] == [0, 0, 0, 0, 7]
    # the cluster is part of the core key: cpu0 (cluster -1) and cpu8 (cluster 0) split
    assert topo.cpus[0].sibling == NO_ID
    assert topo.cpus[8].sibling == NO_ID


def test_bad_l3_id_skips_cpu(holes: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(holes, f"{CPU}/cpu5/cache/index3/id", "L3\n")
    caplog.set_level(logging.INFO, logger=LOGGER)
    topo = discover_from_root(holes)
    assert 5 not in topo.cpus
    assert skipped(caplog) == [
        "skipping CPU due to incomplete topology cpu=5 reason=parse "
        f"{holes}/{CPU}/cpu5/cache/index3/id: not an integer: 'L3'"
    ]


def test_bad_shared_cpu_list_skips_cpu(holes: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(holes, f"{CPU}/cpu5/cache/index3/shared_cpu_list", "0-\n")
    (holes / CPU / "cpu4/cache/index3/shared_cpu_list").unlink()
    caplog.set_level(logging.INFO, logger=LOGGER)
    topo = discover_from_root(holes)
    assert 4 not in topo.cpus and 5 not in topo.cpus
    assert skipped(caplog) == [
        "skipping CPU due to incomplete topology cpu=4 reason=open "
        f"{holes}/{CPU}/cpu4/cache/index3/shared_cpu_list: No such file or directory",
        "skipping CPU due to incomplete topology cpu=5 reason=parse "
        f"{holes}/{CPU}/cpu5/cache/index3/shared_cpu_list: "
        "invalid cpuset '0-': not a cpu id or range: '0-'",
    ]


def test_missing_cache_dir_skips_cpu(holes: Path, caplog: pytest.LogCaptureFixture) -> None:
    shutil.rmtree(holes / CPU / "cpu9/cache")
    caplog.set_level(logging.INFO, logger=LOGGER)
    topo = discover_from_root(holes)
    assert 9 not in topo.cpus
    assert skipped(caplog) == [
        "skipping CPU due to incomplete topology cpu=9 reason=list "
        f"{holes}/{CPU}/cpu9/cache: No such file or directory"
    ]


def test_l3_id_fallbacks(holes: Path) -> None:
    # no id: the lowest CPU of shared_cpu_list; no id and an empty list: the CPU itself
    (holes / CPU / "cpu1/cache/index3/id").unlink()
    write(holes, f"{CPU}/cpu1/cache/index3/shared_cpu_list", "1-3\n")
    (holes / CPU / "cpu2/cache/index3/id").unlink()
    write(holes, f"{CPU}/cpu2/cache/index3/shared_cpu_list", "\n")
    topo = discover_from_root(holes)
    assert [topo.cpus[c].l3 for c in (0, 1, 2, 3)] == [0, 1, 2, 0]


def test_l3_missing_or_hidden(holes: Path) -> None:
    shutil.rmtree(holes / CPU / "cpu0/cache/index3")  # no L3 at all
    (holes / CPU / "cpu1/cache/index3/level").unlink()  # unreadable level: entry ignored
    write(holes, f"{CPU}/cpu2/cache/index3/level", "2\n")  # not level 3
    # the first level-3 entry in name order wins; a file named index* is not a directory
    shutil.rmtree(holes / CPU / "cpu3/cache/index0")
    write(holes, f"{CPU}/cpu3/cache/index0", "not a dir")
    shutil.rmtree(holes / CPU / "cpu3/cache/index1")
    write(holes, f"{CPU}/cpu3/cache/index1/level", "3\n")
    write(holes, f"{CPU}/cpu3/cache/index1/id", "9\n")
    write(holes, f"{CPU}/cpu3/cache/index1/shared_cpu_list", "3\n")
    topo = discover_from_root(holes)
    assert [topo.cpus[c].l3 for c in (0, 1, 2, 3, 4)] == [NO_ID, NO_ID, NO_ID, 9, 0]
    assert topo.by_l3 == {0: CPUSet.parse("4-5,8-11,14"), 9: CPUSet([3])}


@pytest.mark.parametrize(
    ("control", "expected"),
    [
        ("on\n", True),
        ("ON\n", True),
        ("off\n", False),
        ("forceoff\n", False),
        ("notsupported\n", False),
        ("notimplemented\n", False),
        ("weird\n", True),  # fallback: 11 CPUs > 7 cores
        (None, True),
    ],
)
def test_smt_control(holes: Path, control: str | None, expected: bool) -> None:
    if control is None:
        (holes / CPU / "smt/control").unlink()
    else:
        write(holes, f"{CPU}/smt/control", control)
    assert discover_from_root(holes).smt_enabled is expected


def test_smt_fallback_without_threads(holes: Path) -> None:
    write(holes, f"{CPU}/online", "0-5\n")
    write(holes, f"{CPU}/smt/control", "?\n")
    assert discover_from_root(holes).smt_enabled is False


def test_three_threads_per_core_have_no_sibling(holes: Path) -> None:
    for cpu in (1, 2):
        write(holes, f"{CPU}/cpu{cpu}/topology/core_id", "0\n")
        write(holes, f"{CPU}/cpu{cpu}/topology/cluster_id", "0\n")
    topo = discover_from_root(holes)
    assert [topo.cpus[c].sibling for c in (0, 1, 2, 8)] == [NO_ID] * 4
    assert str(topo.cpus[8].thread_siblings) == "0-2,8"
    assert topo.cpus[9].sibling == NO_ID  # cpu1 left core 1: 9 is alone now
    assert topo.cpus[10].sibling == NO_ID


def test_reader_errors_name_the_file(holes: Path) -> None:
    reader = SysfsReader(holes)
    with pytest.raises(SysfsError) as info:
        reader.read_text("devices/nothing")
    assert str(info.value) == f"open {holes}/devices/nothing: No such file or directory"
    assert info.value.missing is True
    assert info.value.path == f"{holes}/devices/nothing"
    with pytest.raises(SysfsError) as info:
        reader.read_text(CPU)
    assert str(info.value) == f"read {holes}/{CPU}: Is a directory"
    with pytest.raises(SysfsError) as info:
        reader.listdir(f"{CPU}/online")
    assert str(info.value) == f"list {holes}/{CPU}/online: Not a directory"
    assert reader.exists(f"{CPU}/online") and not reader.exists(f"{CPU}/cpu99")
    assert reader.is_dir(CPU) and not reader.is_dir(f"{CPU}/online")
    assert reader.scandir(f"{CPU}/cpu6") == [("node0", True), ("online", False)]
    assert reader.read_first_line(f"{CPU}/online") == "0-5,8-11,14"


def test_discover_topology_takes_a_reader(holes: Path) -> None:
    topo = discover_topology(SysfsReader(str(holes) + "/"))
    assert str(topo.all_cpus) == "0-5,8-11,14"
