"""Devices and ResourceSlices (behavior.md §6, §20; protocols.md §4.4)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from dracpu.cpuset import CPUSet
from dracpu.devices import (
    DeviceSettings,
    build_inventory,
    build_slices,
    slice_index_prefix,
    validate_slice,
)
from dracpu.topology import discover_from_root

sys.path.insert(0, str(Path(__file__).parent.parent / "allocation"))
from topo_builders import grid

FIXTURES = Path(__file__).parent.parent / "fake_sysfs"


def names_to_cpus(settings: DeviceSettings, topo: Any) -> dict[str, int]:
    return dict(build_inventory(topo, settings).cpu_of_device)


def test_individual_naming_keeps_siblings_consecutive() -> None:
    topo = grid(1, 1, 2)  # siblings (0,2), (1,3)
    assert names_to_cpus(DeviceSettings(mode="individual"), topo) == {
        "cpudev000": 0,
        "cpudev001": 2,
        "cpudev002": 1,
        "cpudev003": 3,
    }
    topo8 = grid(1, 1, 4)  # siblings (0,4), (1,5), (2,6), (3,7)
    settings = DeviceSettings(mode="individual", reserved=CPUSet([0]))
    assert list(names_to_cpus(settings, topo8).items()) == [
        ("cpudev000", 1),
        ("cpudev001", 5),
        ("cpudev002", 2),
        ("cpudev003", 6),
        ("cpudev004", 3),
        ("cpudev005", 7),
        ("cpudev006", 4),
    ]


def test_individual_device_shape() -> None:
    topo = grid(1, 1, 4)
    settings = DeviceSettings(mode="individual", publish_node_allocatable=True)
    slices = build_slices(build_inventory(topo, settings), node_name="node-a", node_uid="u1")
    assert len(slices) == 1
    assert slices[0]["spec"]["devices"][1] == {
        "name": "cpudev001",
        "attributes": {
            "resource.kubernetes.io/numaNode": {"int": 0},
            "dra.cpu/socketID": {"int": 0},
            "dra.cpu/smtEnabled": {"bool": True},
            "dra.cpu/cacheL3ID": {"int": -1},
            "dra.cpu/coreType": {"string": "standard"},
            "dra.cpu/coreID": {"int": 0},
            "dra.cpu/cpuID": {"int": 4},
            "dra.cpu/numaNodeID": {"int": 0},
            "dra.net/numaNode": {"int": 0},
        },
        "nodeAllocatableResources": {"cpu": {"mapping": {"deviceMultiplier": "1"}}},
    }


def test_grouped_numanode_slice_is_exact() -> None:
    topo = dataclasses.replace(
        grid(1, 2, 2), pcie_roots={"pci0000:00": CPUSet([0, 4]), "pci0000:17": CPUSet([1, 5])}
    )
    settings = DeviceSettings(expose_pcie_roots=True, reserved=CPUSet([2]))
    slices = build_slices(
        build_inventory(topo, settings),
        node_name="node-a",
        node_uid="uid-1",
        expose_pcie_roots=True,
    )
    assert slices == [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "generateName": "00000-dra.cpu-node-a-",
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": "node-a",
                        "uid": "uid-1",
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "driver": "dra.cpu",
                "nodeName": "node-a",
                "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": "cpudevnuma000",
                        "allowMultipleAllocations": True,
                        "capacity": {"dra.cpu/cpu": {"value": "4"}},
                        "attributes": {
                            "resource.kubernetes.io/numaNode": {"int": 0},
                            "dra.cpu/socketID": {"int": 0},
                            "dra.cpu/numCPUs": {"int": 4},
                            "dra.cpu/smtEnabled": {"bool": True},
                            "resource.kubernetes.io/pcieRoot": {
                                "strings": ["pci0000:00", "pci0000:17"]
                            },
                            "dra.cpu/numaNodeID": {"int": 0},
                            "dra.net/numaNode": {"int": 0},
                        },
                    },
                    {
                        "name": "cpudevnuma001",
                        "allowMultipleAllocations": True,
                        "capacity": {"dra.cpu/cpu": {"value": "3"}},
                        "attributes": {
                            "resource.kubernetes.io/numaNode": {"int": 1},
                            "dra.cpu/socketID": {"int": 0},
                            "dra.cpu/numCPUs": {"int": 3},
                            "dra.cpu/smtEnabled": {"bool": True},
                            "dra.cpu/numaNodeID": {"int": 1},
                            "dra.net/numaNode": {"int": 1},
                        },
                    },
                ],
            },
        }
    ]
    assert validate_slice(slices[0]) == []


def test_grouped_socket_and_lookups() -> None:
    topo = grid(2, 1, 2)
    inv = build_inventory(topo, DeviceSettings(group_by="socket"))
    assert [d.name for d in inv.devices] == ["cpudevsocket000", "cpudevsocket001"]
    assert inv.group_of_device == {"cpudevsocket000": 0, "cpudevsocket001": 1}
    assert inv.cpus_of("cpudevsocket001") == CPUSet([2, 3, 6, 7])
    assert inv.attributes_of("cpudevsocket000") == {
        "dra.cpu/socketID": {"int": 0},
        "dra.cpu/numCPUs": {"int": 4},
        "dra.cpu/smtEnabled": {"bool": True},
    }
    assert inv.attributes_of("nope") is None


def test_machine_device_counts_online_minus_reserved() -> None:
    topo = grid(1, 1, 4)
    settings = DeviceSettings(
        group_by="machine", reserved=CPUSet.parse("0-1"), publish_node_allocatable=True
    )
    (device,) = build_slices(build_inventory(topo, settings), node_name="n", node_uid="u")[0][
        "spec"
    ]["devices"]
    assert device == {
        "name": "cpudevmachine",
        "allowMultipleAllocations": True,
        "capacity": {"dra.cpu/cpu": {"value": "6"}},
        "attributes": {"dra.cpu/numCPUs": {"int": 6}, "dra.cpu/smtEnabled": {"bool": True}},
        "nodeAllocatableResources": {
            "cpu": {"mapping": {"capacityKey": "dra.cpu/cpu", "capacityMultiplier": "1"}}
        },
    }
    everything = DeviceSettings(group_by="machine", reserved=CPUSet.parse("0-7"))
    (empty,) = build_inventory(topo, everything).devices
    assert empty.capacity == {"dra.cpu/cpu": {"value": "0"}}


def test_no_devices_no_slices() -> None:
    topo = grid(1, 1, 2)
    inv = build_inventory(topo, DeviceSettings(reserved=CPUSet.parse("0-3")))
    assert inv.devices == ()
    assert build_slices(inv, node_name="n", node_uid="u") == []


@pytest.mark.parametrize(
    ("cores", "pcie", "sizes"),
    [
        (120, False, [128, 112]),
        (120, True, [64, 64, 64, 48]),
        (64, False, [128]),
        (69, False, [128, 10]),
    ],
)
def test_chunking(cores: int, pcie: bool, sizes: list[int]) -> None:
    topo = grid(1, 1, cores)
    inv = build_inventory(topo, DeviceSettings(mode="individual", expose_pcie_roots=pcie))
    slices = build_slices(inv, node_name="w", node_uid="u", expose_pcie_roots=pcie)
    assert [len(s["spec"]["devices"]) for s in slices] == sizes
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(sizes)}
    assert [s["metadata"]["generateName"] for s in slices] == [
        f"{i:05x}-dra.cpu-w-" for i in range(len(sizes))
    ]


def test_slice_index_prefix() -> None:
    assert slice_index_prefix(0, 1) == "00000"
    assert slice_index_prefix(10, 11) == "0000a"
    assert slice_index_prefix(5, 0x100001) == "000005"


def test_768_cpu_node_publishes_valid_slices() -> None:
    topo = discover_from_root(FIXTURES / "epyc-2s-768")
    inv = build_inventory(topo, DeviceSettings(mode="individual"))
    slices = build_slices(inv, node_name="big", node_uid="u")
    assert [len(s["spec"]["devices"]) for s in slices] == [128] * 6
    assert all(validate_slice(s) == [] for s in slices)
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert names[:2] == ["cpudev000", "cpudev001"] and names[-1] == "cpudev767"
    assert inv.cpu_of_device["cpudev001"] == 384  # sibling of CPU 0


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.iterdir()))
def test_every_fixture_publishes_valid_slices(fixture: str) -> None:
    topo = discover_from_root(FIXTURES / fixture)
    for settings in (
        DeviceSettings(mode="individual"),
        DeviceSettings(group_by="numanode"),
        DeviceSettings(group_by="socket"),
        DeviceSettings(group_by="machine"),
    ):
        inv = build_inventory(topo, settings)
        slices = build_slices(inv, node_name="n", node_uid="u")
        assert all(validate_slice(s) == [] for s in slices)
        published = CPUSet()
        for device in inv.devices:
            published |= inv.cpus_of(device.name)
        machine = settings.mode == "grouped" and settings.group_by == "machine"
        assert published == (topo.online if machine else topo.all_cpus)


def test_validate_slice_reports_problems() -> None:
    bad = {
        "spec": {
            "pool": {"name": ""},
            "devices": [
                {
                    "name": "Bad_Name",
                    "attributes": {
                        "dra.cpu/x": {"string": "a" * 65},
                        "UPPER.example/y": {"int": 1},
                        "two": {"int": 1, "bool": True},
                    },
                }
            ]
            + [{"name": f"d{i}"} for i in range(128)],
        }
    }
    assert validate_slice(bad) == [
        "spec.pool.name: must be 1-253 characters, got 0",
        "spec.devices: must have at most 128 items, got 129",
        "spec.devices[0].name: 'Bad_Name' must be a DNS label of at most 63 characters",
        "spec.devices[0].attributes['UPPER.example/y']: domain 'UPPER.example' must be a DNS "
        "subdomain of at most 63 characters",
        "spec.devices[0].attributes['dra.cpu/x']: string longer than 64 characters",
        "spec.devices[0].attributes['two']: must have exactly one value",
    ]
