"""Stateful property test of the allocation store and the claim tracker together."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from dracpu.allocation.store import (
    AllocationStore,
    ClaimRecord,
    ClaimTracker,
    Owner,
    OwnerError,
    StoreError,
)
from dracpu.cpuset import CPUSet

NCPUS = 16
# Small sets (ids a little beyond the machine too) so that many reservations fit.
cpusets = st.frozensets(st.integers(min_value=0, max_value=NCPUS + 1), max_size=5).map(CPUSet)
owners = st.tuples(st.sampled_from(["p1", "p2", "p3"]), st.sampled_from(["a", "b"]))


class StoreMachine(RuleBasedStateMachine):
    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.store = AllocationStore(CPUSet(), CPUSet())
        self.tracker = ClaimTracker()
        self.model: dict[str, CPUSet] = {}
        self.model_owners: dict[str, Owner] = {}
        self.next_uid = 0
        self.allocatable = CPUSet()

    @initialize(reserved=cpusets)
    def setup(self, reserved: CPUSet) -> None:
        topology = CPUSet.range(0, NCPUS - 1)
        self.allocatable = topology - reserved
        self.store = AllocationStore(self.allocatable, reserved)

    @rule(target=claims, cpus=cpusets)
    def prepare(self, cpus: CPUSet) -> str:
        uid = f"uid-{self.next_uid}"
        self.next_uid += 1
        fits = cpus <= self.allocatable - self.store.prepared
        try:
            changed = self.store.reserve(ClaimRecord(uid=uid, cpus=cpus))
        except StoreError as exc:
            assert not fits
            assert str(exc) == f'claim "{uid}" has overlapping CPU assignment "{cpus}"'
            return uid
        assert fits and changed
        self.model[uid] = cpus
        return uid

    @rule(uid=claims)
    def re_reserve_same(self, uid: str) -> None:
        if uid in self.model:
            before = self.store.prepared
            assert self.store.reserve(ClaimRecord(uid=uid, cpus=self.model[uid])) is False
            assert self.store.prepared == before

    @rule(uid=claims, cpus=cpusets)
    def re_reserve_other(self, uid: str, cpus: CPUSet) -> None:
        if uid not in self.model or cpus == self.model[uid]:
            return
        try:
            self.store.reserve(ClaimRecord(uid=uid, cpus=cpus))
        except StoreError as exc:
            assert str(exc) == (
                f'claim "{uid}" is already prepared with CPUs "{self.model[uid]}" '
                f'(requested "{cpus}")'
            )
        else:
            raise AssertionError("re-reserving other CPUs must fail")

    @rule(uid=claims, owner=owners)
    def bind(self, uid: str, owner: tuple[str, str]) -> None:
        current = self.model_owners.get(uid)
        try:
            new = self.tracker.set_owner(owner[0], owner[1], [uid])
        except OwnerError:
            assert current is not None and current != Owner(*owner)
            return
        assert new == ([] if current is not None else [uid])
        self.model_owners[uid] = Owner(*owner)

    @rule(uid=consumes(claims))
    def unprepare(self, uid: str) -> None:
        released = self.store.release(uid)
        self.tracker.release([uid])
        assert released == self.model.pop(uid, CPUSet())
        self.model_owners.pop(uid, None)

    @rule(uid=claims)
    def validate(self, uid: str) -> None:
        if uid in self.model:
            self.store.validate({uid: self.model[uid]})
        else:
            try:
                self.store.validate({uid: CPUSet()})
            except StoreError as exc:
                assert str(exc) == f'claim "{uid}" is not prepared by this driver'
            else:
                raise AssertionError("validating an unknown claim must fail")

    @invariant()
    def no_cpu_in_two_claims(self) -> None:
        seen = 0
        for record in self.store.records():
            assert seen & record.cpus.mask == 0
            seen |= record.cpus.mask
        assert CPUSet.from_mask(seen) == self.store.prepared

    @invariant()
    def reserved_never_in_a_claim_or_the_pool(self) -> None:
        assert self.store.prepared.isdisjoint(self.store.reserved)
        assert self.store.shared_pool.isdisjoint(self.store.reserved)

    @invariant()
    def pool_and_claims_partition_the_allocatable(self) -> None:
        assert self.store.shared_pool.isdisjoint(self.store.prepared)
        assert self.store.shared_pool | self.store.prepared == self.allocatable

    @invariant()
    def matches_the_model(self) -> None:
        assert {r.uid: r.cpus for r in self.store.records()} == self.model
        assert self.tracker.owners() == self.model_owners
        snap = self.store.snapshot()
        assert snap.active == len(self.model)
        assert snap.allocated + snap.available == len(self.allocatable)


StoreMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestStoreMachine = StoreMachine.TestCase
