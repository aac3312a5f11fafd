"""The allocator over every checked-in sysfs fixture (skipped until discovery exists).

Expectations are structural, reasoned from §9 rather than pasted: with every CPU free, a
request of one NUMA node's size returns a whole NUMA node, one socket's size a whole socket,
two CPUs on an SMT machine one whole core. Exact per-fixture cpusets are still to be added
once the fixture layouts are final.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from dracpu.allocation import take_cpus
from dracpu.topology.model import Topology

FIXTURES = Path(__file__).resolve().parent.parent / "fake_sysfs"
NAMES = [
    "xeon-2s-ht",
    "xeon-snc",
    "epyc-nps1",
    "epyc-nps4",
    "epyc-2s-768",
    "intel-hybrid",
    "arm-server",
    "vm-1cpu",
    "offline-holes",
]


def load(name: str) -> Topology:
    discover = getattr(importlib.import_module("dracpu.topology"), "discover_from_root", None)
    root = FIXTURES / name
    if discover is None or not root.is_dir():
        pytest.skip(f"discovery or fixture {name} not available yet")
    topo = discover(str(root))
    assert isinstance(topo, Topology)
    return topo


@pytest.mark.parametrize("name", NAMES)
def test_fixture_basic_requests(name: str) -> None:
    topo = load(name)
    everything = topo.all_cpus
    assert len(take_cpus(topo, everything, 1)) == 1
    got = take_cpus(topo, everything, topo.num_cpus)
    assert got == everything
    numa_sizes = {len(cpus) for cpus in topo.by_numa.values()}
    if len(numa_sizes) == 1:
        size = numa_sizes.pop()
        assert take_cpus(topo, everything, size) in topo.by_numa.values()
    socket_sizes = {len(cpus) for cpus in topo.by_socket.values()}
    if len(socket_sizes) == 1:
        size = socket_sizes.pop()
        assert take_cpus(topo, everything, size) in topo.by_socket.values()
    core_sizes = {len(cpus) for cpus in topo.by_core_key.values()}
    if core_sizes == {2}:
        assert take_cpus(topo, everything, 2) in topo.by_core_key.values()
