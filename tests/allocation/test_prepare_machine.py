"""The prepare decision in grouped machine mode: the opaque cpuset override (§8.3)."""

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

from dracpu.allocation.opaque import DeviceConfig
from dracpu.allocation.prepare import AllocationResult, PrepareError
from dracpu.allocation.store import ClaimRecord
from dracpu.cpuset import CPUSet

# CPUs 0-7; CPUs 8-9 are online but were skipped by discovery
TOPO = grid(2, 1, 2, threads=2, cores_per_l3=2, online=CPUSet.range(0, 9))
MACHINE = DeviceNames(group_by="machine")


def override(
    cpuset: str = "4-7",
    *,
    requests: tuple[str, ...] = ("cpus",),
    source: str = "FromClaim",
    driver: str = "dra.cpu",
) -> DeviceConfig:
    params = {"apiVersion": "v1alpha1", "cpuConfig": {"cpuset": cpuset}}
    return DeviceConfig(
        source=source, requests=requests, driver=driver, parameters=json.dumps(params).encode()
    )


def raw(params: bytes, requests: tuple[str, ...] = ("cpus",)) -> DeviceConfig:
    return DeviceConfig(source="FromClaim", requests=requests, driver="dra.cpu", parameters=params)


OPTIONS = DeviceConfig(
    source="FromClaim",
    driver="dra.cpu",
    parameters=b'{"apiVersion": "dra.cpu/v1alpha1", "kind": "AllocationOptions"}',
)


def test_behavior_example_override() -> None:
    st = allocation_store(TOPO, "0")
    p = plan(
        claim("u1", result("cpudevmachine", "4"), configs=(override("4-7"),)), MACHINE, st, TOPO
    )
    assert p.cpus == cs("4-7")
    assert p.devices == (prepared_device("cpudevmachine", allocated=4),)
    assert commit(st, p) is True
    assert st.shared_pool == cs("1-3")


def test_device_name_is_not_checked_and_sub_requests_match_their_main_request() -> None:
    c = claim("u1", result("anything", "2", request="cpus/fast"), configs=(override("2-3"),))
    assert plan(c, MACHINE, allocation_store(TOPO, "0"), TOPO).cpus == cs("2-3")


def test_override_for_all_requests_and_other_drivers_ignored() -> None:
    configs = (
        override("1", driver="gpu.example.com", source="FromClass"),
        override("5-6", requests=()),
        OPTIONS,  # options configs neither count nor get parsed in machine mode
    )
    assert plan(
        claim("u1", result("cpudevmachine", "2"), configs=configs),
        MACHINE,
        allocation_store(TOPO, "0"),
        TOPO,
    ).cpus == cs("5-6")


def test_two_results_with_their_own_overrides() -> None:
    c = claim(
        "u1",
        result("cpudevmachine", "2", request="a"),
        result("cpudevmachine", "3", request="b"),
        configs=(override("1-2", requests=("a",)), override("5-7", requests=("b",))),
    )
    p = plan(c, MACHINE, allocation_store(TOPO, "0"), TOPO)
    assert p.cpus == cs("1-2,5-7")
    assert [d.request_names for d in p.devices] == [("a",), ("b",)]


def test_idempotent_reprepare() -> None:
    st = allocation_store(TOPO, "0")
    first = claim("u1", result("cpudevmachine", "4"), configs=(override("4-7"),))
    commit(st, plan(first, MACHINE, st, TOPO))
    second = claim("u1", result("cpudevmachine", "2"), configs=(override("1-2"),))
    again = plan(second, MACHINE, st, TOPO)
    assert again.already_prepared is True
    assert again.cpus == cs("4-7")


CLASS_MSG = (
    "opaque config: configuration from DeviceClass is not supported by this driver, "
    "custom cpusets must be defined per ResourceClaim request"
)


@pytest.mark.parametrize(
    ("results", "configs", "message"),
    [
        # capacity checks come first
        (
            (result("cpudevmachine", None),),
            (override(source="FromClass"),),
            ('CPU capacity "dra.cpu/cpu" for device "cpudevmachine" is missing'),
        ),
        (
            (result("cpudevmachine", "1500m"),),
            (),
            ('CPU capacity for device "cpudevmachine" must be a whole number, got 1500m'),
        ),
        ((result("cpudevmachine", "4"),), (override(source="FromClass"),), CLASS_MSG),
        (
            (result("cpudevmachine", "4"),),
            (override(source="FromClass", requests=()), override()),
            CLASS_MSG,
        ),
        (
            (result("cpudevmachine", "4"),),
            (),
            (
                'opaque config: request "cpus" is targeted by 0 configurations, '
                "must be targeted by exactly 1"
            ),
        ),
        (
            (result("cpudevmachine", "4"),),
            (OPTIONS,),
            (
                'opaque config: request "cpus" is targeted by 0 configurations, '
                "must be targeted by exactly 1"
            ),
        ),
        (
            (result("cpudevmachine", "4"),),
            (override(), override(requests=())),
            (
                'opaque config: request "cpus" is targeted by 2 configurations, '
                "must be targeted by exactly 1"
            ),
        ),
        (
            (result("cpudevmachine", "4"),),
            (raw(b""),),
            ('no opaque cpuset configuration found for allocation request "cpus"'),
        ),
        (
            (result("cpudevmachine", "4"),),
            (raw(b"{oops"),),
            (
                "failed to unmarshal opaque config: "
                "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
            ),
        ),
        (
            (result("cpudevmachine", "4"),),
            (raw(b'{"cpuConfig": {"cpuset": "4-7"}}'),),
            ('unsupported opaque config apiVersion: ""'),
        ),
        (
            (result("cpudevmachine", "4"),),
            (raw(b'{"apiVersion": "v1alpha1", "cpuConfig": {}}'),),
            ("opaque config: cpuConfig.cpuset is empty or missing"),
        ),
        (
            (result("cpudevmachine", "4"),),
            (override("4-x"),),
            (
                'opaque config: failed to parse cpuset "4-x": '
                "invalid cpuset '4-x': not a cpu id or range: '4-x'"
            ),
        ),
        (
            (result("cpudevmachine", "4"),),
            (override("4-6"),),
            ("opaque config cpuset size 3 does not match requested capacity 4"),
        ),
        (
            (result("cpudevmachine", "4"),),
            (override("8-11"),),
            ("requested CPUs 8-11 from opaque config contain offline cores: 10-11"),
        ),
        (
            (result("cpudevmachine", "4"),),
            (override("0-3"),),
            ("requested CPUs 0-3 from opaque config contain reserved cores: 0"),
        ),
        (
            (result("cpudevmachine", "2", request="a"), result("cpudevmachine", "2", request="b")),
            (override("1-2", requests=("a",)), override("2-3", requests=("b",))),
            "requested CPUs 2-3 from opaque config are already assigned to another device in "
            "this claim",
        ),
    ],
)
def test_override_errors(
    results: tuple[AllocationResult, ...], configs: tuple[DeviceConfig, ...], message: str
) -> None:
    st = allocation_store(TOPO, "0")
    assert prepare_error(claim("u1", *results, configs=configs), MACHINE, st, TOPO) == message
    assert len(st) == 0


def test_override_conflicting_with_another_claim() -> None:
    st = allocation_store(TOPO, "0")
    st.reserve(ClaimRecord(uid="other", cpus=cs("3")))
    c = claim("u1", result("cpudevmachine", "4"), configs=(override("2-5"),))
    assert prepare_error(c, MACHINE, st, TOPO) == (
        "requested CPUs 2-5 from opaque config conflict with already allocated claims"
    )


def test_override_of_online_cpus_outside_the_topology_fails_at_reserve() -> None:
    st = allocation_store(TOPO, "0")
    p = plan(
        claim("u1", result("cpudevmachine", "2"), configs=(override("8-9"),)), MACHINE, st, TOPO
    )
    assert p.cpus == cs("8-9")
    with pytest.raises(PrepareError) as info:
        commit(st, p)
    assert str(info.value) == 'claim "u1" has overlapping CPU assignment "8-9"'
