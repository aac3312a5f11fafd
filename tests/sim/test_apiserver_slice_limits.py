"""What the API server rejects in a ResourceSlice (protocols.md §4.1, §4.4), as the
simulated server's validator reports it. The slices dracpu builds go through the same
validator in tests/devices."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dracpu_sim.apiserver.validation import (
    IDENTIFIER_MESSAGE,
    LABEL_MESSAGE,
    SUBDOMAIN_MESSAGE,
    validate_resource_slice,
)


def problems(obj: dict[str, Any]) -> list[str]:
    return [e.render() for e in validate_resource_slice(obj)]


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
    assert problems(good_slice()) == []
    assert problems(good_slice([])) == []


def test_header_and_spec_shape() -> None:
    assert problems({"apiVersion": "v1", "kind": "Pod"}) == [
        'apiVersion: Invalid value: "v1": must be "resource.k8s.io/v1"',
        'kind: Invalid value: "Pod": must be "ResourceSlice"',
        "spec: Required value",
    ]


def test_driver_name() -> None:
    obj = good_slice()
    obj["spec"]["driver"] = "Dra_CPU"
    assert problems(obj) == [f'spec.driver: Invalid value: "Dra_CPU": {SUBDOMAIN_MESSAGE}']
    obj["spec"]["driver"] = "a" * 64
    assert problems(obj) == [
        f'spec.driver: Invalid value: "{"a" * 64}": must be no more than 63 characters'
    ]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("node-a", []),
        ("a" * 253, []),
        ("zone-1/node-a", []),
        (
            "a" * 254,
            [
                "Too long: may not be more than 253 bytes",
                f'Invalid value: "{"a" * 254}": must be no more than 253 characters',
            ],
        ),
        ("", ["Required value"]),
        ("Node-A", [f'Invalid value: "Node-A": {SUBDOMAIN_MESSAGE}']),
        ("node-a/", [f'Invalid value: "": {SUBDOMAIN_MESSAGE}']),
        (7, ["Invalid value: 7: must be a string"]),
    ],
)
def test_pool_name(name: object, expected: list[str]) -> None:
    obj = good_slice()
    obj["spec"]["pool"]["name"] = name
    assert problems(obj) == [f"spec.pool.name: {message}" for message in expected]


def test_pool_generation_and_count() -> None:
    obj = good_slice()
    obj["spec"]["pool"] = {"name": "n", "generation": -1, "resourceSliceCount": 0}
    assert problems(obj) == [
        "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero",
        "spec.pool.generation: Invalid value: -1: must be greater than or equal to 0",
    ]
    obj["spec"]["pool"] = {"name": "n", "generation": True, "resourceSliceCount": "1"}
    assert problems(obj) == [
        'spec.pool.resourceSliceCount: Invalid value: "1": must be greater than zero',
        "spec.pool.generation: Invalid value: True: must be greater than or equal to 0",
    ]
    obj["spec"]["pool"] = None
    assert problems(obj) == [
        "spec.pool.name: Required value",
        "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero",
    ]
    obj["spec"]["pool"] = "node-a"
    assert problems(obj) == ['spec.pool: Invalid value: "node-a": must be an object']


def test_exactly_one_node_selection() -> None:
    choices = "`nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`"
    obj = good_slice()
    del obj["spec"]["nodeName"]
    assert problems(obj) == [f"spec: Required value: exactly one of {choices} is required"]
    obj["spec"]["nodeName"] = "node-a"
    obj["spec"]["allNodes"] = True
    assert problems(obj) == [
        'spec: Invalid value: "{`nodeName`, `allNodes`}": exactly one of '
        f"{choices} is required, but multiple fields are set"
    ]


def test_device_count_limits() -> None:
    plain: list[dict[str, Any]] = [
        {"name": f"d{i}", "attributes": {"n": {"int": i}}} for i in range(129)
    ]
    assert problems(good_slice(plain[:128])) == []
    assert problems(good_slice(plain)) == [
        "spec.devices: Too many: 129: must have at most 128 items"
    ]
    listed = copy.deepcopy(plain[:65])
    listed[3]["attributes"]["roots"] = {"strings": ["pci0000:00"]}
    assert problems(good_slice(listed[:64])) == []
    assert problems(good_slice(listed)) == [
        "spec.devices: Too many: 65: must have at most 64 items"
    ]


def test_devices_must_be_a_list() -> None:
    obj = good_slice()
    obj["spec"]["devices"] = {"name": "x"}
    assert problems(obj) == ["spec.devices: Invalid value: \"{'name': 'x'}\": must be a list"]
    obj["spec"]["devices"] = ["cpudev000"]
    assert problems(obj) == ['spec.devices[0]: Invalid value: "cpudev000": must be an object']


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("cpudev000", []),
        ("a" * 63, []),
        ("a" * 64, [f'Invalid value: "{"a" * 64}": must be no more than 63 characters']),
        ("Bad_Name", [f'Invalid value: "Bad_Name": {LABEL_MESSAGE}']),
        ("", ["Required value"]),
    ],
)
def test_device_name_is_a_dns_label(name: str, expected: list[str]) -> None:
    assert problems(good_slice([{"name": name}])) == [
        f"spec.devices[0].name: {message}" for message in expected
    ]


def test_duplicate_device_names() -> None:
    obj = good_slice([{"name": "a"}, {"name": "b"}, {"name": "a"}])
    assert problems(obj) == ['spec.devices[2].name: Duplicate value: "a"']


def test_at_most_32_attributes_and_capacities() -> None:
    attributes = {f"a{i}": {"int": i} for i in range(30)}
    capacity = {"c0": {"value": "1"}, "c1": {"value": "2"}}
    assert problems(with_device(attributes=attributes, capacity=capacity)) == []
    capacity["c2"] = {"value": "3"}
    assert problems(with_device(attributes=attributes, capacity=capacity)) == [
        "spec.devices[0]: Invalid value: 33: the total number of attributes and capacities "
        "must not exceed 32"
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
    where = "spec.devices[0]"
    assert problems(obj) == [
        f"{where}.attributes: Too long: may not be more than 32 bytes",
        f'{where}.attributes: Invalid value: "UPPER.example": {SUBDOMAIN_MESSAGE}',
        f'{where}.attributes: Invalid value: "9lives": {IDENTIFIER_MESSAGE}',
        f"{where}.attributes: Required value: the domain must not be empty",
        f'{where}.capacity: Invalid value: "bad name": {IDENTIFIER_MESSAGE}',
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
    one_value = "Required value: exactly one value must be specified"
    assert problems(obj) == [
        f"{where}[two]: {one_value}",
        f"{where}[none]: {one_value}",
        f"{where}[kind]: {one_value}",
        f"{where}[big].int: Invalid value: 9223372036854775808: must be a 64-bit integer",
        f"{where}[flag].int: Invalid value: True: must be a 64-bit integer",
        f'{where}[yes].bool: Invalid value: "true": must be a boolean',
        f"{where}[long].string: Too long: may not be more than 64 bytes",
        f"{where}[ver].version: Invalid value: 1: must be a string",
        f'{where}[roots].strings: Invalid value: "pci0000:00": must be a list',
        f"{where}[items].strings[1]: Too long: may not be more than 64 bytes",
        f"{where}[items].strings[2]: Invalid value: 3: must be a string",
    ]


def test_at_most_48_list_values_per_device() -> None:
    attributes = {"a": {"strings": ["x"] * 40}, "b": {"ints": list(range(8))}}
    assert problems(with_device(attributes=attributes)) == []
    attributes["c"] = {"bools": [True]}
    assert problems(with_device(attributes=attributes)) == [
        "spec.devices[0].attributes: Invalid value: 49: the total number of values in list "
        "attributes must not exceed 48"
    ]


@pytest.mark.parametrize(
    ("value", "ok"),
    [("64", True), ("0", True), ("500m", True), ("8Gi", True), ("1e3", True), ("1.5", True),
     (64, False), ("", False), ("4 cpus", False), ("8GB", False), (None, False)],
)  # fmt: skip
def test_capacity_value_is_a_quantity(value: object, ok: bool) -> None:
    obj = with_device(capacity={"dra.cpu/cpu": {"value": value}})
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    expected = (
        []
        if ok
        else [
            f"spec.devices[0].capacity[dra.cpu/cpu].value: Invalid value: {shown}: "
            "must be a quantity string"
        ]
    )
    assert problems(obj) == expected


def test_attributes_must_be_objects() -> None:
    assert problems(with_device(attributes=["numaNode"])) == [
        "spec.devices[0].attributes: Invalid value: \"['numaNode']\": must be an object"
    ]


def test_every_problem_is_reported_at_once() -> None:
    obj = good_slice([{"name": "Bad", "attributes": {"s": {"string": "z" * 70}}}])
    obj["spec"]["pool"]["name"] = ""
    assert problems(obj) == [
        "spec.pool.name: Required value",
        f'spec.devices[0].name: Invalid value: "Bad": {LABEL_MESSAGE}',
        "spec.devices[0].attributes[s].string: Too long: may not be more than 64 bytes",
    ]
