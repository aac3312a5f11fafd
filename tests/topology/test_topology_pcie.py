"""PCIe root discovery (behavior.md §5)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from dracpu.cpuset import CPUSet
from dracpu.topology import (
    PCIeError,
    SysfsReader,
    TopologyError,
    discover_from_root,
    discover_pcie_roots,
    pcie_supported,
)

PREFIX = "failed to list PCIe domains: failed to list PCIe domains: "


@pytest.fixture
def vm(fake_sysfs: Path, tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(fake_sysfs / "vm-1cpu", root, symlinks=True)
    return root


def add_root(root: Path, name: str, cpus: str | None) -> None:
    bus = name.removeprefix("pci")
    d = root / "devices" / name / "pci_bus" / bus
    d.mkdir(parents=True)
    if cpus is not None:
        (d / "cpulistaffinity").write_text(cpus)


def test_root_names_must_match_exactly(vm: Path) -> None:
    add_root(vm, "pci0001:0c", "0\n")
    for ignored in (
        "pci0000:AB",
        "pci0000:000",
        "pci000:00",
        "pcifoo",
        "pci0000-00",
        "xpci0000:01",
    ):
        add_root(vm, ignored, None)  # a root would be fatal without the file: proves it is skipped
    assert discover_pcie_roots(SysfsReader(vm)) == {
        "pci0000:00": CPUSet([0]),
        "pci0001:0c": CPUSet([0]),
    }


def test_missing_cpulistaffinity_is_fatal(vm: Path) -> None:
    add_root(vm, "pci0000:80", None)
    with pytest.raises(PCIeError) as info:
        discover_pcie_roots(SysfsReader(vm))
    assert str(info.value) == (
        f"{PREFIX}open {vm}/devices/pci0000:80/pci_bus/0000:80/cpulistaffinity: "
        "No such file or directory"
    )
    assert isinstance(info.value, TopologyError)


def test_unparsable_cpulistaffinity_is_fatal(vm: Path) -> None:
    add_root(vm, "pci0000:80", "0-a\n")
    with pytest.raises(PCIeError) as info:
        discover_from_root(vm, expose_pcie_roots=True, pcie_scan_supported=True)
    assert str(info.value) == (
        f"{PREFIX}parse {vm}/devices/pci0000:80/pci_bus/0000:80/cpulistaffinity: "
        "invalid cpuset '0-a': not a cpu id or range: '0-a'"
    )


def test_unlistable_devices_dir_is_fatal(tmp_path: Path) -> None:
    with pytest.raises(PCIeError) as info:
        discover_pcie_roots(SysfsReader(tmp_path))
    assert str(info.value) == f"{PREFIX}list {tmp_path}/devices: No such file or directory"


def test_cpus_outside_every_root_are_logged(
    fake_sysfs: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "sys"
    shutil.copytree(fake_sysfs / "offline-holes", root, symlinks=True)
    (root / "devices/pci0000:00/pci_bus/0000:00/cpulistaffinity").write_text("0-3\n")
    caplog.set_level(logging.INFO, logger="dracpu.topology.discover")
    topo = discover_from_root(root, expose_pcie_roots=True, pcie_scan_supported=True)
    assert dict(topo.pcie_roots) == {"pci0000:00": CPUSet.parse("0-3")}
    assert topo.pcie_roots_of(CPUSet([8])) == []
    assert [r.getMessage() for r in caplog.records] == [
        "detected cpus not local to any detected PCIe Root cpus=4-5,8-11,14"
    ]


def test_no_roots_at_all(fake_sysfs: Path, tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(fake_sysfs / "vm-1cpu", root, symlinks=True)
    shutil.rmtree(root / "devices/pci0000:00")
    topo = discover_from_root(root, expose_pcie_roots=True, pcie_scan_supported=True)
    assert dict(topo.pcie_roots) == {}
    assert topo.pcie_roots_of(CPUSet([0])) == []


@pytest.mark.parametrize(
    ("machine", "supported"),
    [("x86_64", True), ("AMD64", True), ("aarch64", False), ("arm64", False), ("i686", False)],
)
def test_only_amd64_scans(machine: str, supported: bool) -> None:
    assert pcie_supported(machine) is supported
