"""Prepare planning against the real device inventory on a real machine layout."""

from __future__ import annotations

from pathlib import Path

from builders import claim, commit, plan, prepare_error, result
from owner_steps import prepare as prepare_claim

from dracpu.allocation.store import AllocationStore
from dracpu.cpuset import CPUSet
from dracpu.devices import DeviceSettings, build_inventory
from dracpu.state import NodeState
from dracpu.topology import discover_from_root

XEON_SNC = Path(__file__).resolve().parent.parent / "fake_sysfs" / "xeon-snc"


def test_grouped_numa_claims_get_disjoint_aligned_cpus() -> None:
    topo = discover_from_root(XEON_SNC)
    reserved = CPUSet.parse("0,40")
    inv = build_inventory(topo, DeviceSettings(reserved=reserved))
    store = AllocationStore(topo.all_cpus - reserved, reserved)
    first = plan(claim("a", result("cpudevnuma001", "4")), inv, store, topo)
    assert first.cpus == CPUSet.parse("10-11,50-51")
    assert commit(store, first) is True
    second = plan(claim("b", result("cpudevnuma001", "4")), inv, store, topo)
    assert second.cpus == CPUSet.parse("12-13,52-53")
    assert prepare_error(claim("c", result("cpudevnuma000", "19")), inv, store, topo) == (
        "not enough cpus available to satisfy request: requested=19, available=18"
    )


def test_individual_devices_resolve_to_their_cpus() -> None:
    topo = discover_from_root(XEON_SNC)
    inv = build_inventory(topo, DeviceSettings(mode="individual"))
    store = AllocationStore(topo.all_cpus, CPUSet())
    results = [result(name) for name in ("cpudev000", "cpudev001")]
    assert plan(claim("i", *results), inv, store, topo).cpus == CPUSet.parse("0,40")


async def test_grouped_claims_take_isolated_cpus_first_and_keep_the_pool() -> None:
    """isolated-rt: 0-1,8-9 are the only CPUs with load balancing; 12 are isolated."""
    topo = discover_from_root(XEON_SNC.parent / "isolated-rt")
    inv = build_inventory(topo, DeviceSettings())
    state = NodeState(AllocationStore(topo.all_cpus, CPUSet(), topo.isolated))
    state.use_topology(topo, inv, topo.online)

    async def prepare(uid: str, count: str) -> CPUSet:
        outcome = await prepare_claim(state, claim(uid, result("cpudevnuma000", count)))
        assert outcome.plan is not None and outcome.new
        return outcome.plan.cpus

    assert await prepare("a", "2") == CPUSet.parse("2,10")  # isolated CPUs first
    assert await prepare("b", "10") == CPUSet.parse("3-7,11-15")  # the rest of them
    assert state.shared_pool == CPUSet.parse("0-1,8-9")  # the pool keeps balanced CPUs
    assert await prepare("c", "2") == CPUSet.parse("0,8")  # no isolated CPU left: balanced ones
    assert state.shared_pool == CPUSet.parse("1,9")
