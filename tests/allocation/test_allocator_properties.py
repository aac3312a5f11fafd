"""Allocator invariants over random topologies and available sets (hypothesis)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from builders import from_rows, grid_rows
from hypothesis import given, settings
from hypothesis import strategies as st

from dracpu.allocation import (
    AllocationError,
    AllocationOptions,
    take_by_topology_numa_distributed,
    take_cpus,
)
from dracpu.cpuset import CPUSet
from dracpu.topology.model import Topology

OPTION_SETS = [
    AllocationOptions(),
    AllocationOptions(prefer_align_by_uncore_cache=False),
    AllocationOptions(strategy="spread"),
    AllocationOptions(strategy="spread", prefer_align_by_uncore_cache=False),
    AllocationOptions(distribute_across_numa=True),
]


@dataclass(frozen=True)
class Case:
    topo: Topology
    symmetric: bool  # every core has the same number of threads
    available: CPUSet
    count: int


@st.composite
def cases(draw: st.DrawFn) -> Case:
    sockets = draw(st.integers(1, 3))
    numa_per_socket = draw(st.integers(1, 3))
    cores_per_numa = draw(st.integers(1, 4))
    threads = draw(st.integers(1, 2))
    cores_per_l3 = draw(st.sampled_from([None, 1, 2, cores_per_numa, 2 * cores_per_numa]))
    rows = grid_rows(sockets, numa_per_socket, cores_per_numa, threads, cores_per_l3)
    # Renumber CPUs arbitrarily: nothing may depend on Linux's numbering habits.
    ids = draw(st.permutations(range(len(rows))))
    rows = [replace(r, cpu=ids[r.cpu]) for r in rows]
    # Sometimes drop CPUs (offline siblings, skipped CPUs): asymmetric machines.
    dropped = draw(st.sets(st.sampled_from(range(len(rows))), max_size=len(rows) - 1))
    rows = [r for r in rows if r.cpu not in dropped]
    topo = from_rows(rows)
    sizes = {len(c) for c in topo.by_core_key.values()}
    available = CPUSet(draw(st.sets(st.sampled_from(sorted(topo.cpus)))))
    count = draw(st.integers(0, len(available)))
    return Case(topo, len(sizes) == 1, available, count)


def whole_cores(topo: Topology, cpus: CPUSet) -> bool:
    return all(core & cpus in (CPUSet(), core) for core in topo.by_core_key.values())


def free_whole_core_cpus(topo: Topology, available: CPUSet) -> int:
    return sum(len(c) for c in topo.by_core_key.values() if c <= available)


@settings(max_examples=300, deadline=None)
@given(cases())
def test_result_is_count_cpus_from_available(case: Case) -> None:
    for options in OPTION_SETS:
        got = take_cpus(case.topo, case.available, case.count, options)
        assert got <= case.available
        assert len(got) == case.count
        assert take_cpus(case.topo, case.available, case.count, options) == got


@settings(max_examples=300, deadline=None)
@given(cases())
def test_packed_prefers_whole_cores(case: Case) -> None:
    per_core = case.topo.cpus_per_core
    if not case.symmetric or case.count % per_core:
        return
    if free_whole_core_cpus(case.topo, case.available) < case.count:
        return
    for uncore in (True, False):
        options = AllocationOptions(prefer_align_by_uncore_cache=uncore)
        got = take_cpus(case.topo, case.available, case.count, options)
        assert whole_cores(case.topo, got), (got, options)


@settings(max_examples=300, deadline=None)
@given(cases(), st.booleans())
def test_full_pcpus_only_gives_whole_cores_or_says_why(case: Case, distribute: bool) -> None:
    if not case.symmetric:
        return
    options = AllocationOptions(full_pcpus_only=True, distribute_across_numa=distribute)
    per_core = case.topo.cpus_per_core
    enough = free_whole_core_cpus(case.topo, case.available) >= case.count
    try:
        got = take_cpus(case.topo, case.available, case.count, options)
    except AllocationError as exc:
        assert case.count % per_core or not enough
        assert str(exc).startswith("fullPCPUsOnly: ")
        return
    assert case.count % per_core == 0 and enough
    assert got <= case.available and len(got) == case.count
    assert whole_cores(case.topo, got)


@settings(max_examples=200, deadline=None)
@given(cases(), st.booleans())
def test_distributed_port_invariants(case: Case, by_core: bool) -> None:
    group = max(case.topo.cpus_per_core, 1) if by_core else 1
    got = take_by_topology_numa_distributed(case.topo, case.available, case.count, group)
    assert got <= case.available
    assert len(got) == case.count


@settings(max_examples=100, deadline=None)
@given(cases())
def test_more_than_available_is_an_error(case: Case) -> None:
    count = len(case.available) + 1
    for options in OPTION_SETS:
        try:
            take_cpus(case.topo, case.available, count, options)
        except AllocationError as exc:
            assert str(exc) == (
                "not enough cpus available to satisfy request: "
                f"requested={count}, available={len(case.available)}"
            )
        else:
            raise AssertionError("expected an AllocationError")
