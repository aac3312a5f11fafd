"""The owner's private steps one at a time (moved from tests/allocation/test_prepare.py when
the steps became private to ``dracpu.state``): undoing a prepare (``_abort_prepare``) drops
only what that prepare reserved, never a claim prepared before it."""

from __future__ import annotations

from builders import DeviceNames, allocation_store, claim, cs, grid, plan, result

from dracpu.allocation.store import ClaimRecord
from dracpu.state import NodeState

# 8 CPUs, 2 sockets = 2 NUMA nodes; siblings (0,4),(1,5) on socket 0, (2,6),(3,7) on 1.
TOPO = grid(2, 1, 2, threads=2, cores_per_l3=2)
NUMA = DeviceNames("grouped", "numanode", group_of_device={"cpudevnuma000": 0, "cpudevnuma001": 1})


def test_abort_of_a_new_claim_frees_its_cpus() -> None:
    st = allocation_store(TOPO)
    state = NodeState(st)
    p = plan(claim("u1", result("cpudevnuma000", "2")), NUMA, st, TOPO)
    assert state._begin_prepare(p)
    assert not state.view.free & cs("0,4")  # kept from everyone while pending
    state._abort_prepare(p)  # the CDI write failed
    assert len(state.view.claims()) == 0 and state.view.durable_claims() == []
    assert state.view.shared_pool == cs("0-7") and state.view.free == cs("0-7")


def test_abort_of_a_reprepare_keeps_the_allocation() -> None:
    st = allocation_store(TOPO)
    state = NodeState(st)
    first = plan(claim("u1", result("cpudevnuma000", "2")), NUMA, st, TOPO)
    assert state._begin_prepare(first)
    state._finish_prepare(first)
    again = plan(claim("u1", result("cpudevnuma000", "2")), NUMA, st, TOPO)
    assert state._begin_prepare(again) is False  # already prepared: nothing reserved anew
    state._abort_prepare(again)
    assert state.view.cpus_of("u1") == cs("0,4")


def test_abort_never_releases_someone_elses_cpus() -> None:
    st = allocation_store(TOPO)
    state = NodeState(st)
    p = plan(claim("u1", result("cpudevnuma000", "2")), NUMA, st, TOPO)
    state._abort_prepare(p)  # never begun: nothing to undo
    state.restore([ClaimRecord(uid="u1", cpus=cs("7"))])
    state._abort_prepare(p)
    assert state.view.cpus_of("u1") == cs("7")
    empty = plan(claim("u1"), NUMA, st, TOPO)
    state._abort_prepare(empty)
    assert state.view.cpus_of("u1") == cs("7")
