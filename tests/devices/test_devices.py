"""Device inventory: naming, attributes, capacity and lookups (behavior.md §6.1-§6.3, §20)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from device_topos import grid

from dracpu.cpuset import CPUSet
from dracpu.devices import (
    Device,
    DeviceInventory,
    DeviceSettings,
    UnknownDeviceError,
    build_inventory,
)

cs = CPUSet.parse
INDIVIDUAL = DeviceSettings(mode="individual")
PER_DEVICE = {"cpu": {"mapping": {"deviceMultiplier": "1"}}}
PER_CAPACITY = {"cpu": {"mapping": {"capacityKey": "dra.cpu/cpu", "capacityMultiplier": "1"}}}


def encoded(inv: DeviceInventory) -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = msgspec.to_builtins(list(inv.devices))
    return devices


def individual(
    name: str,
    cpu: int,
    *,
    numa: int = 0,
    socket: int = 0,
    core: int,
    l3: int = 0,
    smt: bool = True,
    core_type: str = "standard",
) -> dict[str, Any]:
    """The expected JSON of one individual device, attributes in §6.4 example order."""
    return {
        "name": name,
        "attributes": {
            "resource.kubernetes.io/numaNode": {"int": numa},
            "dra.cpu/socketID": {"int": socket},
            "dra.cpu/smtEnabled": {"bool": smt},
            "dra.cpu/cacheL3ID": {"int": l3},
            "dra.cpu/coreType": {"string": core_type},
            "dra.cpu/coreID": {"int": core},
            "dra.cpu/cpuID": {"int": cpu},
            "dra.cpu/numaNodeID": {"int": numa},
            "dra.net/numaNode": {"int": numa},
        },
    }


# -- individual naming (§6.2) --------------------------------------------------------------------


def test_individual_naming_four_cpus_siblings_consecutive() -> None:
    topo = grid(1, 1, 2)  # siblings (0,2), (1,3)
    inv = build_inventory(topo, INDIVIDUAL)
    assert list(inv.cpu_of_device.items()) == [
        ("cpudev000", 0),
        ("cpudev001", 2),
        ("cpudev002", 1),
        ("cpudev003", 3),
    ]


def test_individual_naming_eight_cpus_cpu0_reserved() -> None:
    topo = grid(1, 1, 4)  # siblings (0,4), (1,5), (2,6), (3,7)
    inv = build_inventory(topo, DeviceSettings(mode="individual", reserved=cs("0")))
    assert list(inv.cpu_of_device.items()) == [
        ("cpudev000", 1),
        ("cpudev001", 5),
        ("cpudev002", 2),
        ("cpudev003", 6),
        ("cpudev004", 3),
        ("cpudev005", 7),
        ("cpudev006", 4),
    ]
    assert [d.name for d in inv.devices] == list(inv.cpu_of_device)


def test_individual_naming_without_smt_is_cpu_order() -> None:
    topo = grid(1, 1, 3, threads=1)
    inv = build_inventory(topo, INDIVIDUAL)
    assert dict(inv.cpu_of_device) == {"cpudev000": 0, "cpudev001": 1, "cpudev002": 2}


def test_individual_names_grow_past_three_digits() -> None:
    topo = grid(1, 1, 501)  # 1002 CPUs
    names = [d.name for d in build_inventory(topo, INDIVIDUAL).devices]
    assert names[998:] == ["cpudev998", "cpudev999", "cpudev1000", "cpudev1001"]


def test_individual_four_cpus_full_devices() -> None:
    topo = grid(1, 1, 2)
    assert encoded(build_inventory(topo, INDIVIDUAL)) == [
        {
            "name": "cpudev000",
            "attributes": {
                "resource.kubernetes.io/numaNode": {"int": 0},
                "dra.cpu/socketID": {"int": 0},
                "dra.cpu/smtEnabled": {"bool": True},
                "dra.cpu/cacheL3ID": {"int": 0},
                "dra.cpu/coreType": {"string": "standard"},
                "dra.cpu/coreID": {"int": 0},
                "dra.cpu/cpuID": {"int": 0},
                "dra.cpu/numaNodeID": {"int": 0},
                "dra.net/numaNode": {"int": 0},
            },
        },
        individual("cpudev001", 2, core=0),
        individual("cpudev002", 1, core=1),
        individual("cpudev003", 3, core=1),
    ]


def test_individual_two_sockets_reserved_full_devices() -> None:
    # Cores: socket 0 has CPUs (0,4),(1,5); socket 1 has (2,6),(3,7); core_id restarts.
    topo = grid(2, 1, 2, l3=False)
    inv = build_inventory(topo, DeviceSettings(mode="individual", reserved=cs("0,7")))
    assert encoded(inv) == [
        individual("cpudev000", 1, core=1, l3=-1),
        individual("cpudev001", 5, core=1, l3=-1),
        individual("cpudev002", 2, numa=1, socket=1, core=0, l3=-1),
        individual("cpudev003", 6, numa=1, socket=1, core=0, l3=-1),
        individual("cpudev004", 3, numa=1, socket=1, core=1, l3=-1),
        individual("cpudev005", 4, core=0, l3=-1),
    ]
    # Key order is part of the output contract (stable, diffable slices).
    assert list(inv.devices[0].attributes) == [
        "resource.kubernetes.io/numaNode",
        "dra.cpu/socketID",
        "dra.cpu/smtEnabled",
        "dra.cpu/cacheL3ID",
        "dra.cpu/coreType",
        "dra.cpu/coreID",
        "dra.cpu/cpuID",
        "dra.cpu/numaNodeID",
        "dra.net/numaNode",
    ]
    assert inv.allocatable == cs("1-6")


def test_individual_hybrid_core_types_and_no_smt() -> None:
    topo = grid(1, 1, 2, threads=1, e_cores=cs("1"))
    assert encoded(build_inventory(topo, INDIVIDUAL)) == [
        individual("cpudev000", 0, core=0, smt=False, core_type="p-core"),
        individual("cpudev001", 1, core=1, smt=False, core_type="e-core"),
    ]


def test_individual_node_allocatable_mapping() -> None:
    topo = grid(1, 1, 1)
    settings = DeviceSettings(mode="individual", publish_node_allocatable=True)
    assert encoded(build_inventory(topo, settings)) == [
        {**individual("cpudev000", 0, core=0), "nodeAllocatableResources": PER_DEVICE},
        {**individual("cpudev001", 1, core=0), "nodeAllocatableResources": PER_DEVICE},
    ]


def test_individual_pcie_root_of_the_single_cpu() -> None:
    roots = {"pci0000:00": cs("0-1"), "pci0000:80": cs("1"), "pci0000:17": cs("0")}
    topo = grid(1, 1, 1, pcie_roots=roots)
    devices = build_inventory(
        topo, DeviceSettings(mode="individual", expose_pcie_roots=True)
    ).devices
    assert [d.attributes.get("resource.kubernetes.io/pcieRoot") for d in devices] == [
        {"strings": ["pci0000:00", "pci0000:17"]},
        {"strings": ["pci0000:00", "pci0000:80"]},
    ]
    # The standard attributes come first: numaNode, then pcieRoot.
    assert list(devices[0].attributes)[:3] == [
        "resource.kubernetes.io/numaNode",
        "resource.kubernetes.io/pcieRoot",
        "dra.cpu/socketID",
    ]


def test_individual_pcie_root_omitted_when_not_local_or_disabled() -> None:
    topo = grid(1, 1, 1, pcie_roots={"pci0000:00": cs("1")})
    exposed = build_inventory(topo, DeviceSettings(mode="individual", expose_pcie_roots=True))
    assert [d.attributes.get("resource.kubernetes.io/pcieRoot") for d in exposed.devices] == [
        None,
        {"strings": ["pci0000:00"]},
    ]
    hidden = build_inventory(topo, INDIVIDUAL)
    assert all("resource.kubernetes.io/pcieRoot" not in d.attributes for d in hidden.devices)


def test_individual_skips_cpus_discovery_dropped() -> None:
    # Online 0-5, but discovery kept only 0-3: no device for 4 and 5 (§4.5).
    topo = grid(1, 1, 2, online=cs("0-5"))
    inv = build_inventory(topo, INDIVIDUAL)
    assert dict(inv.cpu_of_device) == {
        "cpudev000": 0,
        "cpudev001": 2,
        "cpudev002": 1,
        "cpudev003": 3,
    }
    assert inv.allocatable == cs("0-3")
    assert inv.machine_cpus == cs("0-5")


# -- grouped: numanode and socket (§6.3) ---------------------------------------------------------


def test_grouped_numanode_full_devices() -> None:
    # 2 sockets x 2 NUMA x 1 core x 2 threads: NUMA n has CPUs n and n+4.
    topo = grid(2, 2, 1)
    inv = build_inventory(topo, DeviceSettings(reserved=cs("4")))

    def numa(n: int, socket: int, count: int) -> dict[str, Any]:
        return {
            "name": f"cpudevnuma{n:03d}",
            "allowMultipleAllocations": True,
            "capacity": {"dra.cpu/cpu": {"value": str(count)}},
            "attributes": {
                "resource.kubernetes.io/numaNode": {"int": n},
                "dra.cpu/socketID": {"int": socket},
                "dra.cpu/numCPUs": {"int": count},
                "dra.cpu/smtEnabled": {"bool": True},
                "dra.cpu/numaNodeID": {"int": n},
                "dra.net/numaNode": {"int": n},
            },
        }

    assert encoded(inv) == [numa(0, 0, 1), numa(1, 0, 2), numa(2, 1, 2), numa(3, 1, 2)]
    assert dict(inv.group_of_device) == {
        "cpudevnuma000": 0,
        "cpudevnuma001": 1,
        "cpudevnuma002": 2,
        "cpudevnuma003": 3,
    }
    assert inv.cpus_of("cpudevnuma000") == cs("0")
    assert inv.cpus_of("cpudevnuma002") == cs("2,6")
    assert inv.cpu_of_device == {}


def test_grouped_numanode_names_use_the_numa_id_and_skip_empty_nodes() -> None:
    topo = grid(1, 3, 1)  # NUMA 0: 0,3; NUMA 1: 1,4; NUMA 2: 2,5
    inv = build_inventory(topo, DeviceSettings(reserved=cs("1,4")))
    assert [d.name for d in inv.devices] == ["cpudevnuma000", "cpudevnuma002"]
    assert dict(inv.group_of_device) == {"cpudevnuma000": 0, "cpudevnuma002": 2}
    assert inv.allocatable == cs("0,2-3,5")


def test_grouped_socket_full_devices() -> None:
    topo = grid(2, 2, 1, threads=1)  # socket 0: CPUs 0,1; socket 1: CPUs 2,3
    settings = DeviceSettings(group_by="socket", reserved=cs("3"), publish_node_allocatable=True)
    inv = build_inventory(topo, settings)
    assert encoded(inv) == [
        {
            "name": "cpudevsocket000",
            "allowMultipleAllocations": True,
            "capacity": {"dra.cpu/cpu": {"value": "2"}},
            "attributes": {
                "dra.cpu/socketID": {"int": 0},
                "dra.cpu/numCPUs": {"int": 2},
                "dra.cpu/smtEnabled": {"bool": False},
            },
            "nodeAllocatableResources": PER_CAPACITY,
        },
        {
            "name": "cpudevsocket001",
            "allowMultipleAllocations": True,
            "capacity": {"dra.cpu/cpu": {"value": "1"}},
            "attributes": {
                "dra.cpu/socketID": {"int": 1},
                "dra.cpu/numCPUs": {"int": 1},
                "dra.cpu/smtEnabled": {"bool": False},
            },
            "nodeAllocatableResources": PER_CAPACITY,
        },
    ]
    assert dict(inv.group_of_device) == {"cpudevsocket000": 0, "cpudevsocket001": 1}
    assert inv.cpus_of("cpudevsocket001") == cs("2")


def test_grouped_socket_skips_fully_reserved_socket() -> None:
    topo = grid(2, 1, 1)  # socket 0: 0,2; socket 1: 1,3
    inv = build_inventory(topo, DeviceSettings(group_by="socket", reserved=cs("0,2")))
    assert [d.name for d in inv.devices] == ["cpudevsocket001"]


def test_grouped_numanode_pcie_root_union_over_allocatable_cpus() -> None:
    roots = {
        "pci0000:17": cs("0"),
        "pci0000:00": cs("2"),
        "pci0000:3a": cs("4"),  # only CPU 4, which is reserved: not in the union
        "pci0000:80": cs("1,3"),
        "pci0000:d7": cs("1"),
    }
    topo = grid(1, 2, 1, pcie_roots=roots)  # NUMA 0: 0,2; NUMA 1: 1,3
    inv = build_inventory(topo, DeviceSettings(expose_pcie_roots=True, reserved=cs("4")))
    assert encoded(inv)[0] == {
        "name": "cpudevnuma000",
        "allowMultipleAllocations": True,
        "capacity": {"dra.cpu/cpu": {"value": "2"}},
        "attributes": {
            "resource.kubernetes.io/numaNode": {"int": 0},
            "resource.kubernetes.io/pcieRoot": {"strings": ["pci0000:00", "pci0000:17"]},
            "dra.cpu/socketID": {"int": 0},
            "dra.cpu/numCPUs": {"int": 2},
            "dra.cpu/smtEnabled": {"bool": True},
            "dra.cpu/numaNodeID": {"int": 0},
            "dra.net/numaNode": {"int": 0},
        },
    }
    assert inv.devices[1].attributes["resource.kubernetes.io/pcieRoot"] == {
        "strings": ["pci0000:80", "pci0000:d7"]
    }


def test_grouped_pcie_root_omitted_without_local_roots_or_without_the_flag() -> None:
    topo = grid(1, 2, 1, pcie_roots={"pci0000:00": cs("1")})  # only NUMA 1 has a root
    exposed = build_inventory(topo, DeviceSettings(expose_pcie_roots=True))
    assert ["resource.kubernetes.io/pcieRoot" in d.attributes for d in exposed.devices] == [
        False,
        True,
    ]
    for group_by in ("numanode", "socket", "machine"):
        hidden = build_inventory(topo, DeviceSettings(group_by=group_by))
        assert all("resource.kubernetes.io/pcieRoot" not in d.attributes for d in hidden.devices)
    no_roots = build_inventory(grid(1, 2, 1), DeviceSettings(expose_pcie_roots=True))
    assert all("resource.kubernetes.io/pcieRoot" not in d.attributes for d in no_roots.devices)


def test_grouped_socket_pcie_root_comes_first() -> None:
    topo = grid(2, 1, 1, pcie_roots={"pci0000:80": cs("1"), "pci0000:00": cs("0-1")})
    inv = build_inventory(topo, DeviceSettings(group_by="socket", expose_pcie_roots=True))
    assert [d.attributes for d in inv.devices] == [
        {
            "resource.kubernetes.io/pcieRoot": {"strings": ["pci0000:00"]},
            "dra.cpu/socketID": {"int": 0},
            "dra.cpu/numCPUs": {"int": 2},
            "dra.cpu/smtEnabled": {"bool": True},
        },
        {
            "resource.kubernetes.io/pcieRoot": {"strings": ["pci0000:00", "pci0000:80"]},
            "dra.cpu/socketID": {"int": 1},
            "dra.cpu/numCPUs": {"int": 2},
            "dra.cpu/smtEnabled": {"bool": True},
        },
    ]


# -- grouped: machine (§6.3, §20) ----------------------------------------------------------------


def test_machine_example_of_appendix() -> None:
    topo = grid(1, 1, 4)  # 8 online CPUs, SMT on
    inv = build_inventory(topo, DeviceSettings(group_by="machine", reserved=cs("0-1")))
    assert encoded(inv) == [
        {
            "name": "cpudevmachine",
            "allowMultipleAllocations": True,
            "capacity": {"dra.cpu/cpu": {"value": "6"}},
            "attributes": {"dra.cpu/numCPUs": {"int": 6}, "dra.cpu/smtEnabled": {"bool": True}},
        }
    ]
    assert inv.cpus_of("cpudevmachine") == cs("2-7")
    assert inv.machine_cpus == cs("2-7")
    assert inv.group_of_device == {}
    assert inv.cpu_of_device == {}


def test_machine_counts_online_cpus_discovery_skipped() -> None:
    # Quirk §4.5/§19.4: online 0-9, topology kept 0-7 -> capacity 10 - 2 reserved = 8.
    topo = grid(1, 1, 4, online=cs("0-9"))
    settings = DeviceSettings(group_by="machine", reserved=cs("0-1"), publish_node_allocatable=True)
    inv = build_inventory(topo, settings)
    assert encoded(inv) == [
        {
            "name": "cpudevmachine",
            "allowMultipleAllocations": True,
            "capacity": {"dra.cpu/cpu": {"value": "8"}},
            "attributes": {"dra.cpu/numCPUs": {"int": 8}, "dra.cpu/smtEnabled": {"bool": True}},
            "nodeAllocatableResources": PER_CAPACITY,
        }
    ]
    assert inv.cpus_of("cpudevmachine") == cs("2-9")
    assert inv.allocatable == cs("2-7")


def test_machine_published_even_when_everything_is_reserved() -> None:
    topo = grid(1, 1, 1)
    inv = build_inventory(topo, DeviceSettings(group_by="machine", reserved=cs("0-1")))
    assert encoded(inv) == [
        {
            "name": "cpudevmachine",
            "allowMultipleAllocations": True,
            "capacity": {"dra.cpu/cpu": {"value": "0"}},
            "attributes": {"dra.cpu/numCPUs": {"int": 0}, "dra.cpu/smtEnabled": {"bool": True}},
        }
    ]
    assert inv.cpus_of("cpudevmachine") == CPUSet()


def test_machine_pcie_root_union_over_online_minus_reserved() -> None:
    topo = grid(1, 1, 2, pcie_roots={"pci0000:00": cs("0"), "pci0000:17": cs("1-3")})
    inv = build_inventory(
        topo, DeviceSettings(group_by="machine", expose_pcie_roots=True, reserved=cs("0"))
    )
    assert inv.devices[0].attributes == {
        "resource.kubernetes.io/pcieRoot": {"strings": ["pci0000:17"]},
        "dra.cpu/numCPUs": {"int": 3},
        "dra.cpu/smtEnabled": {"bool": True},
    }


# -- no devices, lookups, settings -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "group_by"),
    [("individual", "numanode"), ("grouped", "numanode"), ("grouped", "socket")],
)
def test_everything_reserved_means_no_devices(mode: Any, group_by: Any) -> None:
    topo = grid(1, 2, 1)
    inv = build_inventory(topo, DeviceSettings(mode=mode, group_by=group_by, reserved=cs("0-3")))
    assert inv.devices == ()
    assert inv.allocatable == CPUSet()


def test_unknown_device_lookups_raise() -> None:
    inv = build_inventory(grid(1, 1, 1), INDIVIDUAL)
    assert "cpudev001" in inv
    assert "cpudev002" not in inv
    with pytest.raises(UnknownDeviceError, match=r"^device 'cpudev002' is not published by"):
        inv.cpus_of("cpudev002")
    with pytest.raises(UnknownDeviceError) as info:
        inv.attributes_of("cpudevnuma000")
    assert str(info.value) == "device 'cpudevnuma000' is not published by this node"
    assert info.value.name == "cpudevnuma000"
    with pytest.raises(UnknownDeviceError):
        inv.device("nope")


def test_attributes_of_returns_a_private_copy() -> None:
    inv = build_inventory(grid(1, 1, 1), DeviceSettings())
    attributes = inv.attributes_of("cpudevnuma000")
    assert attributes == {
        "resource.kubernetes.io/numaNode": {"int": 0},
        "dra.cpu/socketID": {"int": 0},
        "dra.cpu/numCPUs": {"int": 2},
        "dra.cpu/smtEnabled": {"bool": True},
        "dra.cpu/numaNodeID": {"int": 0},
        "dra.net/numaNode": {"int": 0},
    }
    attributes["dra.cpu/allocatedNumCPUs"] = {"int": 2}
    attributes["dra.cpu/numCPUs"]["int"] = 99
    assert inv.attributes_of("cpudevnuma000")["dra.cpu/numCPUs"] == {"int": 2}
    assert "dra.cpu/allocatedNumCPUs" not in inv.device("cpudevnuma000").attributes


def test_inventory_lookups_are_read_only() -> None:
    inv = build_inventory(grid(1, 1, 1), INDIVIDUAL)
    with pytest.raises(TypeError):
        inv.cpu_of_device["cpudev009"] = 9  # type: ignore[index]


def test_inventory_reports_its_mode_for_prepare() -> None:
    inv = build_inventory(grid(1, 1, 1), DeviceSettings(group_by="socket"))
    assert (inv.mode, inv.group_by) == ("grouped", "socket")
    inv = build_inventory(grid(1, 1, 1), INDIVIDUAL)
    assert inv.mode == "individual"


def test_settings_reject_unknown_mode_and_grouping() -> None:
    bad: Any = "bogus"
    with pytest.raises(
        ValueError, match=r"^cpuDeviceMode must be one of \['grouped', 'individual'\], got 'bogus'$"
    ):
        DeviceSettings(mode=bad)
    with pytest.raises(
        ValueError,
        match=r"^groupBy must be one of \['numanode', 'socket', 'machine'\], got 'bogus'$",
    ):
        DeviceSettings(group_by=bad)


def test_settings_defaults() -> None:
    assert DeviceSettings() == DeviceSettings(
        mode="grouped",
        group_by="numanode",
        reserved=CPUSet(),
        expose_pcie_roots=False,
        publish_node_allocatable=False,
    )


def test_device_encodes_only_set_fields() -> None:
    assert msgspec.json.encode(Device(name="cpudev000")) == b'{"name":"cpudev000"}'


def test_has_list_attributes_follows_pcie_roots() -> None:
    topo = grid(1, 1, 1, pcie_roots={"pci0000:00": cs("0")})
    assert build_inventory(topo, DeviceSettings(expose_pcie_roots=True)).has_list_attributes
    assert not build_inventory(topo, DeviceSettings()).has_list_attributes
