"""The allocator over every checked-in sysfs tree (``tests/fake_sysfs``).

Expectations are structural, reasoned from §9 rather than pasted: with every CPU free, a
request of one NUMA node's size returns a whole NUMA node, one socket's size a whole socket,
two CPUs on an SMT machine one whole core.
"""

from __future__ import annotations

import pytest
from builders import FAKE_SYSFS, machine
from golden_cases import FIXTURE_NAMES

from dracpu.allocation import take_cpus

MACHINES = sorted(p.name for p in FAKE_SYSFS.iterdir() if p.is_dir())


def test_the_trees_include_every_shape_of_the_golden_answers() -> None:
    # A wrong path would leave nothing to parametrize over: the test below would not fail.
    assert set(FIXTURE_NAMES) <= set(MACHINES)


@pytest.mark.parametrize("name", MACHINES)
def test_fixture_basic_requests(name: str) -> None:
    topo = machine(name)
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
