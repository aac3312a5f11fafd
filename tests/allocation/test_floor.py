"""The shared pool's floor (allocation/floor.py) and the store's refusal to empty the pool."""

from __future__ import annotations

import dataclasses

import pytest
from builders import cs, grid

from dracpu.allocation.floor import shared_floor, unpublished_cpus
from dracpu.allocation.store import AllocationStore, ClaimRecord, StoreError


def test_empty_reservation_keeps_the_core_of_the_lowest_cpu() -> None:
    topo = grid(1, 1, 4)  # CPUs 0-7, core g = CPUs g and g+4
    floor = shared_floor(topo, cs(""))
    assert floor.kept and floor.cpus == cs("0,4")
    assert "CPUs 0,4 (one core) stay in the shared pool" in floor.describe()


def test_reserved_cpus_of_this_node_are_the_floor() -> None:
    topo = grid(1, 1, 4)
    floor = shared_floor(topo, cs("2,200"))  # 200 is not on this node
    assert not floor.kept and floor.cpus == cs("2")
    assert floor.describe() == "reservedCPUs 2 stay in the shared pool"


def test_a_reservation_outside_the_node_or_isolated_still_keeps_a_core() -> None:
    topo = dataclasses.replace(grid(1, 1, 4), isolated=cs("0-1,4-5"))
    assert shared_floor(topo, cs("200")).cpus == cs("2,6")
    assert shared_floor(topo, cs("0")).cpus == cs("2,6")  # isolated: the kernel never balances


def test_a_node_whose_every_cpu_is_isolated_has_no_floor() -> None:
    topo = dataclasses.replace(grid(1, 1, 2), isolated=cs("0-3"))
    assert not shared_floor(topo, cs("")).cpus


def test_unpublished_cpus() -> None:
    topo = dataclasses.replace(grid(1, 1, 4), isolated=cs("3,7"))
    floor = shared_floor(topo, cs(""))
    assert unpublished_cpus(topo, cs(""), floor, publish_isolated=False) == cs("0,3-4,7")
    assert unpublished_cpus(topo, cs("1"), floor, publish_isolated=True) == cs("0-1,4")


def test_floor_cpus_are_shared_never_allocatable() -> None:
    store = AllocationStore(cs("0-7"), cs(""), floor=cs("0,4"))
    assert store.available == cs("1-3,5-7")
    assert store.shared_pool == cs("0-7")
    store.reserve(ClaimRecord(uid="a", cpus=cs("1-3,5-7")), pending=True)
    store.commit("a")
    assert store.shared_pool == cs("0,4")
    with pytest.raises(StoreError, match="overlapping"):
        store.reserve(ClaimRecord(uid="b", cpus=cs("0")), pending=True)


def test_offline_floor_cpus_leave_the_pool() -> None:
    store = AllocationStore(cs("0-7"), cs(""), floor=cs("0,4"))
    assert store.set_offline(cs("4"))
    assert store.shared_pool == cs("0-3,5-7")


def test_a_prepare_that_would_empty_the_pool_fails_naming_the_claim_and_counts() -> None:
    store = AllocationStore(cs("0-7"), cs(""), floor=cs("0"))
    store.set_offline(cs("0"))  # the floor went offline: only the guard is left
    store.reserve(ClaimRecord(uid="a", cpus=cs("1-4")), pending=True)  # pending counts
    last = ClaimRecord(uid="u1", namespace="team", name="all", cpus=cs("5-7"))
    with pytest.raises(StoreError) as err:
        store.reserve(last, pending=True)
    assert str(err.value).startswith(
        "prepare of claim team/all would empty the shared pool: it takes 3 of the 3 shared "
        "CPUs and containers without a claim need at least one"
    )
    assert store.free == cs("5-7")  # nothing was kept for the refused claim
    # One CPU left shared is enough.
    assert store.reserve(ClaimRecord(uid="b", cpus=cs("5-6")), pending=True)


def test_a_claim_without_a_name_is_named_by_uid_and_restores_are_never_refused() -> None:
    store = AllocationStore(cs("0-3"), cs(""))
    with pytest.raises(StoreError, match=r"^prepare of claim uid-1 would empty"):
        store.reserve(ClaimRecord(uid="uid-1", cpus=cs("0-3")), pending=True)
    # A claim from the checkpoint or a running container already runs: it is taken as is.
    assert store.reserve(ClaimRecord(uid="uid-1", cpus=cs("0-3")))
    assert not store.shared_pool


def test_the_kept_core_skips_cores_that_claims_already_hold() -> None:
    topo = grid(1, 1, 4)
    assert shared_floor(topo, cs(""), held=cs("4")).cpus == cs("1,5")
    floor = shared_floor(topo, cs(""), held=cs("0-7"))
    assert floor.kept and not floor.cpus
    assert "nothing keeps the shared pool from emptying" in floor.describe()


def test_reserved_cpus_offline_at_start_are_still_the_floor() -> None:
    # CPU 7 is present but offline: reserving it keeps it out of claims for good, and it
    # joins the shared pool when it comes online.
    topo = dataclasses.replace(grid(1, 1, 4, online=cs("0-6")), present=cs("0-7"))
    floor = shared_floor(topo, cs("7"))
    assert not floor.kept and floor.cpus == cs("7")


def test_a_claim_that_takes_no_shared_cpu_is_never_refused() -> None:
    # The floor is offline and claims hold every other shared CPU: a claim of an isolated
    # CPU takes nothing from containers without a claim.
    store = AllocationStore(cs("0-7"), cs(""), isolated=cs("7"), floor=cs("0"))
    store.set_offline(cs("0"))
    store.reserve(ClaimRecord(uid="a", cpus=cs("1-5")))
    assert store.shared_pool == cs("6")
    store.reserve(ClaimRecord(uid="b", cpus=cs("6")))  # adopted from a running container
    assert not store.shared_pool
    assert store.reserve(ClaimRecord(uid="c", cpus=cs("7")), pending=True)


def test_unpublished_cpus_are_cpus_of_this_node() -> None:
    # A reservation naming CPUs the node does not have (70-200 on 8 CPUs) counts only
    # those it has: the demo sizes its built-in claims by this count.
    topo = grid(1, 1, 4)
    assert unpublished_cpus(topo, cs("6-200"), publish_isolated=True) == cs("6-7")
