"""AllocationStore, ClaimTracker and ContainerState (behavior.md §8.7, §12)."""

from __future__ import annotations

import pytest
from builders import cs

from dracpu.allocation.store import (
    AllocationStore,
    ClaimRecord,
    ClaimTracker,
    ContainerRecord,
    ContainerState,
    Owner,
    OwnerError,
    StoreError,
    StoreSnapshot,
)
from dracpu.cpuset import CPUSet


def rec(uid: str, cpus: str) -> ClaimRecord:
    return ClaimRecord(uid=uid, cpus=cs(cpus))


def store8(reserved: str = "") -> AllocationStore:
    return AllocationStore(cs("0-7") - cs(reserved), cs(reserved))


def test_empty_store() -> None:
    store = store8("0-1")
    assert store.available == cs("2-7")
    assert store.reserved == cs("0-1")
    assert store.prepared == CPUSet()
    assert store.shared_pool == cs("2-7")
    assert store.snapshot() == StoreSnapshot(allocated=0, available=6, reserved=2, active=0)
    assert len(store) == 0
    assert store.get("a") is None
    assert store.cpus_of("a") is None


def test_reserved_is_never_in_the_pool_even_when_passed_as_available() -> None:
    store = AllocationStore(cs("0-7"), cs("0,9"))
    assert store.available == cs("1-7")
    assert store.shared_pool == cs("1-7")
    # the reserved gauge counts the configured set, CPUs outside the machine included
    assert store.snapshot().reserved == 2
    with pytest.raises(StoreError) as info:
        store.reserve(rec("a", "0-1"))
    assert str(info.value) == 'claim "a" has overlapping CPU assignment "0-1"'


def test_reserve_release_and_pool() -> None:
    store = store8("0")
    assert store.reserve(rec("a", "1-2")) is True
    assert store.reserve(rec("b", "4,6")) is True
    assert store.prepared == cs("1-2,4,6")
    assert store.shared_pool == cs("3,5,7")
    assert store.snapshot() == StoreSnapshot(allocated=4, available=3, reserved=1, active=2)
    assert "a" in store
    assert [r.uid for r in store.records()] == ["a", "b"]
    assert store.release("a") == cs("1-2")
    assert store.release("a") == CPUSet()
    assert store.shared_pool == cs("1-3,5,7")
    assert store.snapshot() == StoreSnapshot(allocated=2, available=5, reserved=1, active=1)


def test_reserve_same_cpus_again_is_a_noop() -> None:
    store = store8()
    first = ClaimRecord(uid="a", cpus=cs("0-1"), namespace="ns", name="n")
    assert store.reserve(first) is True
    assert store.reserve(rec("a", "0-1")) is False
    assert store.get("a") is first


def test_reserve_conflicts() -> None:
    store = store8()
    store.reserve(rec("a", "0-3"))
    with pytest.raises(StoreError) as info:
        store.reserve(rec("a", "0-1"))
    assert str(info.value) == 'claim "a" is already prepared with CPUs "0-3" (requested "0-1")'
    with pytest.raises(StoreError) as info:
        store.reserve(rec("b", "3-4"))
    assert str(info.value) == 'claim "b" has overlapping CPU assignment "3-4"'
    with pytest.raises(StoreError) as info:
        store.reserve(rec("c", "7-8"))
    assert str(info.value) == 'claim "c" has overlapping CPU assignment "7-8"'
    assert store.prepared == cs("0-3")
    assert len(store) == 1


def test_validate() -> None:
    store = store8()
    store.reserve(rec("A", "0-1"))
    store.validate({"A": cs("0-1")})
    store.validate({})
    with pytest.raises(StoreError) as info:
        store.validate({"A": cs("0-1"), "B": cs("2")})
    assert str(info.value) == 'claim "B" is not prepared by this driver'
    with pytest.raises(StoreError) as info:
        store.validate({"A": cs("0-3")})
    assert str(info.value) == (
        'validation failed for claim "A": cpuset mismatch (expected "0-1", got "0-3")'
    )
    with pytest.raises(StoreError) as info:
        store.validate({"A": CPUSet()})
    assert str(info.value) == (
        'validation failed for claim "A": cpuset mismatch (expected "0-1", got "")'
    )


def test_tracker_binds_and_reports_new_owners() -> None:
    tracker = ClaimTracker()
    assert tracker.set_owner("pod1", "app", ["a", "b"]) == ["a", "b"]
    # a restarted container with the same name in the same pod keeps its claims
    assert tracker.set_owner("pod1", "app", ["a", "b"]) == []
    assert tracker.set_owner("pod1", "app", ["b", "c"]) == ["c"]
    assert tracker.owner_of("a") == Owner("pod1", "app")
    assert tracker.owners() == {
        "a": Owner("pod1", "app"),
        "b": Owner("pod1", "app"),
        "c": Owner("pod1", "app"),
    }


def test_tracker_refuses_a_second_container_and_binds_nothing() -> None:
    tracker = ClaimTracker()
    tracker.set_owner("pod1", "app", ["a"])
    for pod, name in [("pod1", "sidecar"), ("pod2", "app")]:
        with pytest.raises(OwnerError) as info:
            tracker.set_owner(pod, name, ["new", "a"])
        assert str(info.value) == 'claimUID "a" already bound to pod "pod1" container "app"'
    assert tracker.owner_of("new") is None


def test_tracker_errors_and_release() -> None:
    tracker = ClaimTracker()
    with pytest.raises(OwnerError) as info:
        tracker.set_owner("pod1", "app", [])
    assert str(info.value) == "no claims to bind"
    tracker.set_owner("pod1", "app", ["a", "b"])
    tracker.release(["a", "unknown"])
    assert tracker.owner_of("a") is None
    assert tracker.set_owner("pod2", "x", ["a"]) == ["a"]
    assert tracker.owner_of("b") == Owner("pod1", "app")


def ctr(pod: str, name: str, cid: str, *claims: str) -> ContainerRecord:
    return ContainerRecord(pod_uid=pod, name=name, container_id=cid, claim_uids=claims)


def test_container_state_set_replace_and_shared_set() -> None:
    state = ContainerState()
    assert state.set(ctr("p1", "s", "c1")) is None
    assert state.set(ctr("p2", "s", "c2")) is None
    assert state.set(ctr("p1", "g", "c3", "A")) is None
    assert state.shared_container_ids() == ["c1", "c2"]
    assert len(state) == 3
    # a new container of the same (pod, name) replaces the old one and its shared entry
    old = state.set(ctr("p1", "s", "c4", "B"))
    assert old == ctr("p1", "s", "c1")
    assert state.shared_container_ids() == ["c2"]
    assert state.get("p1", "s") == ctr("p1", "s", "c4", "B")
    assert state.set(ctr("p1", "g", "c5")) == ctr("p1", "g", "c3", "A")
    assert state.shared_container_ids() == ["c2", "c5"]
    assert sorted(r.container_id for r in state) == ["c2", "c4", "c5"]


def test_container_state_removal_needs_the_runtime_id() -> None:
    state = ContainerState()
    state.set(ctr("p1", "s", "c1"))
    state.set(ctr("p1", "s", "c2"))
    assert state.remove("p1", "s", "c1") is None  # stale event for the old container
    assert state.remove("p1", "other", "c2") is None
    assert state.remove("p9", "s", "c2") is None
    assert state.remove("p1", "s", "c2") == ctr("p1", "s", "c2")
    assert state.get("p1", "s") is None
    assert state.shared_container_ids() == []
    assert len(state) == 0
    assert state.remove("p1", "s", "c2") is None


def test_container_record_is_shared() -> None:
    assert ctr("p", "n", "c").is_shared is True
    assert ctr("p", "n", "c", "A").is_shared is False


def test_container_state_knows_containers_by_runtime_id() -> None:
    state = ContainerState()
    state.set(ctr("p1", "s", "c1"))
    state.set(ctr("p1", "g", "c2", "A"))
    assert "c1" in state and "c2" in state and "c9" not in state
    state.set(ctr("p1", "s", "c3"))  # replaces c1
    assert "c1" not in state and "c3" in state
    state.set(ctr("p1", "s", "c3"))  # the same container again stays known
    assert "c3" in state
    state.remove("p1", "g", "c2")
    assert "c2" not in state
    assert {r.container_id for r in state} == {"c3"}
