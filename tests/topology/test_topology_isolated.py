"""isolcpus= and nohz_full= (issue #16): read from sysfs, kept to discovered CPUs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dracpu.allocation.store import AllocationStore, ClaimRecord
from dracpu.cpuset import CPUSet
from dracpu.topology import discover_from_root
from dracpu.topology.sysfs import TopologyError

FIXTURES = Path(__file__).parent.parent / "fake_sysfs"


def test_the_isolated_fixture_reports_both_lists() -> None:
    topo = discover_from_root(FIXTURES / "isolated-rt")
    assert topo.isolated == CPUSet.parse("2-7,10-15")
    assert topo.nohz_full == CPUSet.parse("4-7,12-15")


def test_machines_without_the_files_isolate_nothing() -> None:
    topo = discover_from_root(FIXTURES / "xeon-2s-ht")
    assert topo.isolated == CPUSet() and topo.nohz_full == CPUSet()


@pytest.mark.parametrize(
    ("isolated", "nohz_full", "want"),
    [
        ("\n", "(null)\n", ("", "")),  # booted without either parameter
        ("0-3,100\n", "2\n", ("2-3", "2")),  # offline or unknown CPUs are dropped
    ],
)
def test_empty_null_and_foreign_cpus(
    tmp_path: Path, isolated: str, nohz_full: str, want: tuple[str, str]
) -> None:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "isolated-rt", root)
    cpu = root / "devices/system/cpu"
    (cpu / "online").write_text("2-15\n")
    (cpu / "isolated").write_text(isolated)
    (cpu / "nohz_full").write_text(nohz_full)
    topo = discover_from_root(root)
    assert (topo.isolated.format(), topo.nohz_full.format()) == want


def test_a_malformed_list_names_the_file(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "isolated-rt", root)
    (root / "devices/system/cpu/isolated").write_text("2-x\n")
    with pytest.raises(TopologyError, match=r"failed to read isolated CPUs: parse .*/isolated"):
        discover_from_root(root)


def test_isolated_cpus_can_be_claimed_but_are_never_shared() -> None:
    store = AllocationStore(CPUSet.parse("0-7"), CPUSet.parse("0"), CPUSet.parse("4-7"))
    assert store.shared_pool == CPUSet.parse("1-3")
    assert store.free == CPUSet.parse("1-7")
    store.reserve(ClaimRecord(uid="a", cpus=CPUSet.parse("4-5")))
    assert store.shared_pool == CPUSet.parse("1-3")
    assert store.snapshot().available == 5  # allocatable: 1-3 and the free isolated 6-7
