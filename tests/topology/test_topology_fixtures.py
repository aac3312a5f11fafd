"""Discovery over every checked-in machine shape.

Each expected map is computed here from the machine's description (the formulas in the
docstrings of tools/gen_fake_sysfs.py, restated), not from discovery itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dracpu.cpuset import CPUSet
from dracpu.topology import NO_ID, CoreType, Topology, discover_from_root

P, E, S = CoreType.P_CORE, CoreType.E_CORE, CoreType.STANDARD

# cpu -> (socket, die, cluster, core, numa, l3, core_type, sibling, thread_siblings, numa_cpus)
Row = tuple[int, int, int, int, int, int, CoreType, int, str, str]


def rows(topo: Topology) -> dict[int, Row]:
    return {
        c.cpu: (
            c.socket,
            c.die,
            c.cluster,
            c.core,
            c.numa,
            c.l3,
            c.core_type,
            c.sibling,
            str(c.thread_siblings),
            str(c.numa_cpus),
        )
        for c in topo.cpus.values()
    }


def counters(topo: Topology) -> tuple[int, int, int, int, int, bool, str]:
    return (
        topo.num_cpus,
        topo.num_cores,
        topo.num_sockets,
        topo.num_numa_nodes,
        topo.num_uncore_caches,
        topo.smt_enabled,
        str(topo.online),
    )


def load(fake_sysfs: Path, name: str) -> Topology:
    return discover_from_root(fake_sysfs / name, expose_pcie_roots=True, pcie_scan_supported=True)


def ranges(*spans: tuple[int, int]) -> str:
    cpus = CPUSet()
    for first, last in spans:
        cpus |= CPUSet.range(first, last)
    return str(cpus)


def xeon_rows(snc: bool) -> dict[int, Row]:
    out: dict[int, Row] = {}
    for c in range(80):
        g = c % 40
        socket, core = divmod(g, 20)
        sibling = c + 40 if c < 40 else c - 40
        if snc:
            numa = socket * 2 + core // 10
            numa_cpus = ranges((10 * numa, 10 * numa + 9), (40 + 10 * numa, 49 + 10 * numa))
        else:
            numa = socket
            numa_cpus = ranges(
                (20 * socket, 20 * socket + 19), (40 + 20 * socket, 59 + 20 * socket)
            )
        threads = f"{min(c, sibling)},{max(c, sibling)}"
        out[c] = (socket, 0, 32 * socket + core, core, numa, socket, S, sibling, threads, numa_cpus)
    return out


def test_xeon_2s_ht(fake_sysfs: Path) -> None:
    topo = load(fake_sysfs, "xeon-2s-ht")
    assert rows(topo) == xeon_rows(snc=False)
    assert counters(topo) == (80, 40, 2, 2, 2, True, "0-79")
    assert (topo.cpus_per_core, topo.cpus_per_socket, topo.cpus_per_uncore) == (2, 40, 40)
    s0, s1 = CPUSet.parse("0-19,40-59"), CPUSet.parse("20-39,60-79")
    assert dict(topo.pcie_roots) == {
        "pci0000:00": s0,
        "pci0000:17": s0,
        "pci0000:3a": s0,
        "pci0000:5d": s0,
        "pci0000:80": s1,
        "pci0000:85": s1,
        "pci0000:ae": s1,
        "pci0000:d7": s1,
    }
    assert topo.pcie_roots_of(CPUSet([3, 25])) == [
        "pci0000:00",
        "pci0000:17",
        "pci0000:3a",
        "pci0000:5d",
        "pci0000:80",
        "pci0000:85",
        "pci0000:ae",
        "pci0000:d7",
    ]


def test_xeon_snc(fake_sysfs: Path) -> None:
    topo = load(fake_sysfs, "xeon-snc")
    assert rows(topo) == xeon_rows(snc=True)
    assert counters(topo) == (80, 40, 2, 4, 2, True, "0-79")
    assert {k: str(v) for k, v in topo.by_numa.items()} == {
        0: "0-9,40-49",
        1: "10-19,50-59",
        2: "20-29,60-69",
        3: "30-39,70-79",
    }
    assert topo.pcie_roots_of(CPUSet([45])) == ["pci0000:00", "pci0000:17"]
    assert topo.pcie_roots_of(CPUSet([79])) == ["pci0000:ae", "pci0000:d7"]


def epyc_rows(nps: int) -> dict[int, Row]:
    out: dict[int, Row] = {}
    per_node = 64 // nps
    for c in range(128):
        core = c % 64
        sibling = c + 64 if c < 64 else c - 64
        numa = core // per_node
        numa_cpus = ranges(
            (per_node * numa, per_node * numa + per_node - 1),
            (64 + per_node * numa, 64 + per_node * numa + per_node - 1),
        )
        threads = f"{min(c, sibling)},{max(c, sibling)}"
        out[c] = (0, 0, NO_ID, core, numa, core // 8, S, sibling, threads, numa_cpus)
    return out


@pytest.mark.parametrize(("name", "nps"), [("epyc-nps1", 1), ("epyc-nps4", 4)])
def test_epyc_7763(fake_sysfs: Path, name: str, nps: int) -> None:
    topo = load(fake_sysfs, name)
    assert rows(topo) == epyc_rows(nps)
    assert counters(topo) == (128, 64, 1, nps, 8, True, "0-127")
    assert {k: str(v) for k, v in topo.by_l3.items()} == {
        i: f"{8 * i}-{8 * i + 7},{64 + 8 * i}-{71 + 8 * i}" for i in range(8)
    }
    assert topo.cpus_per_uncore == 16
    buses = ["00", "20", "40", "60", "80", "a0", "c0", "e0"]
    expected = {f"pci0000:{b}": topo.by_numa[j * nps // 8] for j, b in enumerate(buses)}
    assert dict(topo.pcie_roots) == expected


def test_epyc_2s_768(fake_sysfs: Path) -> None:
    topo = load(fake_sysfs, "epyc-2s-768")
    expected: dict[int, Row] = {}
    for c in range(768):
        g = c % 384
        socket, core = divmod(g, 192)
        sibling = c + 384 if c < 384 else c - 384
        numa_cpus = ranges(
            (192 * socket, 192 * socket + 191), (384 + 192 * socket, 575 + 192 * socket)
        )
        threads = f"{min(c, sibling)},{max(c, sibling)}"
        l3 = 12 * socket + core // 16
        expected[c] = (socket, 0, NO_ID, core, socket, l3, S, sibling, threads, numa_cpus)
    assert rows(topo) == expected
    assert counters(topo) == (768, 384, 2, 2, 24, True, "0-767")
    assert (topo.cpus_per_core, topo.cpus_per_socket, topo.cpus_per_uncore) == (2, 384, 32)
    assert len(topo.pcie_roots) == 16
    assert topo.pcie_roots_of(CPUSet([0])) == [f"pci0000:{16 * j:02x}" for j in range(8)]
    assert topo.pcie_roots_of(CPUSet([767])) == [f"pci0000:{16 * j:02x}" for j in range(8, 16)]


def test_intel_hybrid(fake_sysfs: Path) -> None:
    topo = load(fake_sysfs, "intel-hybrid")
    expected: dict[int, Row] = {}
    for c in range(16):
        k = c // 2
        expected[c] = (0, 0, 8 * k, 4 * k, 0, 0, P, c ^ 1, str(CPUSet([2 * k, 2 * k + 1])), "0-23")
    for c in range(16, 24):
        j = c - 16
        expected[c] = (0, 0, 64 + 8 * (j // 4), 32 + j, 0, 0, E, NO_ID, str(c), "0-23")
    assert rows(topo) == expected
    assert counters(topo) == (24, 16, 1, 1, 1, True, "0-23")
    assert topo.cpus_per_core == 1  # 24 // 16: the ratios assume symmetry
    assert dict(topo.pcie_roots) == {"pci0000:00": CPUSet.range(0, 23)}


def test_arm_server(fake_sysfs: Path) -> None:
    topo = load(fake_sysfs, "arm-server")
    # No die_id file on ARM (-> 0); the L3 has no id file, so it is named by its lowest CPU.
    expected: dict[int, Row] = {
        c: (0, 0, c // 4, c, 0, 0, S, NO_ID, str(c), "0-63") for c in range(64)
    }
    assert rows(topo) == expected
    assert counters(topo) == (64, 64, 1, 1, 1, False, "0-63")
    assert dict(topo.pcie_roots) == {
        "pci0000:00": CPUSet.range(0, 63),
        "pci0001:00": CPUSet.range(0, 63),
    }


def test_vm_1cpu(fake_sysfs: Path) -> None:
    topo = load(fake_sysfs, "vm-1cpu")
    assert rows(topo) == {0: (0, 0, 0, 0, 0, NO_ID, S, NO_ID, "0", "0")}
    # no smt/control file: fallback "more CPUs than cores" is false
    assert counters(topo) == (1, 1, 1, 1, 0, False, "0")
    assert (topo.cpus_per_core, topo.cpus_per_uncore) == (1, 0)
    assert topo.by_l3 == {}


def test_offline_holes(fake_sysfs: Path) -> None:
    topo = load(fake_sysfs, "offline-holes")
    online = CPUSet.parse("0-5,8-11,14")
    expected: dict[int, Row] = {}
    for c in online:
        core = c % 8
        pair = CPUSet([core, core + 8]) & online
        sibling = (pair - CPUSet([c])).min() if len(pair) == 2 else NO_ID
        expected[c] = (0, 0, core, core, 0, 0, S, sibling, str(pair), "0-5,8-11,14")
    assert rows(topo) == expected
    assert [(c, topo.cpus[c].sibling) for c in (0, 4, 5, 8, 14)] == [
        (0, 8),
        (4, NO_ID),
        (5, NO_ID),
        (8, 0),
        (14, NO_ID),
    ]
    assert counters(topo) == (11, 7, 1, 1, 1, True, "0-5,8-11,14")
    assert dict(topo.pcie_roots) == {"pci0000:00": online}


def test_pcie_roots_off_by_default(fake_sysfs: Path) -> None:
    topo = discover_from_root(fake_sysfs / "xeon-2s-ht")
    assert dict(topo.pcie_roots) == {}


def test_pcie_roots_not_scanned_off_amd64(fake_sysfs: Path) -> None:
    topo = discover_from_root(
        fake_sysfs / "xeon-2s-ht", expose_pcie_roots=True, pcie_scan_supported=False
    )
    assert dict(topo.pcie_roots) == {}


def test_xeon_snc_matches_the_allocator_examples(fake_sysfs: Path) -> None:
    """The fixture is the "Dual Xeon Gold 6230 layout" of behavior.md §9.3."""
    from dracpu.allocation import take_cpus

    topo = load(fake_sysfs, "xeon-snc")
    free = topo.all_cpus
    assert str(take_cpus(topo, free, 20)) == "0-9,40-49"
    assert str(take_cpus(topo, free, 40)) == "0-19,40-59"
    assert str(take_cpus(topo, CPUSet.parse("1-39,41-79"), 60)) == "10-39,50-79"
    assert str(take_cpus(topo, free, 64)) == "0-31,40-71"
