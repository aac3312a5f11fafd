"""TakeByTopologyNUMAPacked (behavior.md §9.1-§9.3): exact cpusets, worked out by hand."""

from __future__ import annotations

import pytest
from builders import Row, cs, from_rows, grid, quirk_19_1

from dracpu.allocation import AllocationError, AllocationOptions, take_cpus
from dracpu.cpuset import CPUSet
from dracpu.topology.model import CoreType, Topology

NO_UNCORE = AllocationOptions(prefer_align_by_uncore_cache=False)
UNCORE = AllocationOptions()

# 8 CPUs, 1 socket, cores (0,4),(1,5),(2,6),(3,7).
SINGLE_HT = grid(1, 1, 4, 2)
# Dual Xeon Gold 6230 in SNC-2: 80 CPUs, 4 NUMA nodes of 10 cores, cores i and i+40,
# one L3 per socket. Two sockets < four NUMA nodes, so it is sockets-first.
XEON_6230 = grid(2, 2, 10, 2, cores_per_l3=20)
# 16 CPUs without SMT, four L3 groups of 4.
UNCORE_16 = grid(1, 1, 16, 1, cores_per_l3=4)
# 16 CPUs, 8 cores (c, c+8), two L3 groups of 4 cores: L3 0 = 0-3,8-11, L3 1 = 4-7,12-15.
TWO_L3_HT = grid(1, 1, 8, 2, cores_per_l3=4)
# Two sockets x one NUMA x 3 cores x 2 threads: socket 0 = 0-2,6-8, socket 1 = 3-5,9-11.
DUAL_HT = grid(2, 1, 3, 2)
# EPYC-like NPS4: 2 sockets x 4 NUMA x 4 cores x 2 threads (64 CPUs), L3 of 2 cores.
NPS4 = grid(2, 4, 4, 2, cores_per_l3=2)
# Two sockets without any L3 information: socket 0 = 0-3,8-11, socket 1 = 4-7,12-15.
NO_L3 = grid(2, 1, 4, 2)

CASES: list[tuple[str, Topology, str, int, AllocationOptions, str]] = [
    # behavior.md §9.3 examples
    ("single-ht: 2 of all", SINGLE_HT, "0-7", 2, NO_UNCORE, "0,4"),
    ("single-ht: 1, fewest-free core first", SINGLE_HT, "1,3,5-7", 1, NO_UNCORE, "6"),
    ("single-ht: 2, the only free core", SINGLE_HT, "0-3,6", 2, NO_UNCORE, "2,6"),
    ("single-ht: 0 CPUs", SINGLE_HT, "0-7", 0, NO_UNCORE, ""),
    ("single-ht: all", SINGLE_HT, "0-7", 8, NO_UNCORE, "0-7"),
    ("6230: one NUMA node", XEON_6230, "0-79", 20, NO_UNCORE, "0-9,40-49"),
    ("6230: one socket", XEON_6230, "0-79", 40, NO_UNCORE, "0-19,40-59"),
    (
        "6230: free socket 1, then free NUMA 1",
        XEON_6230,
        "1-39,41-79",
        60,
        NO_UNCORE,
        "10-39,50-79",
    ),
    ("6230: socket, NUMA node, two cores", XEON_6230, "0-79", 64, NO_UNCORE, "0-31,40-71"),
    ("6230: NUMA node and one core", XEON_6230, "0-79", 22, NO_UNCORE, "0-10,40-50"),
    ("6230: socket and one core", XEON_6230, "0-79", 42, NO_UNCORE, "0-20,40-60"),
    ("uncore-16: two whole L3s then a partial", UNCORE_16, "1-15", 10, UNCORE, "1-2,4-11"),
    # NUMA-first on two sockets: NUMA 0 taken whole, then core (1, 0) of socket 1.
    ("dual-ht: NUMA node and a core", DUAL_HT, "0-11", 8, NO_UNCORE, "0-3,6-9"),
    # Socket 0 has fewer free CPUs, so its emptiest-but-whole core (0,1) comes first.
    ("dual-ht: 1 with core (0,0) gone", DUAL_HT, "1-5,7-11", 1, NO_UNCORE, "1"),
    # Partial L3: two cores' worth, the odd request drops the highest CPU.
    ("two-l3: 3 CPUs, odd drop", TWO_L3_HT, "0-15", 3, UNCORE, "0-1,8"),
    ("two-l3: 3 CPUs, core 1 gone", TWO_L3_HT, "0,2-8,10-15", 3, UNCORE, "0,2,8"),
    # L3 0 starts with the half-free core 0, so its partial pick is short; L3 1 serves it.
    ("two-l3: 2 CPUs, L3 0 fragmented", TWO_L3_HT, "0-7,9-15", 2, UNCORE, "4,12"),
    ("two-l3: same without uncore", TWO_L3_HT, "0-7,9-15", 2, NO_UNCORE, "1,9"),
    ("two-l3: one whole L3", TWO_L3_HT, "0-15", 8, UNCORE, "0-3,8-11"),
    ("two-l3: a whole L3 and a partial", TWO_L3_HT, "0-15", 10, UNCORE, "0-4,8-12"),
    # Sockets-first: socket 0's NUMA nodes come first, NUMA 0 is not free any more.
    ("nps4: one NUMA node", NPS4, "0-63", 8, UNCORE, "0-3,32-35"),
    ("nps4: NUMA 0 broken, next NUMA", NPS4, "1-63", 8, UNCORE, "4-7,36-39"),
    ("nps4: one L3", NPS4, "0-63", 4, UNCORE, "0-1,32-33"),
    # No L3 at all: each socket is one uncore group (4 cores), so the partial step
    # takes the 7 free CPUs of socket 0 at once.
    ("no-l3: socket as uncore group", NO_L3, "1-3,5-15", 7, UNCORE, "1-3,8-11"),
    ("no-l3: 8 from fragmented sockets", NO_L3, "1-3,5-15", 8, UNCORE, "1-3,5,9-11,13"),
    # Spread: no full-core step; CPUs socket by socket in ascending order.
    (
        "spread: 2 of all",
        SINGLE_HT,
        "0-7",
        2,
        AllocationOptions(strategy="spread", prefer_align_by_uncore_cache=False),
        "0-1",
    ),
    (
        "spread: 3 on two sockets",
        DUAL_HT,
        "0-11",
        3,
        AllocationOptions(strategy="spread", prefer_align_by_uncore_cache=False),
        "0-2",
    ),
    (
        "spread: emptier socket first",
        DUAL_HT,
        "1-11",
        3,
        AllocationOptions(strategy="spread", prefer_align_by_uncore_cache=False),
        "1-2,6",
    ),
]


@pytest.mark.parametrize(
    ("topo", "available", "count", "options", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_take_cpus_examples(
    topo: Topology, available: str, count: int, options: AllocationOptions, expected: str
) -> None:
    assert take_cpus(topo, cs(available), count, options) == cs(expected)


def test_quirk_19_1_takes_only_candidates() -> None:
    # Upstream identifies cores by raw core_id, so its full-core step takes core_id 0 of
    # both sockets and returns 0,4,8,12 (CPUs 0 and 8 were not candidates). We identify a
    # core by (socket, cluster, core) and return exactly the candidates.
    topo = quirk_19_1()
    assert topo.num_uncore_caches == 4 and topo.cpus_per_core == 2
    assert take_cpus(topo, cs("4,6,12,14"), 4, UNCORE) == cs("4,6,12,14")


def test_not_enough_cpus_message() -> None:
    with pytest.raises(AllocationError) as info:
        take_cpus(SINGLE_HT, cs("0,2,4,6"), 5)
    assert str(info.value) == (
        "not enough cpus available to satisfy request: requested=5, available=4"
    )


def test_not_enough_counts_the_set_passed_in() -> None:
    # CPU 100 is not in the topology: it is never handed out, but the message reports the
    # size of the available set as given (behavior.md §9.3 step 1).
    with pytest.raises(AllocationError) as info:
        take_cpus(SINGLE_HT, cs("0-3,100"), 5)
    assert str(info.value) == (
        "not enough cpus available to satisfy request: requested=5, available=5"
    )
    assert take_cpus(SINGLE_HT, cs("0-3,100"), 4) == cs("0-3")


def test_negative_count_is_empty() -> None:
    assert take_cpus(SINGLE_HT, cs("0-7"), -3) == CPUSet()


def test_hybrid_half_used_p_core_is_not_free() -> None:
    # P-cores (0,1) and (2,3), E-cores 4..7: 8 CPUs / 6 cores gives CPUsPerCore 1, so
    # upstream would call P-core 0 "free" with only CPU 1 available and take CPU 0 too.
    rows = [Row(cpu=c, socket=0, numa=0, core=c // 2, core_type=CoreType.P_CORE) for c in range(4)]
    rows += [
        Row(cpu=c, socket=0, numa=0, core=c - 2, core_type=CoreType.E_CORE) for c in range(4, 8)
    ]
    hybrid = from_rows(rows)
    assert hybrid.cpus_per_core == 1
    assert take_cpus(hybrid, cs("1,4"), 2) == cs("1,4")
    # Whole P-cores are taken as cores once E-cores ran out.
    assert take_cpus(hybrid, cs("0-3"), 2, NO_UNCORE) == cs("0-1")


def test_no_l3_matches_one_l3_per_socket() -> None:
    # The documented fallback: no L3 anywhere == one L3 per socket.
    with_l3 = grid(2, 1, 4, 2, cores_per_l3=4)
    for available in ("0-15", "1-3,5-15", "0,2,4,6,9,11,13,15", "3-12"):
        for count in range(len(cs(available)) + 1):
            got = take_cpus(NO_L3, cs(available), count)
            assert got == take_cpus(with_l3, cs(available), count), (available, count)


def test_deterministic_across_calls_and_rebuilt_topologies() -> None:
    first = [take_cpus(XEON_6230, cs("1-39,41-79"), n) for n in range(79)]
    again = [take_cpus(XEON_6230, cs("1-39,41-79"), n) for n in range(79)]
    rebuilt = grid(2, 2, 10, 2, cores_per_l3=20)
    fresh = [take_cpus(rebuilt, cs("1-39,41-79"), n) for n in range(79)]
    assert first == again == fresh
    assert [len(s) for s in first] == list(range(79))
