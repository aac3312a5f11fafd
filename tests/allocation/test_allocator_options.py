"""fullPCPUsOnly, distributeAcrossNUMA, and parsing of the per-claim options."""

from __future__ import annotations

import pytest
from builders import Row, cs, from_rows, grid

from dracpu.allocation import (
    DEFAULT_OPTIONS,
    AllocationError,
    AllocationOptions,
    AllocationOptionsError,
    decode_allocation_options,
    is_allocation_options,
    options_from_kv,
    parse_allocation_options,
    take_cpus,
)
from dracpu.topology.model import CoreType, Topology

FULL = AllocationOptions(full_pcpus_only=True)
SPREAD_NUMA = AllocationOptions(distribute_across_numa=True)
FULL_SPREAD_NUMA = AllocationOptions(full_pcpus_only=True, distribute_across_numa=True)

SINGLE_HT = grid(1, 1, 4, 2)
TWO_L3_HT = grid(1, 1, 8, 2, cores_per_l3=4)
# SNC-2 Xeon: NUMA n = cores 10n..10n+9 -> CPUs 10n..10n+9 and 40+10n..40+10n+9.
XEON_SNC = grid(2, 2, 10, 2, cores_per_l3=20)
# EPYC NPS4-like: 8 NUMA nodes of 6 cores (CPUs 6n..6n+5, 48+6n..48+6n+5), L3 of 3 cores.
EPYC_NPS4 = grid(2, 4, 6, 2, cores_per_l3=3)


# -- fullPCPUsOnly -----------------------------------------------------------------------


def test_full_pcpus_rejects_partial_core_counts() -> None:
    with pytest.raises(AllocationError) as info:
        take_cpus(SINGLE_HT, cs("0-7"), 3, FULL)
    assert (
        str(info.value) == "fullPCPUsOnly: requested 3 CPUs is not a multiple of 2 threads per core"
    )


@pytest.mark.parametrize(
    ("available", "count", "whole"),
    [("0-4", 4, 1), ("0-3", 4, 0), ("0-2,4,5,7", 6, 2)],
)
def test_full_pcpus_not_enough_whole_cores(available: str, count: int, whole: int) -> None:
    with pytest.raises(AllocationError) as info:
        take_cpus(SINGLE_HT, cs(available), count, FULL)
    assert str(info.value) == (
        "fullPCPUsOnly: not enough free physical cores: "
        f"requested={count} CPUs ({count // 2} cores), available={whole} whole cores"
    )


def test_full_pcpus_more_than_available_uses_the_common_message() -> None:
    with pytest.raises(AllocationError) as info:
        take_cpus(SINGLE_HT, cs("0-3"), 6, FULL)
    assert str(info.value) == (
        "not enough cpus available to satisfy request: requested=6, available=4"
    )


def test_full_pcpus_skips_half_free_cores() -> None:
    # Default packing lets the partial-L3 step pick L3 1 (4,12) because L3 0 starts with
    # the half-free core 0; fullPCPUsOnly removes core 0 first, so L3 0 serves core 1.
    assert take_cpus(TWO_L3_HT, cs("0-7,9-15"), 2) == cs("4,12")
    assert take_cpus(TWO_L3_HT, cs("0-7,9-15"), 2, FULL) == cs("1,9")
    assert take_cpus(SINGLE_HT, cs("0-2,4,6"), 4, FULL) == cs("0,2,4,6")
    assert take_cpus(SINGLE_HT, cs("0-7"), 0, FULL) == cs("")


def test_full_pcpus_without_smt_accepts_any_count() -> None:
    assert take_cpus(grid(1, 1, 4, 1), cs("0-3"), 3, FULL) == cs("0-2")


def test_full_pcpus_on_unequal_cores() -> None:
    # P-cores (0,1),(2,3) and E-cores 4..7: CPUsPerCore is 1 (8 CPUs / 6 cores).
    rows = [Row(cpu=c, socket=0, numa=0, core=c // 2, core_type=CoreType.P_CORE) for c in range(4)]
    rows += [
        Row(cpu=c, socket=0, numa=0, core=c - 2, core_type=CoreType.E_CORE) for c in range(4, 8)
    ]
    hybrid = from_rows(rows)
    assert take_cpus(hybrid, cs("0-7"), 3, FULL) == cs("4-6")
    with pytest.raises(AllocationError) as info:
        take_cpus(hybrid, cs("0-3"), 1, FULL)
    assert str(info.value) == (
        "fullPCPUsOnly: cannot make 1 CPUs out of whole physical cores on this topology "
        "(cores have unequal thread counts)"
    )


# -- distributeAcrossNUMA ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("topo", "available", "count", "options", "expected"),
    [
        # Fits one node: the node with the most free CPUs (ties by id), packed inside it.
        (XEON_SNC, "0-79", 8, SPREAD_NUMA, "0-3,40-43"),
        (XEON_SNC, "5-79", 8, SPREAD_NUMA, "10-13,50-53"),
        # 30 > 20: two nodes of 15; an odd share drops the highest CPU of its last core.
        (XEON_SNC, "0-79", 30, SPREAD_NUMA, "0-7,10-17,40-46,50-56"),
        # NUMA 0 has only 10 free: the two emptiest-used nodes (1 and 2) give 12 each.
        (XEON_SNC, "5-39,45-79", 24, SPREAD_NUMA, "10-15,20-25,50-55,60-65"),
        # 36 over 12-CPU nodes: three whole nodes.
        (EPYC_NPS4, "0-95", 36, SPREAD_NUMA, "0-17,48-65"),
        # 40: four nodes of 10 = one whole L3 + two cores each.
        (EPYC_NPS4, "0-95", 40, SPREAD_NUMA, "0-4,6-10,12-16,18-22,48-52,54-58,60-64,66-70"),
        # 14: two nodes of 7 = one L3 and one thread each.
        (EPYC_NPS4, "0-95", 14, SPREAD_NUMA, "0-3,6-9,48-50,54-56"),
        # With fullPCPUsOnly the split is in cores: 7 cores = 4 + 3.
        (EPYC_NPS4, "0-95", 14, FULL_SPREAD_NUMA, "0-3,6-8,48-51,54-56"),
    ],
)
def test_distribute_across_numa(
    topo: Topology, available: str, count: int, options: AllocationOptions, expected: str
) -> None:
    assert take_cpus(topo, cs(available), count, options) == cs(expected)


def test_distribute_falls_back_to_packing_without_an_even_split() -> None:
    # Free CPUs per node 3, 3, 1: 7 cannot be split as 7, 4+3 or 3+2+2.
    topo = grid(1, 3, 3, 1)
    assert take_cpus(topo, cs("0-6"), 7, SPREAD_NUMA) == cs("0-6")


def test_distribute_not_enough() -> None:
    with pytest.raises(AllocationError) as info:
        take_cpus(XEON_SNC, cs("0-9"), 11, SPREAD_NUMA)
    assert str(info.value) == (
        "not enough cpus available to satisfy request: requested=11, available=10"
    )


# -- parsing ---------------------------------------------------------------------------


def test_defaults() -> None:
    options = DEFAULT_OPTIONS
    assert options.strategy == "packed"
    assert options.prefer_align_by_uncore_cache is True
    assert options.full_pcpus_only is False
    assert options.distribute_across_numa is False
    assert AllocationOptions() == options


def test_parse_full_object() -> None:
    params = {
        "apiVersion": "dra.cpu/v1alpha1",
        "kind": "AllocationOptions",
        "fullPCPUsOnly": True,
        "distributeAcrossNUMA": True,
        "preferAlignByUncoreCache": False,
        "strategy": "packed",
    }
    assert is_allocation_options(params)
    assert parse_allocation_options(params) == AllocationOptions(
        full_pcpus_only=True, distribute_across_numa=True, prefer_align_by_uncore_cache=False
    )


def test_parse_minimal_object_and_json() -> None:
    params = {"apiVersion": "dra.cpu/v1alpha1", "kind": "AllocationOptions"}
    assert parse_allocation_options(params) == DEFAULT_OPTIONS
    raw = b'{"apiVersion": "dra.cpu/v1alpha1", "kind": "AllocationOptions", "strategy": "spread"}'
    assert decode_allocation_options(raw) == AllocationOptions(strategy="spread")


def test_cpuset_override_is_not_an_options_object() -> None:
    assert not is_allocation_options({"apiVersion": "v1alpha1", "cpuConfig": {"cpus": "0-3"}})


BASE = {"apiVersion": "dra.cpu/v1alpha1", "kind": "AllocationOptions"}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {**BASE, "fullPcpusOnly": True},
            "invalid allocation options: Object contains unknown field `fullPcpusOnly`",
        ),
        (
            {**BASE, "fullPCPUsOnly": "true"},
            "invalid allocation options: Expected `bool`, got `str` - at `$.fullPCPUsOnly`",
        ),
        (
            {**BASE, "distributeAcrossNUMA": 1},
            "invalid allocation options: Expected `bool`, got `int` - at `$.distributeAcrossNUMA`",
        ),
        (
            {**BASE, "strategy": "random"},
            "invalid allocation options: Invalid enum value 'random' - at `$.strategy`",
        ),
        (
            {"kind": "AllocationOptions"},
            "invalid allocation options: Object missing required field `apiVersion`",
        ),
        (
            {"apiVersion": "dra.cpu/v1alpha1"},
            "invalid allocation options: Object missing required field `kind`",
        ),
        (
            {**BASE, "apiVersion": "v1alpha1"},
            "invalid allocation options: unsupported apiVersion 'v1alpha1' "
            "(want 'dra.cpu/v1alpha1')",
        ),
        (
            {**BASE, "kind": "CPUConfig"},
            "invalid allocation options: unsupported kind 'CPUConfig' (want 'AllocationOptions')",
        ),
        (
            {**BASE, "fullPCPUsOnly": True, "strategy": "spread"},
            'invalid allocation options: fullPCPUsOnly cannot be combined with strategy "spread" '
            "(spread splits physical cores)",
        ),
    ],
)
def test_parse_errors(params: dict[str, object], message: str) -> None:
    with pytest.raises(AllocationOptionsError) as info:
        parse_allocation_options(params)
    assert str(info.value) == message


def test_decode_rejects_bad_json() -> None:
    with pytest.raises(AllocationOptionsError) as info:
        decode_allocation_options(b"{not json")
    assert str(info.value).startswith("invalid allocation options: JSON is malformed")
    with pytest.raises(AllocationOptionsError) as info:
        decode_allocation_options(b"[]")
    assert str(info.value) == "invalid allocation options: Expected `object`, got `array`"


def test_options_from_kv() -> None:
    assert options_from_kv([]) == DEFAULT_OPTIONS
    assert options_from_kv(
        ["fullPCPUsOnly=true", "distributeAcrossNUMA=true", "preferAlignByUncoreCache=false"]
    ) == AllocationOptions(
        full_pcpus_only=True, distribute_across_numa=True, prefer_align_by_uncore_cache=False
    )
    assert options_from_kv(["strategy=spread"]) == AllocationOptions(strategy="spread")


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        (["fullPCPUsOnly"], "invalid --option 'fullPCPUsOnly': expected key=value"),
        (["=true"], "invalid --option '=true': expected key=value"),
        (["fullPCPUsOnly=yes"], "invalid --option 'fullPCPUsOnly=yes': expected true or false"),
        (["fullPCPUsOnly=True"], "invalid --option 'fullPCPUsOnly=True': expected true or false"),
        (["strategy=random"], "invalid --option 'strategy=random': expected packed or spread"),
        (
            ["numa=1"],
            "invalid --option 'numa=1': unknown key 'numa' (known: fullPCPUsOnly, "
            "distributeAcrossNUMA, preferAlignByUncoreCache, sharedPoolAccess, isolateIRQs, "
            "strategy)",
        ),
        (
            ["strategy=packed", "strategy=spread"],
            "invalid --option 'strategy=spread': strategy given twice",
        ),
        (
            ["fullPCPUsOnly=true", "strategy=spread"],
            'invalid --option set: fullPCPUsOnly cannot be combined with strategy "spread" '
            "(spread splits physical cores)",
        ),
    ],
)
def test_options_from_kv_errors(pairs: list[str], message: str) -> None:
    with pytest.raises(AllocationOptionsError) as info:
        options_from_kv(pairs)
    assert str(info.value) == message


def test_options_constructor_rejects_full_pcpus_with_spread() -> None:
    with pytest.raises(AllocationOptionsError):
        AllocationOptions(full_pcpus_only=True, strategy="spread")
