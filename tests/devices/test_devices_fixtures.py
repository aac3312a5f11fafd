"""Devices for every real-machine sysfs fixture: names, a few full devices, valid slices."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dracpu.cpuset import CPUSet
from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.topology import Topology, discover_from_root
from dracpu_sim.apiserver.validation import validate_resource_slice

FIXTURES = Path(__file__).parent.parent / "fake_sysfs"


def numa_names(count: int) -> list[str]:
    return [f"cpudevnuma{n:03d}" for n in range(count)]


def socket_names(count: int) -> list[str]:
    return [f"cpudevsocket{n:03d}" for n in range(count)]


def cpu_attrs(
    cpu: int,
    *,
    core: int,
    numa: int = 0,
    socket: int = 0,
    l3: int = 0,
    smt: bool = True,
    core_type: str = "standard",
    roots: list[str] | None = None,
) -> dict[str, Any]:
    attrs: dict[str, Any] = {"resource.kubernetes.io/numaNode": {"int": numa}}
    if roots:
        attrs["resource.kubernetes.io/pcieRoot"] = {"strings": roots}
    attrs |= {
        "dra.cpu/socketID": {"int": socket},
        "dra.cpu/smtEnabled": {"bool": smt},
        "dra.cpu/cacheL3ID": {"int": l3},
        "dra.cpu/coreType": {"string": core_type},
        "dra.cpu/coreID": {"int": core},
        "dra.cpu/cpuID": {"int": cpu},
        "dra.cpu/numaNodeID": {"int": numa},
        "dra.net/numaNode": {"int": numa},
    }
    return attrs


def numa_attrs(
    numa: int, *, socket: int, count: int, smt: bool = True, roots: list[str]
) -> dict[str, Any]:
    return {
        "resource.kubernetes.io/numaNode": {"int": numa},
        "resource.kubernetes.io/pcieRoot": {"strings": roots},
        "dra.cpu/socketID": {"int": socket},
        "dra.cpu/numCPUs": {"int": count},
        "dra.cpu/smtEnabled": {"bool": smt},
        "dra.cpu/numaNodeID": {"int": numa},
        "dra.net/numaNode": {"int": numa},
    }


@dataclass(frozen=True)
class Case:
    fixture: str
    individual_count: int
    first_cpus: list[int]  # CPUs of cpudev000.. in order
    numa: list[str]
    socket: list[str]
    # device name -> full attributes, individual mode with PCIe roots exposed
    cpu_devices: dict[str, dict[str, Any]] = field(default_factory=dict)
    # NUMA device name -> full attributes, grouped numanode with PCIe roots exposed
    numa_devices: dict[str, dict[str, Any]] = field(default_factory=dict)


XEON_ROOTS_0 = ["pci0000:00", "pci0000:17", "pci0000:3a", "pci0000:5d"]
XEON_ROOTS_1 = ["pci0000:80", "pci0000:85", "pci0000:ae", "pci0000:d7"]
EPYC_ROOTS = [f"pci0000:{b}0" for b in "02468ace"]

CASES = [
    Case(
        "xeon-2s-ht",
        80,
        [0, 40, 1, 41],
        numa_names(2),
        socket_names(2),
        cpu_devices={
            "cpudev001": cpu_attrs(40, core=0, roots=XEON_ROOTS_0),
            "cpudev079": cpu_attrs(79, core=19, numa=1, socket=1, l3=1, roots=XEON_ROOTS_1),
        },
        numa_devices={
            "cpudevnuma001": numa_attrs(1, socket=1, count=40, roots=XEON_ROOTS_1),
        },
    ),
    Case(
        "xeon-snc",
        80,
        [0, 40, 1, 41],
        numa_names(4),
        socket_names(2),
        cpu_devices={
            "cpudev016": cpu_attrs(8, core=8, roots=["pci0000:00", "pci0000:17"]),
            "cpudev079": cpu_attrs(
                79, core=19, numa=3, socket=1, l3=1, roots=["pci0000:ae", "pci0000:d7"]
            ),
        },
        numa_devices={
            "cpudevnuma002": numa_attrs(2, socket=1, count=20, roots=["pci0000:80", "pci0000:85"]),
        },
    ),
    Case(
        "epyc-nps1",
        128,
        [0, 64, 1, 65],
        numa_names(1),
        socket_names(1),
        cpu_devices={"cpudev127": cpu_attrs(127, core=63, l3=7, roots=EPYC_ROOTS)},
        numa_devices={"cpudevnuma000": numa_attrs(0, socket=0, count=128, roots=EPYC_ROOTS)},
    ),
    Case(
        "epyc-nps4",
        128,
        [0, 64, 1, 65],
        numa_names(4),
        socket_names(1),
        cpu_devices={
            "cpudev016": cpu_attrs(8, core=8, l3=1, roots=["pci0000:00", "pci0000:20"]),
            "cpudev127": cpu_attrs(127, core=63, numa=3, l3=7, roots=["pci0000:c0", "pci0000:e0"]),
        },
        numa_devices={
            "cpudevnuma003": numa_attrs(3, socket=0, count=32, roots=["pci0000:c0", "pci0000:e0"])
        },
    ),
    Case(
        "epyc-2s-768",
        768,
        [0, 384, 1, 385],
        numa_names(2),
        socket_names(2),
        cpu_devices={
            "cpudev767": cpu_attrs(
                767,
                core=191,
                numa=1,
                socket=1,
                l3=23,
                roots=[f"pci0000:{b}0" for b in "89abcdef"],
            )
        },
        numa_devices={
            "cpudevnuma000": numa_attrs(
                0, socket=0, count=384, roots=[f"pci0000:{b}0" for b in "01234567"]
            )
        },
    ),
    Case(
        "intel-hybrid",
        24,
        [0, 1, 2, 3],
        numa_names(1),
        socket_names(1),
        cpu_devices={
            "cpudev001": cpu_attrs(1, core=0, core_type="p-core", roots=["pci0000:00"]),
            "cpudev016": cpu_attrs(16, core=32, core_type="e-core", roots=["pci0000:00"]),
        },
        numa_devices={"cpudevnuma000": numa_attrs(0, socket=0, count=24, roots=["pci0000:00"])},
    ),
    Case(
        "arm-server",
        64,
        [0, 1, 2, 3],
        numa_names(1),
        socket_names(1),
        cpu_devices={
            "cpudev063": cpu_attrs(63, core=63, smt=False, roots=["pci0000:00", "pci0001:00"])
        },
        numa_devices={
            "cpudevnuma000": numa_attrs(
                0, socket=0, count=64, smt=False, roots=["pci0000:00", "pci0001:00"]
            )
        },
    ),
    Case(
        "vm-1cpu",
        1,
        [0],
        numa_names(1),
        socket_names(1),
        cpu_devices={"cpudev000": cpu_attrs(0, core=0, l3=-1, smt=False, roots=["pci0000:00"])},
        numa_devices={
            "cpudevnuma000": numa_attrs(0, socket=0, count=1, smt=False, roots=["pci0000:00"])
        },
    ),
    Case(
        "offline-holes",
        11,
        [0, 8, 1, 9],
        numa_names(1),
        socket_names(1),
        cpu_devices={
            "cpudev001": cpu_attrs(8, core=0, roots=["pci0000:00"]),
            "cpudev010": cpu_attrs(14, core=6, roots=["pci0000:00"]),
        },
        numa_devices={"cpudevnuma000": numa_attrs(0, socket=0, count=11, roots=["pci0000:00"])},
    ),
    # isolcpus=2-7,10-15 nohz_full=4-7,12-15: only such nodes carry the isolation attributes.
    Case(
        "isolated-rt",
        16,
        [0, 8, 1, 9],
        numa_names(1),
        socket_names(1),
        cpu_devices={
            "cpudev000": cpu_attrs(0, core=0, roots=["pci0000:00"])
            | {"dra.cpu/isolated": {"bool": False}, "dra.cpu/nohzFull": {"bool": False}},
            "cpudev004": cpu_attrs(2, core=2, roots=["pci0000:00"])
            | {"dra.cpu/isolated": {"bool": True}, "dra.cpu/nohzFull": {"bool": False}},
            "cpudev015": cpu_attrs(15, core=7, roots=["pci0000:00"])
            | {"dra.cpu/isolated": {"bool": True}, "dra.cpu/nohzFull": {"bool": True}},
        },
        numa_devices={
            "cpudevnuma000": numa_attrs(0, socket=0, count=16, roots=["pci0000:00"])
            | {"dra.cpu/isolatedCPUs": {"int": 12}, "dra.cpu/nohzFullCPUs": {"int": 8}}
        },
    ),
]

_cache: dict[str, Topology] = {}


def topology(fixture: str) -> Topology:
    # Discovery of the 768-CPU tree is the slow part; each fixture is read once per run.
    if fixture not in _cache:
        _cache[fixture] = discover_from_root(
            FIXTURES / fixture, expose_pcie_roots=True, pcie_scan_supported=True
        )
    return _cache[fixture]


def test_table_covers_every_fixture() -> None:
    machines = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
    assert sorted(c.fixture for c in CASES) == machines


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.fixture)
def test_fixture_devices(case: Case) -> None:
    topo = topology(case.fixture)
    pcie = DeviceSettings(mode="individual", expose_pcie_roots=True)
    individual = build_inventory(topo, pcie)
    assert len(individual.devices) == case.individual_count
    assert [individual.cpu_of_device[f"cpudev{i:03d}"] for i in range(len(case.first_cpus))] == (
        case.first_cpus
    )
    for name, attributes in case.cpu_devices.items():
        assert msgspec.to_builtins(individual.device(name)) == {
            "name": name,
            "attributes": attributes,
        }
    numa = build_inventory(topo, DeviceSettings(expose_pcie_roots=True))
    assert [d.name for d in numa.devices] == case.numa
    for name, attributes in case.numa_devices.items():
        count = attributes["dra.cpu/numCPUs"]["int"]
        assert msgspec.to_builtins(numa.device(name)) == {
            "name": name,
            "allowMultipleAllocations": True,
            "capacity": {"dra.cpu/cpu": {"value": str(count)}},
            "attributes": attributes,
        }
    socket = build_inventory(topo, DeviceSettings(group_by="socket"))
    assert [d.name for d in socket.devices] == case.socket


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.fixture)
@pytest.mark.parametrize("pcie", [False, True], ids=["plain", "pcie"])
def test_fixture_slices_are_valid_and_cover_the_cpus(case: Case, pcie: bool) -> None:
    topo = topology(case.fixture)
    for mode, group_by in (
        ("individual", "numanode"),
        ("grouped", "numanode"),
        ("grouped", "socket"),
        ("grouped", "machine"),
    ):
        settings = DeviceSettings(
            mode=mode,  # type: ignore[arg-type]
            group_by=group_by,  # type: ignore[arg-type]
            expose_pcie_roots=pcie,
            publish_node_allocatable=True,
        )
        inv = build_inventory(topo, settings)
        slices = build_slices(inv, node_name="node-a", node_uid="u", expose_pcie_roots=pcie)
        assert [p for s in slices for p in validate_resource_slice(s)] == []
        published = CPUSet()
        for device in inv.devices:
            assert published.isdisjoint(inv.cpus_of(device.name))
            published |= inv.cpus_of(device.name)
        machine = group_by == "machine" and mode == "grouped"
        assert published == (topo.online if machine else topo.all_cpus)
