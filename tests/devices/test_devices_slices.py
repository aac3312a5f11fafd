"""ResourceSlice objects: pool, owner, chunking and generateName (behavior.md §6.4)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from device_topos import grid

from dracpu.cpuset import CPUSet
from dracpu.devices import (
    DeviceSettings,
    build_inventory,
    build_slices,
    pool_device_names,
    slice_index_prefix,
)
from dracpu.topology import discover_from_root
from dracpu_sim.apiserver.validation import validate_resource_slice

cs = CPUSet.parse
INDIVIDUAL = DeviceSettings(mode="individual")
FIXTURES = Path(__file__).parent.parent / "fake_sysfs"


def test_grouped_numanode_slice_matches_spec_example() -> None:
    # §6.4 example shape: 2 NUMA nodes, PCIe roots on.
    roots = {"pci0000:00": cs("0,2"), "pci0000:17": cs("0"), "pci0000:80": cs("1,3")}
    topo = grid(1, 2, 1, pcie_roots=roots)
    settings = DeviceSettings(expose_pcie_roots=True)
    slices = build_slices(
        build_inventory(topo, settings),
        node_name="node-a",
        node_uid="9c4a7d1e-0000-4000-8000-000000000001",
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
                        "uid": "9c4a7d1e-0000-4000-8000-000000000001",
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
                        "capacity": {"dra.cpu/cpu": {"value": "2"}},
                        "attributes": {
                            "resource.kubernetes.io/numaNode": {"int": 0},
                            "resource.kubernetes.io/pcieRoot": {
                                "strings": ["pci0000:00", "pci0000:17"]
                            },
                            "dra.cpu/socketID": {"int": 0},
                            "dra.cpu/numCPUs": {"int": 2},
                            "dra.cpu/smtEnabled": {"bool": True},
                            "dra.cpu/numaNodeID": {"int": 0},
                            "dra.net/numaNode": {"int": 0},
                        },
                    },
                    {
                        "name": "cpudevnuma001",
                        "allowMultipleAllocations": True,
                        "capacity": {"dra.cpu/cpu": {"value": "2"}},
                        "attributes": {
                            "resource.kubernetes.io/numaNode": {"int": 1},
                            "resource.kubernetes.io/pcieRoot": {"strings": ["pci0000:80"]},
                            "dra.cpu/socketID": {"int": 0},
                            "dra.cpu/numCPUs": {"int": 2},
                            "dra.cpu/smtEnabled": {"bool": True},
                            "dra.cpu/numaNodeID": {"int": 1},
                            "dra.net/numaNode": {"int": 1},
                        },
                    },
                ],
            },
        }
    ]
    assert validate_resource_slice(slices[0]) == []


def test_individual_slice_device_matches_spec_example() -> None:
    # §6.4 second example: cpudev001 is CPU 8, the sibling of CPU 0 on an 8-core machine.
    topo = grid(1, 1, 8)
    settings = DeviceSettings(mode="individual", publish_node_allocatable=True)
    (slice_,) = build_slices(
        build_inventory(topo, settings), node_name="n", node_uid="u", expose_pcie_roots=False
    )
    assert slice_["spec"]["devices"][1] == {
        "name": "cpudev001",
        "attributes": {
            "resource.kubernetes.io/numaNode": {"int": 0},
            "dra.cpu/socketID": {"int": 0},
            "dra.cpu/smtEnabled": {"bool": True},
            "dra.cpu/cacheL3ID": {"int": 0},
            "dra.cpu/coreType": {"string": "standard"},
            "dra.cpu/coreID": {"int": 0},
            "dra.cpu/cpuID": {"int": 8},
            "dra.cpu/numaNodeID": {"int": 0},
            "dra.net/numaNode": {"int": 0},
        },
        "nodeAllocatableResources": {"cpu": {"mapping": {"deviceMultiplier": "1"}}},
    }


def test_no_devices_no_slices() -> None:
    inv = build_inventory(grid(1, 1, 2), DeviceSettings(reserved=cs("0-3")))
    assert build_slices(inv, node_name="n", node_uid="u", expose_pcie_roots=False) == []
    assert build_slices(inv, node_name="n", node_uid="u", expose_pcie_roots=True) == []


@pytest.mark.parametrize(
    ("cpus", "pcie", "sizes"),
    [
        (240, False, [128, 112]),
        (240, True, [64, 64, 64, 48]),
        (128, False, [128]),
        (128, True, [64, 64]),
        (138, False, [128, 10]),
        (2, False, [2]),
    ],
)
def test_chunking(cpus: int, pcie: bool, sizes: list[int]) -> None:
    # The 64 limit follows the flag even though this topology has no PCIe roots at all.
    inv = build_inventory(
        grid(1, 1, cpus // 2), DeviceSettings(mode="individual", expose_pcie_roots=pcie)
    )
    slices = build_slices(inv, node_name="w", node_uid="u", generation=3, expose_pcie_roots=pcie)
    assert [len(s["spec"]["devices"]) for s in slices] == sizes
    assert [s["spec"]["pool"] for s in slices] == [
        {"name": "w", "generation": 3, "resourceSliceCount": len(sizes)}
    ] * len(sizes)
    assert [s["metadata"]["generateName"] for s in slices] == [
        f"0000{i}-dra.cpu-w-" for i in range(len(sizes))
    ]
    # Chunks keep publication order and lose nothing.
    assert pool_device_names(slices) == [d.name for d in inv.devices]
    assert all(validate_resource_slice(s) == [] for s in slices)


def test_slices_are_fresh_objects_each_call() -> None:
    inv = build_inventory(grid(1, 1, 1), INDIVIDUAL)
    first = build_slices(inv, node_name="n", node_uid="u", expose_pcie_roots=False)
    first[0]["spec"]["devices"][0]["attributes"]["dra.cpu/cpuID"]["int"] = 42
    second = build_slices(inv, node_name="n", node_uid="u", expose_pcie_roots=False)
    assert second[0]["spec"]["devices"][0]["attributes"]["dra.cpu/cpuID"] == {"int": 0}
    assert msgspec.json.decode(msgspec.json.encode(second)) == second


@pytest.mark.parametrize(
    ("index", "count", "prefix"),
    [
        (0, 1, "00000"),
        (0, 0, "00000"),
        (1, 2, "00001"),
        (10, 11, "0000a"),
        (0xFFFFF, 0x100000, "fffff"),
        (5, 0x100001, "000005"),
        (0x100000, 0x100001, "100000"),
    ],
)
def test_slice_index_prefix(index: int, count: int, prefix: str) -> None:
    assert slice_index_prefix(index, count) == prefix


def test_768_cpu_individual_node_publishes_six_valid_slices() -> None:
    topo = discover_from_root(FIXTURES / "epyc-2s-768")
    inv = build_inventory(topo, INDIVIDUAL)
    slices = build_slices(inv, node_name="big", node_uid="u", expose_pcie_roots=False)
    assert [len(s["spec"]["devices"]) for s in slices] == [128] * 6
    assert [validate_resource_slice(s) for s in slices] == [[]] * 6
    assert [s["metadata"]["generateName"] for s in slices] == [
        f"0000{i}-dra.cpu-big-" for i in range(6)
    ]
    names = pool_device_names(slices)
    assert names[:3] == ["cpudev000", "cpudev001", "cpudev002"]
    assert names[-1] == "cpudev767"
    assert len(set(names)) == 768
    # CPU 0's sibling is CPU 384, so it is named right after it.
    assert [inv.cpu_of_device[n] for n in names[:4]] == [0, 384, 1, 385]


def test_768_cpu_individual_node_with_pcie_roots_publishes_twelve_valid_slices() -> None:
    topo = discover_from_root(
        FIXTURES / "epyc-2s-768", expose_pcie_roots=True, pcie_scan_supported=True
    )
    settings = DeviceSettings(mode="individual", expose_pcie_roots=True)
    slices = build_slices(
        build_inventory(topo, settings), node_name="big", node_uid="u", expose_pcie_roots=True
    )
    assert [len(s["spec"]["devices"]) for s in slices] == [64] * 12
    assert [validate_resource_slice(s) for s in slices] == [[]] * 12
    first = slices[0]["spec"]["devices"][0]["attributes"]["resource.kubernetes.io/pcieRoot"]
    assert first == {"strings": [f"pci0000:{b}0" for b in "01234567"]}
