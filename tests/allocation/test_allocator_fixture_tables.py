"""Exact allocator answers on the checked-in machines, reasoned by hand from behavior.md §9.

Each expectation follows the steps of §9.3 on the fixture's layout (comments give the step
that decides); none was produced by running the allocator.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dracpu.allocation import AllocationOptions, take_cpus
from dracpu.cpuset import CPUSet
from dracpu.topology import discover_from_root

FIXTURES = Path(__file__).resolve().parent.parent / "fake_sysfs"

CASES = [
    # xeon-2s-ht: socket s core c = CPUs s*20+c and s*20+c+40; NUMA-first.
    ("xeon-2s-ht", None, 40, "0-19,40-59"),  # whole NUMA node 0
    ("xeon-2s-ht", None, 20, "0-9,40-49"),  # partial L3: the 10 lowest cores
    ("xeon-2s-ht", None, 3, "0-1,40"),  # 2 cores, odd need drops the highest CPU
    ("xeon-2s-ht", None, 80, "0-79"),
    # xeon-snc: 4 NUMA nodes of 10 cores, sockets-first.
    ("xeon-snc", None, 20, "0-9,40-49"),  # whole NUMA node 0
    ("xeon-snc", None, 40, "0-19,40-59"),  # whole socket 0
    ("xeon-snc", None, 2, "0,40"),  # one whole core
    ("xeon-snc", None, 1, "0"),
    ("xeon-snc", "1-39,41-79", 60, "10-39,50-79"),  # the §9.3 example
    # epyc-nps1: one socket, 8 L3 groups of 8 cores, siblings i and i+64.
    ("epyc-nps1", None, 16, "0-7,64-71"),  # one whole L3
    ("epyc-nps1", None, 24, "0-11,64-75"),  # L3 0, then 4 cores of L3 1
    # epyc-nps4: sockets-first; NUMA node n = cores 16n..16n+15.
    ("epyc-nps4", None, 32, "0-15,64-79"),  # whole NUMA node 0
    ("epyc-nps4", None, 16, "0-7,64-71"),  # whole L3 0
    # epyc-2s-768: 12 L3 of 16 cores per socket, siblings i and i+384.
    ("epyc-2s-768", "0-191,384-575", 190, "0-94,384-478"),  # 5 whole L3, then 15 cores
    ("epyc-2s-768", None, 384, "0-191,384-575"),  # whole NUMA node 0
    # vm-1cpu
    ("vm-1cpu", None, 1, "0"),
    # offline-holes: cores {0,8} {1,9} {2,10} {3,11} {4} {5} {14}; 1 CPU per core declared
    # partial L3 gives 4 CPUs, so whole free cores in sortCores order: (count, id) puts the
    # single-thread cores 4 and 5 (siblings offline) before core 0
    ("offline-holes", None, 2, "4-5"),
    ("offline-holes", None, 11, "0-5,8-11,14"),
]


@pytest.mark.parametrize(("fixture", "available", "count", "expected"), CASES)
def test_exact_answers(fixture: str, available: str | None, count: int, expected: str) -> None:
    topo = discover_from_root(FIXTURES / fixture)
    candidates = topo.all_cpus if available is None else CPUSet.parse(available)
    assert take_cpus(topo, candidates, count).format() == expected


def test_full_pcpus_only_on_hybrid() -> None:
    topo = discover_from_root(FIXTURES / "intel-hybrid")
    # P-cores have 2 threads, E-cores 1: whole cores of two threads cannot be promised.
    options = AllocationOptions(full_pcpus_only=True)
    got = take_cpus(topo, CPUSet.parse("0-15"), 4, options)
    assert got == CPUSet.parse("0-3")
