"""The simulated scheduler's pure allocation core against slices built from real-machine
fixtures (tests/fake_sysfs) by ``dracpu.devices``."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
from builders import NODE, device_class, machine, resource_claim
from builders import claim_request as request

from dracpu.devices import DeviceInventory, DeviceSettings, build_inventory, build_slices
from dracpu_sim.scheduler import AllocatedDevices, UnsatisfiableClaim, allocate, node_selector

CLASSES: dict[str, Any] = {"dra.cpu": device_class()}
NUMA = 'device.attributes["resource.kubernetes.io"].numaNode'
SOCKET = 'device.attributes["dra.cpu"].socketID'


@cache
def inventory(fixture: str, mode: str = "grouped") -> DeviceInventory:
    return build_inventory(machine(fixture), DeviceSettings(mode=mode))  # type: ignore[arg-type]


def slices(fixture: str, mode: str = "grouped", node: str = NODE) -> list[dict[str, Any]]:
    built = build_slices(
        inventory(fixture, mode), node_name=node, node_uid="uid-1", expose_pcie_roots=False
    )
    for obj in built:  # the API server names them from generateName
        obj["metadata"]["name"] = obj["metadata"]["generateName"] + "abcde"
    return built


def share_ids() -> Callable[[], str]:
    counter = itertools.count(1)
    return lambda: f"share-{next(counter)}"


def claim(
    *requests: dict[str, Any], name: str = "c1", constraints: list[Any] | None = None, **extra: Any
) -> dict[str, Any]:
    """Claim ``c1`` with these requests (default: one ``cpus`` request), ``constraints``
    and more ``spec.devices`` fields."""
    if constraints:
        extra["constraints"] = constraints
    return resource_claim(name, requests=requests, **extra)


def run(
    c: dict[str, Any],
    fixture_slices: list[dict[str, Any]],
    allocated: AllocatedDevices | None = None,
    classes: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    return allocate(
        c,
        fixture_slices,
        CLASSES if classes is None else classes,
        allocated or AllocatedDevices(),
        NODE,
        new_share_id=kwargs.pop("new_share_id", share_ids()),
        **kwargs,
    )


def devices_of(allocation: dict[str, Any]) -> list[str]:
    return [r["device"] for r in allocation["devices"]["results"]]


def reason(c: dict[str, Any], fixture_slices: list[dict[str, Any]], **kwargs: Any) -> str:
    with pytest.raises(UnsatisfiableClaim) as info:
        run(c, fixture_slices, **kwargs)
    return str(info.value)


# -- consumable capacity on grouped devices ----------------------------------------------------


def test_grouped_capacity_allocation_has_the_exact_api_shape() -> None:
    allocation = run(claim(request(cpus=4)), slices("xeon-2s-ht"))
    assert allocation == {
        "devices": {
            "results": [
                {
                    "request": "cpus",
                    "driver": "dra.cpu",
                    "pool": NODE,
                    "device": "cpudevnuma000",
                    "shareID": "share-1",
                    "consumedCapacity": {"dra.cpu/cpu": "4"},
                }
            ],
            "config": [],
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
            ]
        },
    }
    assert allocation["nodeSelector"] == node_selector(NODE)


def test_default_share_ids_are_unique_uuids() -> None:
    c = claim(request("a", cpus=1), request("b", cpus=1))
    allocation = allocate(c, slices("xeon-2s-ht"), CLASSES, AllocatedDevices(), NODE)
    ids = [r["shareID"] for r in allocation["devices"]["results"]]
    assert len(set(ids)) == 2 and all(len(i) == 36 for i in ids)


def test_capacity_is_tracked_across_claims_until_the_node_is_full() -> None:
    fixture = slices("xeon-2s-ht")  # two NUMA devices of 40 CPUs
    held = AllocatedDevices()
    placed = []
    for i in range(2):
        allocation = run(claim(request(cpus=30), name=f"c{i}"), fixture, held)
        held.add(allocation)
        placed.append(devices_of(allocation))
    # The second 30 no longer fits next to the first on NUMA 0 (10 left): NUMA 1.
    assert placed == [["cpudevnuma000"], ["cpudevnuma001"]]
    small = run(claim(request(cpus=10), name="c2"), fixture, held)
    assert devices_of(small) == ["cpudevnuma000"]
    held.add(small)
    assert reason(claim(request(cpus=30), name="big"), fixture, allocated=held) == (
        'claim default/big: request "cpus": no device in class dra.cpu on node-a has '
        "30 dra.cpu/cpu capacity left (largest: 10)"
    )


def test_capacity_larger_than_any_device_names_the_largest_left() -> None:
    fixture = slices("xeon-snc")  # four NUMA devices of 20
    held = AllocatedDevices.from_claims(
        [{"status": {"allocation": run(claim(request(cpus=5)), fixture)}}]
    )
    assert reason(claim(request(cpus=64), name="big"), fixture, allocated=held) == (
        'claim default/big: request "cpus": no device in class dra.cpu on node-a has '
        "64 dra.cpu/cpu capacity left (largest: 20)"
    )


def test_a_request_without_capacity_takes_the_whole_shared_device() -> None:
    fixture = slices("xeon-2s-ht")
    whole = run(claim(request()), fixture)
    assert whole["devices"]["results"][0]["consumedCapacity"] == {"dra.cpu/cpu": "40"}
    held = AllocatedDevices.from_claims([{"status": {"allocation": whole}}])
    assert devices_of(run(claim(request(cpus=1)), fixture, held)) == ["cpudevnuma001"]


def test_two_requests_of_one_claim_share_one_device_with_distinct_share_ids() -> None:
    allocation = run(claim(request("a", cpus=4), request("b", cpus=6)), slices("xeon-2s-ht"))
    results = allocation["devices"]["results"]
    assert [(r["request"], r["device"], r["shareID"]) for r in results] == [
        ("a", "cpudevnuma000", "share-1"),
        ("b", "cpudevnuma000", "share-2"),
    ]
    assert [r["consumedCapacity"] for r in results] == [
        {"dra.cpu/cpu": "4"},
        {"dra.cpu/cpu": "6"},
    ]


def test_several_shared_devices_with_capacity_left() -> None:
    fixture = slices("xeon-snc")  # four NUMA devices of 20
    # Fill three devices to 15 of 20: only one keeps 10 CPUs free.
    held = AllocatedDevices()
    for i in range(3):
        held.add(run(claim(request(cpus=15), name=f"x{i}"), fixture, held))
    assert reason(claim(request(cpus=10, count=2), name="pair"), fixture, allocated=held) == (
        'claim default/pair: request "cpus": needs 2 devices in class dra.cpu on node-a '
        "with 10 dra.cpu/cpu capacity left, 1 has it (largest: 20)"
    )
    both = run(claim(request(cpus=5, count=2), name="pair"), fixture, held)
    assert devices_of(both) == ["cpudevnuma000", "cpudevnuma001"]


def test_fractional_capacity_is_exact() -> None:
    fixture = slices("vm-1cpu")  # one device of 1 CPU
    first = run(claim(request(cpus="500m")), fixture)
    assert first["devices"]["results"][0]["consumedCapacity"] == {"dra.cpu/cpu": "500m"}
    held = AllocatedDevices.from_claims([{"status": {"allocation": first}}])
    held.add(run(claim(request(cpus="0.5")), fixture, held))
    assert "has 1m dra.cpu/cpu capacity left (largest: 0)" in reason(
        claim(request(cpus="1m")), fixture, allocated=held
    )


# -- CEL selectors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "selector", "expected"),
    [
        ("xeon-2s-ht", f"{NUMA} == 1", ["cpudevnuma001"]),
        ("xeon-snc", f"{SOCKET} == 1", ["cpudevnuma002"]),
        ("xeon-snc", f"{SOCKET} == 1 && {NUMA} == 3", ["cpudevnuma003"]),
        ("xeon-2s-ht", 'device.capacity["dra.cpu"].cpu >= 40', ["cpudevnuma000"]),
        ("xeon-2s-ht", '40 <= device.capacity["dra.cpu"].cpu', ["cpudevnuma000"]),
        (
            "epyc-2s-768",
            'device.capacity["dra.cpu"].cpu.compareTo(quantity("384")) == 0 && ' + f"{NUMA} == 1",
            ["cpudevnuma001"],
        ),
        (
            "xeon-2s-ht",
            'device.capacity["dra.cpu"].cpu.isGreaterThan(quantity("39"))',
            ["cpudevnuma000"],
        ),
        (
            "xeon-2s-ht",
            'device.attributes["dra.cpu"].numCPUs == 40 && device.driver == "dra.cpu"',
            ["cpudevnuma000"],
        ),
        (
            "xeon-2s-ht",
            '"numaNode" in device.attributes["resource.kubernetes.io"]',
            ["cpudevnuma000"],
        ),
        ("xeon-2s-ht", 'size(device.attributes["no.such.domain"]) == 0', ["cpudevnuma000"]),
    ],
)
def test_selectors_on_grouped_devices(fixture: str, selector: str, expected: list[str]) -> None:
    assert devices_of(run(claim(request(cpus=1, selector=selector)), slices(fixture))) == expected


def test_selectors_on_individual_devices_pick_the_first_devices_in_order() -> None:
    inv = inventory("xeon-2s-ht", "individual")
    fixture = slices("xeon-2s-ht", "individual")
    allocation = run(claim(request(count=4, selector=f"{NUMA} == 1")), fixture)
    chosen = devices_of(allocation)
    on_numa1 = [
        d.name for d in inv.devices if d.attributes["resource.kubernetes.io/numaNode"] == {"int": 1}
    ]
    assert chosen == on_numa1[:4]
    # Devices come in sibling pairs: two full cores.
    cpus = [inv.cpu_of_device[name] for name in chosen]
    assert cpus[1] - cpus[0] == cpus[3] - cpus[2] == 40
    assert all("shareID" not in r for r in allocation["devices"]["results"])


def test_selector_on_cpu_id_and_core_type() -> None:
    fixture = slices("intel-hybrid", "individual")
    chosen = devices_of(
        run(
            claim(
                request(
                    count=2,
                    selector='device.attributes["dra.cpu"].coreType == "e-core" && '
                    'device.attributes["dra.cpu"].cpuID >= 20',
                )
            ),
            fixture,
        )
    )
    inv = inventory("intel-hybrid", "individual")
    for name in chosen:
        attrs = inv.device(name).attributes
        assert attrs["dra.cpu/coreType"] == {"string": "e-core"}
        assert attrs["dra.cpu/cpuID"]["int"] >= 20


def test_unqualified_names_belong_to_the_driver_domain() -> None:
    hand = {
        "metadata": {"name": "hand"},
        "spec": {
            "driver": "dra.cpu",
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": "d0", "attributes": {"numaNode": {"int": 0}}},
                {
                    "name": "d1",
                    "attributes": {"numaNode": {"int": 1}, "model": {"string": "x"}},
                    "capacity": {"cpus": {"value": "8"}},
                },
            ],
        },
    }
    sel = 'device.attributes["dra.cpu"].numaNode == 1 && device.capacity["dra.cpu"].cpus == 8'
    assert devices_of(run(claim(request(selector=sel)), [hand])) == ["d1"]


def test_class_selectors_filter_before_request_selectors() -> None:
    classes = CLASSES | {
        "numa1": {"spec": {"selectors": [{"cel": {"expression": f"{NUMA} == 1"}}]}}
    }
    c = claim({"name": "r", "exactly": {"deviceClassName": "numa1", "count": 1}})
    assert devices_of(run(c, slices("xeon-snc"), classes=classes)) == ["cpudevnuma001"]
    none = claim(
        {
            "name": "r",
            "exactly": {
                "deviceClassName": "numa1",
                "selectors": [{"cel": {"expression": f"{SOCKET} == 1"}}],
            },
        }
    )
    assert reason(none, slices("xeon-snc"), classes=classes) == (
        'claim default/c1: request "r": no device in class numa1 on node-a matches the '
        "request's selectors (1 in class)"
    )


# -- counts and devices in use -----------------------------------------------------------------


def test_devices_held_by_other_claims_are_skipped() -> None:
    fixture = slices("xeon-2s-ht", "individual")
    first = run(claim(request(count=4)), fixture)
    held = AllocatedDevices.from_claims([{"status": {"allocation": first}}])
    second = run(claim(request(count=4), name="c2"), fixture, held)
    assert not set(devices_of(first)) & set(devices_of(second))
    names = [d.name for d in inventory("xeon-2s-ht", "individual").devices]
    assert devices_of(second) == names[4:8]


def test_count_larger_than_free_devices_says_how_many_are_free() -> None:
    fixture = slices("vm-1cpu", "individual")
    held = AllocatedDevices.from_claims([{"status": {"allocation": run(claim(), fixture)}}])
    assert reason(claim(request(count=2), name="two"), fixture, allocated=held) == (
        'claim default/two: request "cpus": needs 2 devices in class dra.cpu on node-a, '
        "0 of 1 matching are free"
    )
    assert reason(claim(name="one"), fixture, allocated=held) == (
        'claim default/one: request "cpus": needs 1 device in class dra.cpu on node-a, '
        "0 of 1 matching are free"
    )


def test_allocation_mode_all() -> None:
    fixture = slices("xeon-2s-ht", "individual")
    every = run(claim(request(allocationMode="All", selector=f"{NUMA} == 0")), fixture)
    assert len(devices_of(every)) == 40
    taken = run(claim(request(count=1, selector=f"{NUMA} == 0")), fixture)
    held = AllocatedDevices.from_claims([{"status": {"allocation": taken}}])
    assert reason(
        claim(request(allocationMode="All", selector=f"{NUMA} == 0")), fixture, allocated=held
    ) == (
        'claim default/c1: request "cpus": allocationMode All needs every matching device '
        "in class dra.cpu on node-a, but 1 of 40 are in use"
    )


# -- constraints -------------------------------------------------------------------------------


def test_match_attribute_backtracks_to_a_numa_node_with_room() -> None:
    inv = inventory("xeon-2s-ht", "individual")
    fixture = slices("xeon-2s-ht", "individual")
    numa0 = [
        d.name for d in inv.devices if d.attributes["resource.kubernetes.io/numaNode"]["int"] == 0
    ]
    # Leave 3 devices free on NUMA 0: a+b need 4 on one node, so both must go to NUMA 1.
    held = AllocatedDevices(exclusive={("dra.cpu", NODE, name) for name in numa0[3:]})
    c = claim(
        request("a", count=2),
        request("b", count=2),
        constraints=[{"matchAttribute": "resource.kubernetes.io/numaNode"}],
    )
    chosen = devices_of(run(c, fixture, held))
    assert len(chosen) == 4
    assert {inv.device(n).attributes["resource.kubernetes.io/numaNode"]["int"] for n in chosen} == {
        1
    }


def test_match_attribute_limited_to_some_requests() -> None:
    fixture = slices("xeon-snc")
    c = claim(
        request("a", cpus=15),
        request("b", cpus=10),
        request("c", cpus=18),
        constraints=[{"matchAttribute": "dra.cpu/socketID", "requests": ["a", "b"]}],
    )
    assert devices_of(run(c, fixture)) == ["cpudevnuma000", "cpudevnuma001", "cpudevnuma002"]


def test_distinct_attribute_spreads_requests() -> None:
    fixture = slices("xeon-snc")
    c = claim(
        request("a", cpus=2),
        request("b", cpus=2),
        constraints=[{"distinctAttribute": "dra.cpu/socketID"}],
    )
    assert devices_of(run(c, fixture)) == ["cpudevnuma000", "cpudevnuma002"]
    individual = slices("xeon-2s-ht", "individual")
    inv = inventory("xeon-2s-ht", "individual")
    spread = devices_of(
        run(
            claim(request(count=2), constraints=[{"distinctAttribute": "dra.cpu/socketID"}]),
            individual,
        )
    )
    assert sorted(inv.device(n).attributes["dra.cpu/socketID"]["int"] for n in spread) == [0, 1]


def test_distinct_attribute_unsatisfiable_names_the_constraint() -> None:
    c = claim(
        request("a", cpus=1),
        request("b", cpus=1),
        request("c", cpus=1),
        constraints=[{"distinctAttribute": "dra.cpu/socketID"}],
    )
    assert reason(c, slices("xeon-snc")) == (
        'claim default/c1: constraint distinctAttribute "dra.cpu/socketID" (all requests): '
        "not enough free devices with distinct values of it on node-a"
    )


def test_match_attribute_unsatisfiable_names_the_constraint() -> None:
    c = claim(
        request("a", count=30),
        request("b", count=30),
        constraints=[{"matchAttribute": "resource.kubernetes.io/numaNode", "requests": ["a", "b"]}],
    )
    assert reason(c, slices("xeon-snc", "individual")) == (
        'claim default/c1: constraint matchAttribute "resource.kubernetes.io/numaNode" (a, b): '
        "no set of free devices that share one value of it on node-a"
    )


def test_constraint_on_an_attribute_the_devices_lack() -> None:
    # Grouped devices have no cpuID: no device can take part in the constraint.
    c = claim(request(cpus=1), constraints=[{"matchAttribute": "dra.cpu/cpuID"}])
    assert 'constraint matchAttribute "dra.cpu/cpuID"' in reason(c, slices("xeon-2s-ht"))


def test_requests_competing_for_the_same_devices() -> None:
    fixture = slices("xeon-2s-ht")
    c = claim(request("a", cpus=30), request("b", cpus=30), request("c", cpus=30))
    assert reason(c, fixture) == (
        'claim default/c1: requests "a", "b", "c" cannot all be satisfied together on node-a '
        "(they need the same free devices)"
    )


def test_large_match_attribute_search_stays_fast_on_768_cpus() -> None:
    fixture = slices("epyc-2s-768", "individual")
    inv = inventory("epyc-2s-768", "individual")
    c = claim(request(count=48), constraints=[{"matchAttribute": "dra.cpu/cacheL3ID"}])
    with pytest.raises(UnsatisfiableClaim, match="matchAttribute"):
        run(c, fixture)
    ok = devices_of(
        run(
            claim(request(count=16), constraints=[{"matchAttribute": "dra.cpu/cacheL3ID"}]), fixture
        )
    )
    assert len({inv.device(n).attributes["dra.cpu/cacheL3ID"]["int"] for n in ok}) == 1


def test_search_budget_gives_a_clear_error() -> None:
    c = claim(
        request("a", count=30),
        request("b", count=30),
        constraints=[{"distinctAttribute": "dra.cpu/cpuID", "requests": ["a"]}],
        name="wide",
    )
    held_names = [d.name for d in inventory("xeon-2s-ht", "individual").devices][:25]
    held = AllocatedDevices(exclusive={("dra.cpu", NODE, n) for n in held_names})
    assert reason(c, slices("xeon-2s-ht", "individual"), allocated=held, search_budget=50) == (
        "claim default/wide: gave up after trying 50 device placements on node-a "
        "(the constraints leave too many combinations to search)"
    )


# -- firstAvailable, adminAccess, config -------------------------------------------------------


def test_first_available_falls_back_to_a_smaller_sub_request() -> None:
    c = claim(
        {
            "name": "cpus",
            "firstAvailable": [
                {
                    "name": "big",
                    "deviceClassName": "dra.cpu",
                    "capacity": {"requests": {"dra.cpu/cpu": "64"}},
                },
                {
                    "name": "small",
                    "deviceClassName": "dra.cpu",
                    "capacity": {"requests": {"dra.cpu/cpu": "8"}},
                },
            ],
        }
    )
    results = run(c, slices("xeon-2s-ht"))["devices"]["results"]
    assert [(r["request"], r["consumedCapacity"]) for r in results] == [
        ("cpus/small", {"dra.cpu/cpu": "8"})
    ]
    too_big = claim(
        {
            "name": "cpus",
            "firstAvailable": [
                {
                    "name": "a",
                    "deviceClassName": "dra.cpu",
                    "capacity": {"requests": {"dra.cpu/cpu": "64"}},
                },
                {"name": "b", "deviceClassName": "nope"},
            ],
        }
    )
    assert reason(too_big, slices("xeon-2s-ht")) == (
        'claim default/c1: request "cpus/b": device class "nope" does not exist'
    )


def test_first_available_reason_lists_every_sub_request() -> None:
    c = claim(
        {
            "name": "cpus",
            "firstAvailable": [
                {
                    "name": "a",
                    "deviceClassName": "dra.cpu",
                    "capacity": {"requests": {"dra.cpu/cpu": "64"}},
                },
                {"name": "b", "deviceClassName": "dra.cpu", "count": 3},
            ],
        }
    )
    assert reason(c, slices("xeon-2s-ht")) == (
        'claim default/c1: request "cpus": no sub-request can be satisfied: '
        "cpus/a: no device in class dra.cpu on node-a has 64 dra.cpu/cpu capacity left "
        "(largest: 40); cpus/b: needs 3 devices in class dra.cpu on node-a, 2 of 2 matching "
        "are free"
    )


def test_admin_access_ignores_devices_in_use() -> None:
    fixture = slices("vm-1cpu", "individual")
    held = AllocatedDevices.from_claims([{"status": {"allocation": run(claim(), fixture)}}])
    allocation = run(claim(request(adminAccess=True)), fixture, held)
    assert allocation["devices"]["results"] == [
        {
            "request": "cpus",
            "driver": "dra.cpu",
            "pool": NODE,
            "device": "cpudev000",
            "adminAccess": True,
        }
    ]
    held.add(allocation)
    assert held.exclusive == {("dra.cpu", NODE, "cpudev000")}


def test_class_and_claim_config_are_copied_in_order() -> None:
    opaque_class = {"driver": "dra.cpu", "parameters": {"kind": "FromClass"}}
    opaque_claim = {"driver": "dra.cpu", "parameters": {"kind": "FromClaim"}}
    classes = {
        "dra.cpu": CLASSES["dra.cpu"]
        | {"spec": CLASSES["dra.cpu"]["spec"] | {"config": [{"opaque": opaque_class}]}}
    }
    c = claim(
        request("a", cpus=1),
        request("b", cpus=1),
        config=[{"requests": ["b"], "opaque": opaque_claim}],
    )
    assert run(c, slices("xeon-2s-ht"), classes=classes)["devices"]["config"] == [
        {"source": "FromClass", "requests": ["a"], "opaque": opaque_class},
        {"source": "FromClass", "requests": ["b"], "opaque": opaque_class},
        {"source": "FromClaim", "requests": ["b"], "opaque": opaque_claim},
    ]


# -- request policies on hand-built devices ----------------------------------------------------


def policy_slice(policy: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "metadata": {"name": "p"},
            "spec": {
                "driver": "dra.cpu",
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": "shared",
                        "allowMultipleAllocations": True,
                        "capacity": {
                            "dra.cpu/cpu": {"value": "16", "requestPolicy": policy},
                            "dra.cpu/mem": {"value": "8"},
                        },
                    }
                ],
            },
        }
    ]


@pytest.mark.parametrize(
    ("policy", "wanted", "consumed"),
    [
        ({"default": "1", "validRange": {"min": "1", "step": "2"}}, "3", "3"),
        ({"default": "1", "validRange": {"min": "1", "step": "2"}}, "4", "5"),
        ({"default": "2", "validRange": {"min": "2", "max": "8"}}, "1", "2"),
        ({"default": "2", "validValues": ["2", "4", "8"]}, "3", "4"),
        ({"default": "2", "validValues": ["2", "4", "8"]}, None, "2"),
    ],
)
def test_request_policy_rounds_up(
    policy: dict[str, Any], wanted: str | None, consumed: str
) -> None:
    req = request(cpus=wanted) if wanted else request()
    results = run(claim(req), policy_slice(policy))["devices"]["results"]
    # Every capacity of the device is listed; mem has no policy and no request: all of it.
    assert results[0]["consumedCapacity"] == {"dra.cpu/cpu": consumed, "dra.cpu/mem": "8"}


@pytest.mark.parametrize(
    "policy",
    [
        {"default": "2", "validValues": ["2", "4", "8"]},
        {"default": "2", "validRange": {"min": "2", "max": "8"}},
    ],
)
def test_request_policy_refusing_the_amount(policy: dict[str, Any]) -> None:
    assert reason(claim(request(cpus=9)), policy_slice(policy)) == (
        'claim default/c1: request "cpus": no device in class dra.cpu on node-a accepts the '
        "requested amount of dra.cpu/cpu under its requestPolicy"
    )


# -- bad claims and unusable pools -------------------------------------------------------------


@pytest.mark.parametrize(
    ("c", "expected"),
    [
        (
            claim({"name": "r", "exactly": {"deviceClassName": "gpu"}}),
            'request "r": device class "gpu" does not exist',
        ),
        (
            claim(request(selector="device.attributes[")),
            'request "cpus": selector #0: CEL compile error:',
        ),
        (
            claim(request(selector='device.attributes["dra.cpu"].nope == 1')),
            'request "cpus": selector #0 on device dra.cpu/node-a/cpudevnuma000: '
            "CEL runtime error: no such member in mapping: 'nope'",
        ),
        (
            claim(request(selector="device.driver")),
            "CEL expression must evaluate to bool, got StringType",
        ),
        (claim(request(count=0)), 'request "cpus": count must be a positive integer, got 0'),
        (
            claim(request(allocationMode="Some")),
            'request "cpus": unknown allocationMode "Some" (ExactCount or All)',
        ),
        (
            claim(request(cpus="lots")),
            'request "cpus": capacity.requests["dra.cpu/cpu"]: invalid quantity "lots"',
        ),
        (
            claim({"name": "r", "exactly": {"deviceClassName": "dra.cpu"}, "firstAvailable": [{}]}),
            'request "r": exactly and firstAvailable are mutually exclusive',
        ),
        (claim({"name": "r"}), 'request "r": one of exactly or firstAvailable is required'),
        (
            claim(request(), constraints=[{"matchAttribute": "dra.cpu/x", "requests": ["zzz"]}]),
            'constraint #0: names unknown request "zzz"',
        ),
        (
            claim(request(), constraints=[{"matchAttribute": "x", "distinctAttribute": "y"}]),
            "constraint #0: exactly one of matchAttribute or distinctAttribute",
        ),
    ],
)
def test_bad_claims_get_specific_reasons(c: dict[str, Any], expected: str) -> None:
    message = reason(c, slices("xeon-2s-ht"))
    assert message.startswith("claim default/c1: ")
    assert expected in message


def test_class_selector_errors_name_the_class() -> None:
    classes = {"dra.cpu": {"spec": {"selectors": [{"cel": {"expression": "1 +"}}]}}}
    assert 'request "cpus": device class dra.cpu: selector #0: CEL compile error' in reason(
        claim(), slices("xeon-2s-ht"), classes=classes
    )


def test_slices_of_other_nodes_are_ignored() -> None:
    assert reason(claim(), slices("xeon-2s-ht", node="node-b")) == (
        'claim default/c1: request "cpus": no device in class dra.cpu on node-a'
    )


def test_an_incomplete_pool_is_not_used() -> None:
    fixture = slices("epyc-2s-768", "individual")  # six slices
    assert reason(claim(), fixture[:5]) == (
        'claim default/c1: request "cpus": no device in class dra.cpu on node-a '
        "(resource pool dra.cpu/node-a is being updated (5 of 6 slices at generation 1))"
    )


def test_only_the_newest_pool_generation_counts() -> None:
    old = slices("xeon-2s-ht")
    new = slices("xeon-snc")
    for obj in new:
        obj["spec"]["pool"]["generation"] = 2
        obj["metadata"]["name"] += "-new"
    # Only the generation-2 devices (20 CPUs each) exist now.
    assert "largest: 20" in reason(claim(request(cpus=30)), old + new)


def test_allocated_devices_from_claims_sums_shares() -> None:
    fixture = slices("xeon-2s-ht")
    a = run(claim(request(cpus=3)), fixture)
    b = run(claim(request(cpus=4)), fixture)
    held = AllocatedDevices.from_claims(
        [{"status": {"allocation": a}}, {"status": {"allocation": b}}, {"status": {}}, {}]
    )
    from fractions import Fraction

    assert held.consumed == {("dra.cpu", NODE, "cpudevnuma000"): {"dra.cpu/cpu": Fraction(7)}}
    assert held.exclusive == set()


def test_remembered_selector_results_follow_device_content() -> None:
    fixture = slices("xeon-2s-ht")
    sel = f"{NUMA} == 1"
    assert devices_of(run(claim(request(cpus=1, selector=sel)), fixture)) == ["cpudevnuma001"]
    # Republished with the NUMA ids swapped: same device names, new content.
    for device in fixture[0]["spec"]["devices"]:
        attr = device["attributes"]["resource.kubernetes.io/numaNode"]
        attr["int"] = 1 - attr["int"]
    assert devices_of(run(claim(request(cpus=1, selector=sel)), fixture)) == ["cpudevnuma000"]
    # A runtime error is remembered as an error, not as a non-match.
    bad = 'device.attributes["dra.cpu"].cpuID == 1'
    for _ in range(2):
        assert "no such member in mapping: 'cpuID'" in reason(
            claim(request(cpus=1, selector=bad)), fixture
        )
