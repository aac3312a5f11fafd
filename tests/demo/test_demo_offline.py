"""The demo's CPU hotplug step (demo/offline.py): what it marks, where it may write."""

from __future__ import annotations

from pathlib import Path

import pytest

from dracpu.cpuset import CPUSet
from dracpu_sim.demo.offline import OfflineError, pods_to_offline, set_cpu_online, writable_sysfs
from dracpu_sim.demo.scenario import load_scenario

REPO = Path(__file__).parents[2]


def test_the_example_marks_its_pod() -> None:
    scenario = load_scenario(str(REPO / "docs/examples/cpu-offline.yaml"))
    assert pods_to_offline(scenario) == ["default/hotplugged"]


def test_the_step_copies_the_tree_and_flips_only_the_copy(tmp_path: Path) -> None:
    source = REPO / "tests/fake_sysfs/offline-holes"
    copy = writable_sysfs(str(source), str(tmp_path))
    set_cpu_online(copy, 14, False)
    cpu = Path(copy, "devices/system/cpu")
    assert (cpu / "online").read_text() == "0-5,8-11\n"
    assert (cpu / "cpu14/online").read_text() == "0\n"
    set_cpu_online(copy, 14, True)
    assert CPUSet.parse((cpu / "online").read_text().strip()) == CPUSet.parse("0-5,8-11,14")
    assert (source / "devices/system/cpu/online").read_text() == "0-5,8-11,14\n"


@pytest.mark.parametrize("root", ["/sys", "tests/fake_sysfs/missing", "README.md"])
def test_the_step_refuses_the_machine_and_non_directories(tmp_path: Path, root: str) -> None:
    with pytest.raises(OfflineError, match="needs --sysfs-root naming a sysfs tree directory"):
        writable_sysfs(root if root == "/sys" else str(REPO / root), str(tmp_path))
