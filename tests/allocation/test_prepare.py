"""The prepare decision in individual and grouped numanode/socket mode (behavior.md §8.1,
§8.2, §8.5, §8.6)."""

from __future__ import annotations

import json

import pytest
from builders import (
    DeviceNames,
    allocation_store,
    claim,
    commit,
    cs,
    grid,
    plan,
    prepare_error,
    prepared_device,
    result,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from dracpu.allocation.opaque import DeviceConfig
from dracpu.allocation.options import AllocationOptions
from dracpu.allocation.prepare import PrepareError
from dracpu.allocation.store import AllocationStore, ClaimRecord
from dracpu.cpuset import CPUSet

# 8 CPUs, 2 sockets = 2 NUMA nodes = 2 L3s; siblings (0,4),(1,5) on socket 0, (2,6),(3,7) on 1.
TOPO = grid(2, 1, 2, threads=2, cores_per_l3=2)
# 8 CPUs, 1 socket of 2 NUMA nodes (0-1,4-5 and 2-3,6-7).
TOPO_1S = grid(1, 2, 2, threads=2, cores_per_l3=2)
# §6.2 naming of TOPO: siblings get consecutive names.
INDIVIDUAL = {f"cpudev{i:03d}": cpu for i, cpu in enumerate([0, 4, 1, 5, 2, 6, 3, 7])}
IND = DeviceNames("individual", cpu_of_device=INDIVIDUAL)
NUMA = DeviceNames("grouped", "numanode", group_of_device={"cpudevnuma000": 0, "cpudevnuma001": 1})
SOCKET = DeviceNames("grouped", "socket", group_of_device={"cpudevsocket000": 0})


# -- individual mode (§8.1) ------------------------------------------------------------------


def test_individual_no_allocation() -> None:
    assert (
        prepare_error(claim("u1", allocated=False), IND, allocation_store(TOPO), TOPO)
        == "claim default/claim-u1 has no allocation"
    )


def test_individual_unknown_device() -> None:
    c = claim("u1", result("cpudev000"), result("cpudev999"))
    assert (
        prepare_error(c, IND, allocation_store(TOPO), TOPO)
        == 'device "cpudev999" not found in device to CPU ID map'
    )


def test_individual_results_of_other_drivers_are_ignored() -> None:
    st = allocation_store(TOPO)
    p = plan(claim("u1", result("gpu0", driver="gpu.example.com")), IND, st, TOPO)
    assert p.is_empty
    assert p.cpus == CPUSet()
    assert p.devices == ()
    assert commit(st, p) is False
    assert len(st) == 0


def test_individual_prepare_commit_and_reprepare() -> None:
    st = allocation_store(TOPO)
    c = claim(
        "u1", result("cpudev000"), result("cpudev001", request=""), result("gpu0", driver="x")
    )
    p = plan(c, IND, st, TOPO)
    assert p.cpus == cs("0,4")
    assert p.claim_uid == "u1"
    assert p.devices == (prepared_device("cpudev000"), prepared_device("cpudev001", request=""))
    assert p.already_prepared is False
    assert p.record == ClaimRecord(
        uid="u1", namespace="default", name="claim-u1", cpus=cs("0,4"), devices=p.devices
    )
    assert commit(st, p) is True
    assert st.shared_pool == cs("1-3,5-7")
    again = plan(c, IND, st, TOPO)
    assert again.already_prepared is True
    assert again.cpus == cs("0,4")
    assert again.devices == p.devices
    assert commit(st, again) is False
    assert st.shared_pool == cs("1-3,5-7")


def test_individual_already_prepared_with_different_cpus() -> None:
    st = allocation_store(TOPO)
    commit(st, plan(claim("u1", result("cpudev000"), result("cpudev001")), IND, st, TOPO))
    assert prepare_error(claim("u1", result("cpudev000"), result("cpudev002")), IND, st, TOPO) == (
        "claim default/claim-u1 is already prepared with different CPUs 0,4 (requested 0-1)"
    )


def test_individual_overlap_with_other_claims() -> None:
    st = allocation_store(TOPO)
    commit(st, plan(claim("other", result("cpudev002")), IND, st, TOPO))
    c = claim("u1", result("cpudev000"), result("cpudev002"))
    assert (
        prepare_error(c, IND, st, TOPO)
        == "claim default/claim-u1 has overlapping device assignment with other claims"
    )


def test_individual_capacity_is_not_checked_but_reported_for_metadata() -> None:
    p = plan(
        claim("u1", result("cpudev000", "1"), result("cpudev001", "bogus")),
        IND,
        allocation_store(TOPO),
        TOPO,
    )
    assert p.devices == (prepared_device("cpudev000", allocated=1), prepared_device("cpudev001"))


# -- grouped numanode / socket (§8.2) ----------------------------------------------------------


def test_grouped_no_allocation() -> None:
    assert (
        prepare_error(claim("u1", allocated=False), NUMA, allocation_store(TOPO), TOPO)
        == "claim default/claim-u1 has no allocation"
    )


@pytest.mark.parametrize(
    ("capacity", "message"),
    [
        (None, 'CPU capacity "dra.cpu/cpu" for device "cpudevnuma000" is missing'),
        ("0", 'CPU capacity for device "cpudevnuma000" must be positive, got 0'),
        ("000", 'CPU capacity for device "cpudevnuma000" must be positive, got 000'),
        ("-1", 'CPU capacity for device "cpudevnuma000" must be positive, got -1'),
        ("-500m", 'CPU capacity for device "cpudevnuma000" must be positive, got -500m'),
        ("500m", 'CPU capacity for device "cpudevnuma000" must be a whole number, got 500m'),
        ("1500m", 'CPU capacity for device "cpudevnuma000" must be a whole number, got 1500m'),
        (
            "lots",
            'CPU capacity for device "cpudevnuma000" is not a quantity: invalid quantity "lots": '
            "quantities must match the regular expression "
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        ),
    ],
)
def test_grouped_capacity_errors(capacity: str | None, message: str) -> None:
    st = allocation_store(TOPO)
    assert prepare_error(claim("u1", result("cpudevnuma000", capacity)), NUMA, st, TOPO) == message
    assert len(st) == 0


@pytest.mark.parametrize("capacity", ["2", "02", "2000m", "2e0", "+2", "0.002k"])
def test_grouped_capacity_spellings_agree(capacity: str) -> None:
    # Plain digits take a short path past the quantity parser: same answer either way.
    p = plan(claim("u1", result("cpudevnuma001", capacity)), NUMA, allocation_store(TOPO), TOPO)
    assert p.cpus == cs("2,6")
    assert p.devices == (prepared_device("cpudevnuma001", allocated=2),)


def test_grouped_capacity_in_milli_units() -> None:
    p = plan(claim("u1", result("cpudevnuma001", "2000m")), NUMA, allocation_store(TOPO), TOPO)
    assert p.cpus == cs("2,6")
    assert p.devices == (prepared_device("cpudevnuma001", allocated=2),)


def test_grouped_unknown_group_device() -> None:
    assert prepare_error(
        claim("u1", result("cpudevsocket000", "1")), NUMA, allocation_store(TOPO), TOPO
    ) == ("no valid NUMA node ID found for device cpudevsocket000")
    assert prepare_error(
        claim("u1", result("cpudevnuma000", "1")), SOCKET, allocation_store(TOPO_1S), TOPO_1S
    ) == ("no valid socket ID found for device cpudevnuma000")


def test_grouped_capacity_is_checked_before_the_group() -> None:
    assert prepare_error(claim("u1", result("nope", "0")), NUMA, allocation_store(TOPO), TOPO) == (
        'CPU capacity for device "nope" must be positive, got 0'
    )


def test_grouped_numa_pick_and_commit() -> None:
    st = allocation_store(TOPO, "0")
    p = plan(claim("u1", result("cpudevnuma000", "2")), NUMA, st, TOPO)
    # CPU 0 is reserved, so the free whole core of node 0 is 1,5
    assert p.cpus == cs("1,5")
    assert p.devices == (prepared_device("cpudevnuma000", allocated=2),)
    assert p.record.options == {}
    assert commit(st, p) is True
    assert st.prepared == cs("1,5")


def test_grouped_two_results_on_one_group_get_disjoint_cpus() -> None:
    c = claim(
        "u1", result("cpudevnuma000", "2", request="a"), result("cpudevnuma000", "2", request="b")
    )
    p = plan(c, NUMA, allocation_store(TOPO), TOPO)
    assert p.cpus == cs("0-1,4-5")
    assert p.devices == (
        prepared_device("cpudevnuma000", "a", allocated=2),
        prepared_device("cpudevnuma000", "b", allocated=2),
    )


def test_grouped_results_on_two_groups() -> None:
    c = claim("u1", result("cpudevnuma000", "1"), result("cpudevnuma001", "3", request="more"))
    assert plan(c, NUMA, allocation_store(TOPO), TOPO).cpus == cs("0,2-3,6")


def test_grouped_other_claims_are_not_candidates() -> None:
    st = allocation_store(TOPO)
    commit(st, plan(claim("first", result("cpudevnuma000", "2")), NUMA, st, TOPO))
    p = plan(claim("second", result("cpudevnuma000", "2")), NUMA, st, TOPO)
    assert p.cpus == cs("1,5")
    assert prepare_error(
        claim("third", result("cpudevnuma000", "1")), NUMA, allocation_store(TOPO, "0-1,4-5"), TOPO
    ) == ("not enough cpus available to satisfy request: requested=1, available=0")


def test_grouped_allocator_failure_reserves_nothing() -> None:
    st = allocation_store(TOPO)
    c = claim("u1", result("cpudevnuma000", "3"), result("cpudevnuma000", "2", request="x"))
    assert prepare_error(c, NUMA, st, TOPO) == (
        "not enough cpus available to satisfy request: requested=2, available=1"
    )
    assert prepare_error(claim("u1", result("cpudevnuma001", "5")), NUMA, st, TOPO) == (
        "not enough cpus available to satisfy request: requested=5, available=4"
    )
    assert len(st) == 0
    assert st.shared_pool == cs("0-7")


def test_grouped_socket_mode_uses_the_whole_socket() -> None:
    st = allocation_store(TOPO_1S)
    p = plan(claim("u1", result("cpudevsocket000", "3")), SOCKET, st, TOPO_1S)
    assert p.cpus == cs("0-1,4")


def test_grouped_idempotent_even_for_another_group() -> None:
    st = allocation_store(TOPO)
    commit(st, plan(claim("u1", result("cpudevnuma000", "2")), NUMA, st, TOPO))
    again = plan(claim("u1", result("cpudevnuma001", "4")), NUMA, st, TOPO)
    assert again.already_prepared is True
    assert again.cpus == cs("0,4")
    assert again.devices == (prepared_device("cpudevnuma001", allocated=4),)
    # idempotency comes before every check of the results
    assert plan(claim("u1", result("cpudevnuma000", None)), NUMA, st, TOPO).cpus == cs("0,4")


def test_grouped_no_results_for_this_driver() -> None:
    p = plan(
        claim("u1", result("gpu", "1", driver="gpu.example.com")),
        NUMA,
        allocation_store(TOPO),
        TOPO,
    )
    assert p.is_empty
    assert p.cpus == CPUSet()


OPTS = {"apiVersion": "dra.cpu/v1alpha1", "kind": "AllocationOptions"}


def opts(
    source: str = "FromClaim", requests: tuple[str, ...] = (), **fields: object
) -> DeviceConfig:
    return DeviceConfig(
        source=source,
        requests=requests,
        driver="dra.cpu",
        parameters=json.dumps({**OPTS, **fields}).encode(),
    )


def test_grouped_allocation_options_feed_the_allocator() -> None:
    spread = opts(requests=("a",), strategy="spread", preferAlignByUncoreCache=False)
    c = claim(
        "u1",
        result("cpudevnuma000", "2", request="a"),
        result("cpudevnuma001", "2", request="b"),
        configs=(spread,),
    )
    p = plan(c, NUMA, allocation_store(TOPO), TOPO)
    # "a" is spread over two cores (0,1), "b" packed onto one core (2,6)
    assert p.cpus == cs("0-2,6")
    assert p.record.options == {
        "a": AllocationOptions(strategy="spread", prefer_align_by_uncore_cache=False)
    }


def test_grouped_allocation_options_errors_are_claim_errors() -> None:
    c = claim("u1", result("cpudevnuma000", "1"), configs=(opts(fullPCPUsOnly=True),))
    assert prepare_error(c, NUMA, allocation_store(TOPO), TOPO) == (
        "fullPCPUsOnly: requested 1 CPUs is not a multiple of 2 threads per core"
    )
    c = claim("u1", result("cpudevnuma000", "1"), configs=(opts(fullPCPUsOnly=1),))
    assert prepare_error(c, NUMA, allocation_store(TOPO), TOPO) == (
        "invalid allocation options: Expected `bool`, got `int` - at `$.fullPCPUsOnly`"
    )


def test_grouped_cpuset_overrides_are_ignored_outside_machine_mode() -> None:
    override = DeviceConfig(
        source="FromClass",
        driver="dra.cpu",
        parameters=b'{"apiVersion": "v1alpha1", "cpuConfig": {"cpuset": "7"}}',
    )
    p = plan(
        claim("u1", result("cpudevnuma000", "1"), configs=(override, override)),
        NUMA,
        allocation_store(TOPO),
        TOPO,
    )
    assert p.cpus == cs("0")


# -- carrying a plan out with the state owner (§8.6, §8.7) ----------------------------------


def test_commit_of_a_stale_plan_is_refused_by_the_store() -> None:
    st = allocation_store(TOPO)
    first = plan(claim("a", result("cpudevnuma000", "2")), NUMA, st, TOPO)
    second = plan(claim("b", result("cpudevnuma000", "2")), NUMA, st, TOPO)
    commit(st, first)
    with pytest.raises(PrepareError) as info:
        commit(st, second)
    assert str(info.value) == 'claim "b" has overlapping CPU assignment "0,4"'
    assert st.cpus_of("b") is None


# -- property: many claims through plan + commit ---------------------------------------------

BIG = grid(2, 2, 4, threads=2, cores_per_l3=2)  # 32 CPUs, 4 NUMA nodes of 8
BIG_NUMA = DeviceNames(
    "grouped", "numanode", group_of_device={f"cpudevnuma{n:03d}": n for n in range(4)}
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5)), min_size=1, max_size=3),
        max_size=8,
    ),
    st.sets(st.integers(0, 31), max_size=4),
)
def test_claims_never_share_cpus_and_stay_in_their_group(
    claims: list[list[tuple[int, int]]], reserved: set[int]
) -> None:
    st_ = AllocationStore(BIG.all_cpus - CPUSet(reserved), CPUSet(reserved))
    taken: dict[str, CPUSet] = {}
    for i, wanted in enumerate(claims):
        results = [
            result(f"cpudevnuma{n:03d}", str(k), request=f"r{j}") for j, (n, k) in enumerate(wanted)
        ]
        c = claim(f"c{i}", *results)
        pool_before = st_.shared_pool
        try:
            p = plan(c, BIG_NUMA, st_, BIG)
        except PrepareError as exc:
            assert str(exc).startswith("not enough cpus available to satisfy request: ")
            assert st_.shared_pool == pool_before
            continue
        assert len(p.cpus) == sum(k for _, k in wanted)
        allowed = CPUSet.from_mask(0)
        for n, _ in wanted:
            allowed |= BIG.by_numa[n]
        assert p.cpus <= allowed & pool_before
        assert commit(st_, p) is True
        taken[c.uid] = p.cpus
    seen = CPUSet()
    for uid, cpus in taken.items():
        assert cpus.isdisjoint(seen)
        assert cpus.isdisjoint(CPUSet(reserved))
        seen |= cpus
        assert st_.release(uid) == cpus
    assert st_.shared_pool == BIG.all_cpus - CPUSet(reserved)
