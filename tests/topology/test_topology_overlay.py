"""The sysfs overlay (behavior.md §4.6): validation messages, reads, listings, NUMA moves."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dracpu.cpuset import CPUSet
from dracpu.topology import (
    SysfsError,
    SysfsOverlayError,
    SysfsReader,
    discover_from_root,
    discover_topology,
    load_overlay,
)

CPU = "devices/system/cpu"

SPEC_EXAMPLE = """\
/sys/devices/system/cpu/online: "0-3\\n"
/sys/devices/system/cpu/smt/control: "off\\n"
/sys/devices/system/node/node0/cpulist: "0-1\\n"
/sys/devices/system/cpu/cpu0/node0: ""
/sys/devices/system/cpu/cpu0/topology/physical_package_id: "0\\n"
/sys/devices/system/cpu/cpu0/topology/core_id: "0\\n"
/sys/devices/system/cpu/cpu0/cache/index3/level: "3\\n"
/sys/devices/system/cpu/cpu0/cache/index3/id: "0\\n"
/sys/devices/system/cpu/cpu0/cache/index3/shared_cpu_list: "0-1\\n"
/sys/devices/pci0000:00/pci_bus/0000:00/cpulistaffinity: "0-1\\n"
"""


def overlay_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "overlay.yaml"
    path.write_text(text)
    return path


def create_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(SysfsOverlayError) as info:
        load_overlay(overlay_file(tmp_path, text))
    return str(info.value)


def test_unreadable_overlay_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SysfsOverlayError) as info:
        load_overlay(missing)
    assert str(info.value) == f"read sysfs overlay: {missing}: No such file or directory"


def test_value_must_be_a_string(tmp_path: Path) -> None:
    assert create_error(tmp_path, "/sys/devices/system/cpu/online: 3\n") == (
        'create sysfs overlay: parse sysfs overlay: value for "/sys/devices/system/cpu/online" '
        "must be a string"
    )
    assert create_error(tmp_path, "/sys/a: null\n") == (
        'create sysfs overlay: parse sysfs overlay: value for "/sys/a" must be a string'
    )


def test_duplicate_keys_rejected(tmp_path: Path) -> None:
    msg = create_error(tmp_path, '/sys/a: "1"\n/sys/b: "2"\n/sys/a: "3"\n')
    assert msg == (
        "create sysfs overlay: parse sysfs overlay: duplicate key '/sys/a' (line 3, column 1)"
    )


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("- /sys/a\n", "the top level must be a mapping, not list"),
        ('"just text"\n', "the top level must be a mapping, not str"),
    ],
)
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, detail: str) -> None:
    assert create_error(tmp_path, text) == f"create sysfs overlay: parse sysfs overlay: {detail}"


def test_yaml_syntax_error(tmp_path: Path) -> None:
    msg = create_error(tmp_path, '/sys/a: "unterminated\n')
    assert msg == (
        "create sysfs overlay: parse sysfs overlay: while scanning a quoted scalar "
        "found unexpected end of stream (line 2, column 1)"
    )


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("/sys", 'sysfs overlay path "/sys" must be beneath /sys'),
        ("/proc/cpuinfo", 'sysfs overlay path "/proc/cpuinfo" must be beneath /sys'),
        ("sys/devices/x", 'sysfs overlay path "sys/devices/x" must be beneath /sys'),
        ("/sysfoo/x", 'sysfs overlay path "/sysfoo/x" must be beneath /sys'),
        ("/sys/devices/../x", 'sysfs overlay path "/sys/devices/../x" is not clean'),
        ("/sys/devices//x", 'sysfs overlay path "/sys/devices//x" is not clean'),
        ("/sys/devices/x/", 'sysfs overlay path "/sys/devices/x/" is not clean'),
        ("/sys/./devices", 'sysfs overlay path "/sys/./devices" is not clean'),
        ("/sys/", 'sysfs overlay path "/sys/" is not clean'),
    ],
)
def test_bad_keys(tmp_path: Path, key: str, message: str) -> None:
    assert create_error(tmp_path, f'"{key}": ""\n') == f"create sysfs overlay: {message}"


def test_non_string_key_is_named(tmp_path: Path) -> None:
    assert create_error(tmp_path, '12: ""\n') == (
        'create sysfs overlay: sysfs overlay path "12" must be beneath /sys'
    )


def test_file_and_directory(tmp_path: Path) -> None:
    text = '/sys/devices/system/cpu: "x"\n/sys/devices/system/cpu/online: "0"\n'
    assert create_error(tmp_path, text) == (
        'create sysfs overlay: sysfs overlay path "/sys/devices/system/cpu" '
        "is both a file and a directory"
    )


def test_multiple_numa_nodes_beneath_a_cpu(tmp_path: Path) -> None:
    text = (
        '/sys/devices/system/cpu/cpu3/node2: ""\n'
        '/sys/devices/system/cpu/cpu3/node10: ""\n'
        '/sys/devices/system/cpu/cpu4/node1: ""\n'
    )
    assert create_error(tmp_path, text) == (
        "create sysfs overlay: sysfs overlay defines multiple NUMA nodes beneath "
        "/sys/devices/system/cpu/cpu3: node10 and node2"
    )
    # only cpu<digits> directories are checked, and only node<digits> names count
    ok = '/sys/devices/system/cpu/cpufreq/node1: ""\n/sys/devices/system/cpu/cpufreq/node2: ""\n'
    assert len(load_overlay(overlay_file(tmp_path, ok))) == 2
    ok = '/sys/devices/system/cpu/cpu1/node1: ""\n/sys/devices/system/cpu/cpu1/nodes: ""\n'
    assert len(load_overlay(overlay_file(tmp_path, ok))) == 2


@pytest.mark.parametrize("text", ["", "{}\n", "# nothing\n"])
def test_empty_overlay_means_none(tmp_path: Path, text: str) -> None:
    assert load_overlay(overlay_file(tmp_path, text)) == {}
    reader = SysfsReader.with_overlay_file(tmp_path, overlay_file(tmp_path, text))
    assert reader.has_overlay is False


def test_spec_example_over_an_empty_host(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    topo = discover_from_root(
        host,
        overlay=overlay_file(tmp_path, SPEC_EXAMPLE),
        expose_pcie_roots=True,
        pcie_scan_supported=True,
    )
    assert list(topo.cpus) == [0]  # CPUs 1-3 have no topology: skipped, still online
    assert str(topo.online) == "0-3"
    info = topo.cpus[0]
    assert (info.socket, info.core, info.numa, str(info.numa_cpus), info.l3) == (0, 0, 0, "0-1", 0)
    assert topo.smt_enabled is False
    assert dict(topo.pcie_roots) == {"pci0000:00": CPUSet.parse("0-1")}


def test_reads_listings_and_types(fake_sysfs: Path, tmp_path: Path) -> None:
    text = (
        '/sys/devices/system/cpu/smt/control: "off\\n"\n'
        '/sys/devices/system/cpu/cpu0/cache/index9/level: "9\\n"\n'
        '/sys/devices/new/dir/file: "hello"\n'
    )
    reader = SysfsReader.with_overlay_file(fake_sysfs / "vm-1cpu", overlay_file(tmp_path, text))
    assert reader.read_text(f"{CPU}/smt/control") == "off\n"  # overlay wins
    assert reader.read_text(f"{CPU}/online") == "0\n"  # host
    assert reader.listdir(f"{CPU}/cpu0/cache") == ["index0", "index1", "index2", "index9"]
    assert reader.scandir(f"{CPU}/cpu0/cache/index9") == [("level", False)]
    assert reader.listdir("devices/new") == ["dir"]  # only in the overlay
    assert reader.scandir("devices/new") == [("dir", True)]
    assert "new" in reader.listdir("devices") and "system" in reader.listdir("devices")
    assert reader.exists("devices/new/dir") and reader.is_dir("devices/new/dir")
    assert reader.exists("devices/new/dir/file") and not reader.is_dir("devices/new/dir/file")
    with pytest.raises(SysfsError) as info:
        reader.read_text("devices/new/dir")
    assert str(info.value) == f"read {fake_sysfs}/vm-1cpu/devices/new/dir: Is a directory"
    with pytest.raises(SysfsError) as info:
        reader.listdir("devices/new/dir/file")
    assert str(info.value) == f"list {fake_sysfs}/vm-1cpu/devices/new/dir/file: Not a directory"


def test_overlay_moves_a_cpu_to_another_numa_node(fake_sysfs: Path, tmp_path: Path) -> None:
    text = '/sys/devices/system/cpu/cpu0/node1: ""\n'
    reader = SysfsReader.with_overlay_file(fake_sysfs / "xeon-2s-ht", overlay_file(tmp_path, text))
    names = reader.listdir(f"{CPU}/cpu0")
    assert "node1" in names and "node0" not in names  # the host's node0 link is hidden
    assert "node0" in reader.listdir(f"{CPU}/cpu1")  # other CPUs are untouched
    topo = discover_topology(reader)
    assert topo.cpus[0].numa == 1
    assert str(topo.cpus[0].numa_cpus) == "20-39,60-79"  # host's node1 cpulist, unchanged
    assert str(topo.by_numa[0]) == "1-19,40-59"
    assert str(topo.by_numa[1]) == "0,20-39,60-79"


def test_overlay_completes_a_broken_host(fake_sysfs: Path, tmp_path: Path) -> None:
    host = tmp_path / "host"
    shutil.copytree(fake_sysfs / "vm-1cpu", host, symlinks=True)
    (host / CPU / "cpu0/topology/core_id").unlink()
    assert discover_from_root(host).cpus == {}
    text = '/sys/devices/system/cpu/cpu0/topology/core_id: "5\\n"\n'
    topo = discover_from_root(host, overlay=overlay_file(tmp_path, text))
    assert topo.cpus[0].core == 5


def test_discover_from_root_reports_overlay_errors(tmp_path: Path) -> None:
    with pytest.raises(SysfsOverlayError) as info:
        discover_from_root(tmp_path, overlay=overlay_file(tmp_path, '"/etc/x": ""\n'))
    assert (
        str(info.value) == 'create sysfs overlay: sysfs overlay path "/etc/x" must be beneath /sys'
    )
