"""Prepare planning against the real device inventory on a real machine layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from dracpu.allocation.prepare import (
    AllocationResult,
    ClaimAllocation,
    PrepareError,
    plan_claim,
)
from dracpu.allocation.store import AllocationStore
from dracpu.cpuset import CPUSet
from dracpu.devices import DeviceSettings, build_inventory
from dracpu.state import NodeState
from dracpu.topology import discover_from_root

XEON_SNC = Path(__file__).resolve().parent.parent / "fake_sysfs" / "xeon-snc"


def claim(uid: str, *results: AllocationResult) -> ClaimAllocation:
    return ClaimAllocation(uid=uid, namespace="ns", name=f"c-{uid}", results=results)


def numa_result(device: str, cpus: str) -> AllocationResult:
    return AllocationResult(
        request="cpus",
        driver="dra.cpu",
        pool="node-a",
        device=device,
        consumed_capacity={"dra.cpu/cpu": cpus},
    )


def test_grouped_numa_claims_get_disjoint_aligned_cpus() -> None:
    topo = discover_from_root(XEON_SNC)
    reserved = CPUSet.parse("0,40")
    inv = build_inventory(topo, DeviceSettings(reserved=reserved))
    store = AllocationStore(topo.all_cpus - reserved, reserved)
    first = plan_claim(
        claim("a", numa_result("cpudevnuma001", "4")),
        inventory=inv,
        topology=topo,
        store=store,
        online=topo.online,
    )
    assert first.cpus == CPUSet.parse("10-11,50-51")
    state = NodeState(store)
    state.begin_prepare(first)
    state.finish_prepare(first)
    second = plan_claim(
        claim("b", numa_result("cpudevnuma001", "4")),
        inventory=inv,
        topology=topo,
        store=store,
        online=topo.online,
    )
    assert second.cpus == CPUSet.parse("12-13,52-53")
    with pytest.raises(PrepareError) as info:
        plan_claim(
            claim("c", numa_result("cpudevnuma000", "19")),
            inventory=inv,
            topology=topo,
            store=store,
            online=topo.online,
        )
    assert str(info.value) == (
        "not enough cpus available to satisfy request: requested=19, available=18"
    )


def test_individual_devices_resolve_to_their_cpus() -> None:
    topo = discover_from_root(XEON_SNC)
    inv = build_inventory(topo, DeviceSettings(mode="individual"))
    store = AllocationStore(topo.all_cpus, CPUSet())
    results = [
        AllocationResult(request="cpus", driver="dra.cpu", pool="node-a", device=name)
        for name in ("cpudev000", "cpudev001")
    ]
    plan = plan_claim(
        claim("i", *results), inventory=inv, topology=topo, store=store, online=topo.online
    )
    assert plan.cpus == CPUSet.parse("0,40")


def test_grouped_claims_take_isolated_cpus_first_and_keep_the_pool() -> None:
    """isolated-rt: 0-1,8-9 are the only CPUs with load balancing; 12 are isolated."""
    topo = discover_from_root(XEON_SNC.parent / "isolated-rt")
    inv = build_inventory(topo, DeviceSettings())
    state = NodeState(AllocationStore(topo.all_cpus, CPUSet(), topo.isolated))

    def prepare(uid: str, count: str) -> CPUSet:
        plan = plan_claim(
            claim(uid, numa_result("cpudevnuma000", count)),
            inventory=inv,
            topology=topo,
            store=state.store,
            online=topo.online,
        )
        state.begin_prepare(plan)
        state.finish_prepare(plan)
        return plan.cpus

    assert prepare("a", "2") == CPUSet.parse("2,10")  # isolated CPUs first
    assert prepare("b", "10") == CPUSet.parse("3-7,11-15")  # the rest of them
    assert state.shared_pool == CPUSet.parse("0-1,8-9")  # the pool keeps balanced CPUs
    assert prepare("c", "2") == CPUSet.parse("0,8")  # no isolated CPU left: balanced ones
    assert state.shared_pool == CPUSet.parse("1,9")
