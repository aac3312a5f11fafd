"""validate_slice: what the API server would reject (protocols.md §4.1, §4.4)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dracpu.devices import validate_slice


def good_slice(devices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "00000-dra.cpu-node-a-"},
        "spec": {
            "driver": "dra.cpu",
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "devices": devices
            if devices is not None
            else [
                {
                    "name": "cpudevnuma000",
                    "allowMultipleAllocations": True,
                    "capacity": {"dra.cpu/cpu": {"value": "64"}},
                    "attributes": {
                        "resource.kubernetes.io/numaNode": {"int": 0},
                        "resource.kubernetes.io/pcieRoot": {"strings": ["pci0000:00"]},
                        "dra.cpu/smtEnabled": {"bool": True},
                        "dra.cpu/coreType": {"string": "standard"},
                    },
                }
            ],
        },
    }


def with_device(**fields: Any) -> dict[str, Any]:
    return good_slice([{"name": "cpudev000", **fields}])


def test_good_slice_passes() -> None:
    assert validate_slice(good_slice()) == []
    assert validate_slice(good_slice([])) == []


def test_header_and_spec_shape() -> None:
    assert validate_slice({"apiVersion": "v1", "kind": "Pod"}) == [
        "apiVersion: must be 'resource.k8s.io/v1', got 'v1'",
        "kind: must be 'ResourceSlice', got 'Pod'",
        "spec: must be an object",
    ]


def test_driver_name() -> None:
    obj = good_slice()
    obj["spec"]["driver"] = "Dra_CPU"
    assert validate_slice(obj) == [
        "spec.driver: 'Dra_CPU' must be a DNS subdomain of at most 63 characters"
    ]
    obj["spec"]["driver"] = "a" * 64
    assert validate_slice(obj) == [
        f"spec.driver: {'a' * 64!r} must be a DNS subdomain of at most 63 characters"
    ]


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("node-a", True),
        ("a" * 253, True),
        ("zone-1/node-a", True),
        ("a" * 254, False),
        ("", False),
        ("Node-A", False),
        ("node-a/", False),
        (7, False),
    ],
)
def test_pool_name(name: object, ok: bool) -> None:
    obj = good_slice()
    obj["spec"]["pool"]["name"] = name
    expected = (
        []
        if ok
        else [
            f"spec.pool.name: {name!r} must be DNS subdomains joined by '/', at most 253 characters"
        ]
    )
    assert validate_slice(obj) == expected


def test_pool_generation_and_count() -> None:
    obj = good_slice()
    obj["spec"]["pool"] = {"name": "n", "generation": -1, "resourceSliceCount": 0}
    assert validate_slice(obj) == [
        "spec.pool.generation: -1 must be a non-negative integer",
        "spec.pool.resourceSliceCount: 0 must be a positive integer",
    ]
    obj["spec"]["pool"] = {"name": "n", "generation": True, "resourceSliceCount": "1"}
    assert validate_slice(obj) == [
        "spec.pool.generation: True must be a non-negative integer",
        "spec.pool.resourceSliceCount: '1' must be a positive integer",
    ]
    obj["spec"]["pool"] = None
    assert validate_slice(obj) == ["spec.pool: must be an object"]


def test_exactly_one_node_selection() -> None:
    obj = good_slice()
    del obj["spec"]["nodeName"]
    assert validate_slice(obj) == [
        "spec: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection "
        "must be set, got []"
    ]
    obj["spec"]["nodeName"] = "node-a"
    obj["spec"]["allNodes"] = True
    assert validate_slice(obj) == [
        "spec: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection "
        "must be set, got ['nodeName', 'allNodes']"
    ]


def test_device_count_limits() -> None:
    plain: list[dict[str, Any]] = [
        {"name": f"d{i}", "attributes": {"n": {"int": i}}} for i in range(129)
    ]
    assert validate_slice(good_slice(plain[:128])) == []
    assert validate_slice(good_slice(plain)) == [
        "spec.devices: must have at most 128 items, got 129"
    ]
    listed = copy.deepcopy(plain[:65])
    listed[3]["attributes"]["roots"] = {"strings": ["pci0000:00"]}
    assert validate_slice(good_slice(listed[:64])) == []
    assert validate_slice(good_slice(listed)) == [
        "spec.devices: must have at most 64 items (list attributes present), got 65"
    ]


def test_devices_must_be_a_list() -> None:
    obj = good_slice()
    obj["spec"]["devices"] = {"name": "x"}
    assert validate_slice(obj) == ["spec.devices: must be a list"]
    obj["spec"]["devices"] = ["cpudev000"]
    assert validate_slice(obj) == ["spec.devices[0]: must be an object"]


@pytest.mark.parametrize(
    ("name", "ok"),
    [("cpudev000", True), ("a" * 63, True), ("a" * 64, False), ("Bad_Name", False), ("", False)],
)
def test_device_name_is_a_dns_label(name: str, ok: bool) -> None:
    expected = (
        []
        if ok
        else [f"spec.devices[0].name: {name!r} must be a DNS label of at most 63 characters"]
    )
    assert validate_slice(good_slice([{"name": name}])) == expected


def test_duplicate_device_names() -> None:
    obj = good_slice([{"name": "a"}, {"name": "b"}, {"name": "a"}])
    assert validate_slice(obj) == ["spec.devices[2].name: duplicate device name 'a'"]


def test_at_most_32_attributes_and_capacities() -> None:
    attributes = {f"a{i}": {"int": i} for i in range(30)}
    capacity = {"c0": {"value": "1"}, "c1": {"value": "2"}}
    assert validate_slice(with_device(attributes=attributes, capacity=capacity)) == []
    capacity["c2"] = {"value": "3"}
    assert validate_slice(with_device(attributes=attributes, capacity=capacity)) == [
        "spec.devices[0]: at most 32 attributes and capacities, got 33"
    ]


def test_attribute_and_capacity_names() -> None:
    obj = with_device(
        attributes={
            "numaNode": {"int": 0},
            "dra.cpu/" + "x" * 32: {"int": 0},
            "dra.cpu/" + "x" * 33: {"int": 0},
            "UPPER.example/y": {"int": 1},
            "dra.cpu/9lives": {"int": 1},
            "/noDomain": {"int": 1},
        },
        capacity={"bad name": {"value": "1"}},
    )
    assert validate_slice(obj) == [
        f"spec.devices[0].attributes['dra.cpu/{'x' * 33}']: name {'x' * 33!r} must be a C "
        "identifier of at most 32 characters",
        "spec.devices[0].attributes['UPPER.example/y']: domain 'UPPER.example' must be a DNS "
        "subdomain of at most 63 characters",
        "spec.devices[0].attributes['dra.cpu/9lives']: name '9lives' must be a C identifier "
        "of at most 32 characters",
        "spec.devices[0].attributes['/noDomain']: domain '' must be a DNS subdomain of at most "
        "63 characters",
        "spec.devices[0].capacity['bad name']: name 'bad name' must be a C identifier of at "
        "most 32 characters",
    ]


def test_attribute_values() -> None:
    obj = with_device(
        attributes={
            "two": {"int": 1, "bool": True},
            "none": {},
            "kind": {"float": 1.5},
            "big": {"int": 1 << 63},
            "flag": {"int": True},
            "yes": {"bool": "true"},
            "long": {"string": "a" * 65},
            "edge": {"string": "a" * 64},
            "ver": {"version": 1},
            "roots": {"strings": "pci0000:00"},
            "items": {"strings": ["ok", "b" * 65, 3]},
        }
    )
    where = "spec.devices[0].attributes"
    one_of = "must have exactly one of int, bool, string, version, ints, bools, strings, versions"
    assert validate_slice(obj) == [
        f"{where}['two']: {one_of}",
        f"{where}['none']: {one_of}",
        f"{where}['kind']: unknown value kind 'float'",
        f"{where}['big']: int value 9223372036854775808 must be a 64-bit integer",
        f"{where}['flag']: int value True must be a 64-bit integer",
        f"{where}['yes']: bool value 'true' must be a boolean",
        f"{where}['long']: string value longer than 64 characters (65)",
        f"{where}['ver']: version value 1 must be a string",
        f"{where}['roots']: strings must be a list",
        f"{where}['items']: strings value longer than 64 characters (65)",
        f"{where}['items']: strings value 3 must be a string",
    ]


def test_at_most_48_list_values_per_device() -> None:
    attributes = {"a": {"strings": ["x"] * 40}, "b": {"ints": list(range(8))}}
    assert validate_slice(with_device(attributes=attributes)) == []
    attributes["c"] = {"bools": [True]}
    assert validate_slice(with_device(attributes=attributes)) == [
        "spec.devices[0].attributes: at most 48 list values, got 49"
    ]


@pytest.mark.parametrize(
    ("value", "ok"),
    [("64", True), ("0", True), ("500m", True), ("8Gi", True), ("1e3", True), ("1.5", True),
     (64, False), ("", False), ("4 cpus", False), ("8GB", False), (None, False)],
)  # fmt: skip
def test_capacity_value_is_a_quantity(value: object, ok: bool) -> None:
    obj = with_device(capacity={"dra.cpu/cpu": {"value": value}})
    expected = (
        []
        if ok
        else [f"spec.devices[0].capacity['dra.cpu/cpu'].value: {value!r} must be a quantity string"]
    )
    assert validate_slice(obj) == expected


def test_attributes_must_be_objects() -> None:
    assert validate_slice(with_device(attributes=["numaNode"])) == [
        "spec.devices[0]: attributes and capacity must be objects"
    ]


def test_every_problem_is_reported_at_once() -> None:
    obj = good_slice([{"name": "Bad", "attributes": {"s": {"string": "z" * 70}}}])
    obj["spec"]["pool"]["name"] = ""
    assert validate_slice(obj) == [
        "spec.pool.name: '' must be DNS subdomains joined by '/', at most 253 characters",
        "spec.devices[0].name: 'Bad' must be a DNS label of at most 63 characters",
        "spec.devices[0].attributes['s']: string value longer than 64 characters (70)",
    ]
