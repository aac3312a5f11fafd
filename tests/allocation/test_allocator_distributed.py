"""The KEP-2902 port, take_by_topology_numa_distributed (behavior.md §9.4)."""

from __future__ import annotations

import pytest
from builders import cs, grid

from dracpu.allocation import AllocationError, take_by_topology_numa_distributed
from dracpu.topology.model import Topology

# Two sockets = two NUMA nodes, 3 cores each: NUMA 0 = 0-2,6-8, NUMA 1 = 3-5,9-11.
DUAL_HT = grid(2, 1, 3, 2)
# SNC-2 Xeon 6230 layout: NUMA n = CPUs 10n..10n+9 and 40+10n..40+10n+9.
XEON_SNC = grid(2, 2, 10, 2, cores_per_l3=20)


@pytest.mark.parametrize(
    ("topo", "available", "count", "group", "expected"),
    [
        # Four cores split two per node.
        (DUAL_HT, "0-11", 8, 2, "0-1,3-4,6-7,9-10"),
        (DUAL_HT, "0-11", 8, 1, "0-1,3-4,6-7,9-10"),
        # 32 cores over four nodes, 8 each.
        (XEON_SNC, "0-79", 64, 2, "0-7,10-17,20-27,30-37,40-47,50-57,60-67,70-77"),
        # 24 cores: three nodes suffice; all combos score alike, the first (0,1,2) wins.
        (XEON_SNC, "0-79", 48, 2, "0-7,10-17,20-27,40-47,50-57,60-67"),
        # Socket 1 has fewer free CPUs, so the node order is 3,2,0,1; combo (2,0,1) leaves
        # the machine most balanced.
        (XEON_SNC, "1-29,32-39,41-69,72-79", 48, 2, "1-8,10-17,20-27,41-48,50-57,60-67"),
        # Five free CPUs per node: 16 CPUs need all four nodes, two cores from each.
        (
            XEON_SNC,
            "0-2,10-12,20-22,30-32,40-41,50-51,60-61,70-71",
            16,
            2,
            "0-1,10-11,20-21,30-31,40-41,50-51,60-61,70-71",
        ),
        # 13 cores over two nodes: 6 each, the remainder core from node 0.
        (XEON_SNC, "0-79", 26, 2, "0-6,10-15,40-46,50-55"),
        # 31 cores over four nodes: 7 each, three remainder cores to nodes 0, 1, 2.
        (XEON_SNC, "0-79", 62, 2, "0-7,10-17,20-27,30-36,40-47,50-57,60-67,70-76"),
        # Not a multiple of the group size: plain packing (uncore off).
        (XEON_SNC, "0-79", 3, 2, "0-1,40"),
    ],
)
def test_distributed(topo: Topology, available: str, count: int, group: int, expected: str) -> None:
    assert take_by_topology_numa_distributed(topo, cs(available), count, group) == cs(expected)


def test_distributed_zero_and_errors() -> None:
    assert take_by_topology_numa_distributed(DUAL_HT, cs("0-11"), 0, 2) == cs("")
    with pytest.raises(AllocationError) as info:
        take_by_topology_numa_distributed(DUAL_HT, cs("0-3"), 6, 2)
    assert str(info.value) == (
        "not enough cpus available to satisfy request: requested=6, available=4"
    )
    with pytest.raises(ValueError, match="cpu_group_size must be positive, got 0"):
        take_by_topology_numa_distributed(DUAL_HT, cs("0-3"), 2, 0)


def test_distributed_stuck_remainder_is_skipped() -> None:
    # Four nodes of 3 cores (NUMA n = CPUs 3n..3n+2, 12+3n..12+3n+2), one thread of each
    # node taken: 5 free per node. 14 CPUs in groups of 2: 2 per node, remainder 6. A
    # remainder subset of two nodes (3 left each) passes the sum check but cannot give a
    # third group; upstream loops forever on it, the port skips it. The best subset is all
    # four nodes, which hands the three remainder groups to nodes 0, 1 and 2.
    topo = grid(1, 4, 3, 2)
    available = cs("0-11,13-14,16-17,19-20,22-23")
    got = take_by_topology_numa_distributed(topo, available, 14, 2)
    assert got == cs("1-2,4-5,7-8,10,13-14,16-17,19-20,22")
