"""The prepare decision in grouped machine mode: the opaque cpuset override (§8.3)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from topo_builders import grid

from dracpu.allocation.opaque import DeviceConfig
from dracpu.allocation.prepare import (
    AllocationResult,
    ClaimAllocation,
    ClaimPlan,
    PrepareError,
    plan_claim,
)
from dracpu.allocation.store import AllocationStore, ClaimRecord, PreparedDevice
from dracpu.cpuset import CPUSet
from dracpu.state import NodeState

TOPO = grid(2, 1, 2, threads=2, cores_per_l3=2)  # CPUs 0-7
ONLINE = CPUSet.range(0, 9)  # CPUs 8-9 are online but were skipped by discovery


@dataclass(frozen=True)
class Names:
    mode: str = "grouped"
    group_by: str = "machine"
    cpu_of_device: Mapping[str, int] = field(default_factory=dict)
    group_of_device: Mapping[str, int] = field(default_factory=dict)


MACHINE = Names()


def cs(text: str) -> CPUSet:
    return CPUSet.parse(text)


def res(
    capacity: str | None = "4", *, request: str = "cpus", device: str = "cpudevmachine"
) -> AllocationResult:
    return AllocationResult(
        request=request,
        driver="dra.cpu",
        pool="node-a",
        device=device,
        consumed_capacity={} if capacity is None else {"dra.cpu/cpu": capacity},
    )


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


def claim(
    *results: AllocationResult, configs: tuple[DeviceConfig, ...], uid: str = "u1"
) -> ClaimAllocation:
    return ClaimAllocation(uid=uid, namespace="ns", name="c", results=results, configs=configs)


def store(reserved: str = "0") -> AllocationStore:
    return AllocationStore(TOPO.all_cpus - cs(reserved), cs(reserved))


def plan(c: ClaimAllocation, st: AllocationStore) -> ClaimPlan:
    return plan_claim(c, inventory=MACHINE, topology=TOPO, store=st, online=ONLINE)


def err(c: ClaimAllocation, st: AllocationStore) -> str:
    with pytest.raises(PrepareError) as info:
        plan(c, st)
    return str(info.value)


def commit(st: AllocationStore, p: ClaimPlan) -> bool:
    """A prepare whose files reached the disk: the state owner reserves, then commits."""
    state = NodeState(st)
    new = state.begin_prepare(p)
    state.finish_prepare(p)
    return new


def test_behavior_example_override() -> None:
    st = store()
    p = plan(claim(res("4"), configs=(override("4-7"),)), st)
    assert p.cpus == cs("4-7")
    assert p.devices == (
        PreparedDevice(
            pool_name="node-a",
            device_name="cpudevmachine",
            request_names=("cpus",),
            allocated_num_cpus=4,
        ),
    )
    assert commit(st, p) is True
    assert st.shared_pool == cs("1-3")


def test_device_name_is_not_checked_and_sub_requests_match_their_main_request() -> None:
    c = claim(res("2", request="cpus/fast", device="anything"), configs=(override("2-3"),))
    assert plan(c, store()).cpus == cs("2-3")


def test_override_for_all_requests_and_other_drivers_ignored() -> None:
    configs = (
        override("1", driver="gpu.example.com", source="FromClass"),
        override("5-6", requests=()),
        OPTIONS,  # options configs neither count nor get parsed in machine mode
    )
    assert plan(claim(res("2"), configs=configs), store()).cpus == cs("5-6")


def test_two_results_with_their_own_overrides() -> None:
    c = claim(
        res("2", request="a"),
        res("3", request="b"),
        configs=(override("1-2", requests=("a",)), override("5-7", requests=("b",))),
    )
    p = plan(c, store())
    assert p.cpus == cs("1-2,5-7")
    assert [d.request_names for d in p.devices] == [("a",), ("b",)]


def test_idempotent_reprepare() -> None:
    st = store()
    commit(st, plan(claim(res("4"), configs=(override("4-7"),)), st))
    again = plan(claim(res("2"), configs=(override("1-2"),)), st)
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
            (res(None),),
            (override(source="FromClass"),),
            ('CPU capacity "dra.cpu/cpu" for device "cpudevmachine" is missing'),
        ),
        (
            (res("1500m"),),
            (),
            ('CPU capacity for device "cpudevmachine" must be a whole number, got 1500m'),
        ),
        ((res("4"),), (override(source="FromClass"),), CLASS_MSG),
        ((res("4"),), (override(source="FromClass", requests=()), override()), CLASS_MSG),
        (
            (res("4"),),
            (),
            (
                'opaque config: request "cpus" is targeted by 0 configurations, '
                "must be targeted by exactly 1"
            ),
        ),
        (
            (res("4"),),
            (OPTIONS,),
            (
                'opaque config: request "cpus" is targeted by 0 configurations, '
                "must be targeted by exactly 1"
            ),
        ),
        (
            (res("4"),),
            (override(), override(requests=())),
            (
                'opaque config: request "cpus" is targeted by 2 configurations, '
                "must be targeted by exactly 1"
            ),
        ),
        (
            (res("4"),),
            (raw(b""),),
            ('no opaque cpuset configuration found for allocation request "cpus"'),
        ),
        (
            (res("4"),),
            (raw(b"{oops"),),
            (
                "failed to unmarshal opaque config: "
                "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
            ),
        ),
        (
            (res("4"),),
            (raw(b'{"cpuConfig": {"cpuset": "4-7"}}'),),
            ('unsupported opaque config apiVersion: ""'),
        ),
        (
            (res("4"),),
            (raw(b'{"apiVersion": "v1alpha1", "cpuConfig": {}}'),),
            ("opaque config: cpuConfig.cpuset is empty or missing"),
        ),
        (
            (res("4"),),
            (override("4-x"),),
            (
                'opaque config: failed to parse cpuset "4-x": '
                "invalid cpuset '4-x': not a cpu id or range: '4-x'"
            ),
        ),
        (
            (res("4"),),
            (override("4-6"),),
            ("opaque config cpuset size 3 does not match requested capacity 4"),
        ),
        (
            (res("4"),),
            (override("8-11"),),
            ("requested CPUs 8-11 from opaque config contain offline cores: 10-11"),
        ),
        (
            (res("4"),),
            (override("0-3"),),
            ("requested CPUs 0-3 from opaque config contain reserved cores: 0"),
        ),
        (
            (res("2", request="a"), res("2", request="b")),
            (override("1-2", requests=("a",)), override("2-3", requests=("b",))),
            "requested CPUs 2-3 from opaque config are already assigned to another device in "
            "this claim",
        ),
    ],
)
def test_override_errors(
    results: tuple[AllocationResult, ...], configs: tuple[DeviceConfig, ...], message: str
) -> None:
    st = store()
    assert err(claim(*results, configs=configs), st) == message
    assert len(st) == 0


def test_override_conflicting_with_another_claim() -> None:
    st = store()
    st.reserve(ClaimRecord(uid="other", cpus=cs("3")))
    c = claim(res("4"), configs=(override("2-5"),))
    assert err(c, st) == (
        "requested CPUs 2-5 from opaque config conflict with already allocated claims"
    )


def test_override_of_online_cpus_outside_the_topology_fails_at_reserve() -> None:
    st = store()
    p = plan(claim(res("2"), configs=(override("8-9"),)), st)
    assert p.cpus == cs("8-9")
    with pytest.raises(PrepareError) as info:
        commit(st, p)
    assert str(info.value) == 'claim "u1" has overlapping CPU assignment "8-9"'
