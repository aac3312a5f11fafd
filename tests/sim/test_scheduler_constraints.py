"""The simulated scheduler's ``matchAttribute`` / ``distinctAttribute`` across drivers: our
CPU devices (``--expose-pcie-roots``: ``resource.kubernetes.io/pcieRoot`` as a list) next to
another driver's GPUs and NICs (a scalar ``pcieRoot``), as the structured allocator decides:
fully qualified names, a driver's unqualified attributes in its own domain, a device without
the attribute never satisfies the constraint, and KEP-5491's list semantics (a match is a
non-empty intersection, distinct value sets are pairwise disjoint)."""

from __future__ import annotations

from typing import Any

import pytest
from builders import FAKE_SYSFS, NODE, device_class, resource_claim
from builders import claim_request as request

from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.topology import discover_from_root
from dracpu_sim.scheduler import AllocatedDevices, UnsatisfiableClaim, allocate

PCIE = "resource.kubernetes.io/pcieRoot"
CLASSES = {name: device_class(name) for name in ("dra.cpu", "gpu.example.com", "nic.example.com")}


def cpu_slices(fixture: str = "xeon-2s-ht", *, expose: bool = True) -> list[dict[str, Any]]:
    topology = discover_from_root(
        FAKE_SYSFS / fixture, expose_pcie_roots=expose, pcie_scan_supported=True
    )
    inventory = build_inventory(topology, DeviceSettings(mode="grouped", expose_pcie_roots=expose))
    built = build_slices(inventory, node_name=NODE, node_uid="uid-1", expose_pcie_roots=expose)
    for obj in built:
        obj["metadata"]["name"] = obj["metadata"]["generateName"] + "abcde"
    return built


def other_slice(driver: str, devices: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One ResourceSlice of ``driver`` on the node: (device name, attributes) pairs."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{driver}-slice"},
        "spec": {
            "driver": driver,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": name, "attributes": attrs} for name, attrs in devices],
        },
    }


def root(name: str, numa: int) -> dict[str, Any]:
    return {PCIE: {"string": name}, "resource.kubernetes.io/numaNode": {"int": numa}}


GPUS = other_slice(
    "gpu.example.com",
    [("gpu-0", root("pci0000:80", 1)), ("gpu-1", root("pci0000:17", 0))],
)
NICS = other_slice(
    "nic.example.com",
    [("nic-0", root("pci0000:5d", 0)), ("nic-1", root("pci0000:17", 0))],
)


def upstream_claim(constraint: str = PCIE, **extra: Any) -> dict[str, Any]:
    """The upstream README's shape: CPUs, a GPU and a NIC on one PCIe root."""
    return resource_claim(
        "aligned",
        requests=[
            request("cpus", cpus=4),
            request("gpu", device_class="gpu.example.com"),
            request("nic", device_class="nic.example.com"),
        ],
        constraints=[{"matchAttribute": constraint, "requests": ["cpus", "gpu", "nic"]}],
        **extra,
    )


def run(claim: dict[str, Any], slices: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    return allocate(
        claim,
        slices,
        CLASSES,
        kwargs.pop("allocated", AllocatedDevices()),
        NODE,
        new_share_id=lambda: "share",
        **kwargs,
    )


def picked(allocation: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {r["request"]: (r["driver"], r["device"]) for r in allocation["devices"]["results"]}


def reason(claim: dict[str, Any], slices: list[dict[str, Any]], **kwargs: Any) -> str:
    with pytest.raises(UnsatisfiableClaim) as info:
        run(claim, slices, **kwargs)
    return str(info.value)


def test_cpus_gpu_and_nic_share_one_pcie_root_across_three_drivers() -> None:
    # gpu-0 (socket 1's root) has no NIC on its root: the search goes back to gpu-1 and
    # takes the CPUs from NUMA node 0, whose devices list pci0000:17 among their roots.
    got = picked(run(upstream_claim(), [*cpu_slices(), GPUS, NICS]))
    assert got == {
        "cpus": ("dra.cpu", "cpudevnuma000"),
        "gpu": ("gpu.example.com", "gpu-1"),
        "nic": ("nic.example.com", "nic-1"),
    }


def test_the_cpus_follow_the_gpu_to_the_other_socket() -> None:
    nics = other_slice("nic.example.com", [("nic-0", root("pci0000:80", 1))])
    got = picked(run(upstream_claim(), [*cpu_slices(), GPUS, nics]))
    assert got["cpus"] == ("dra.cpu", "cpudevnuma001")
    assert got["gpu"] == ("gpu.example.com", "gpu-0")


def test_cpu_devices_without_pcie_roots_cannot_join_the_constraint() -> None:
    # Without --expose-pcie-roots our devices lack the attribute: no CPU device qualifies.
    assert reason(upstream_claim(), [*cpu_slices(expose=False), GPUS, NICS]) == (
        'claim default/aligned: constraint matchAttribute "resource.kubernetes.io/pcieRoot" '
        '(cpus, gpu, nic): no device for request "cpus" on node-a has this attribute'
    )


def test_no_gpu_and_nic_on_one_root_names_the_constraint() -> None:
    nics = other_slice("nic.example.com", [("nic-0", root("pci0000:5d", 0))])
    assert reason(upstream_claim(), [*cpu_slices(), GPUS, nics]) == (
        'claim default/aligned: constraint matchAttribute "resource.kubernetes.io/pcieRoot" '
        "(cpus, gpu, nic): no set of free devices that share one value of it on node-a"
    )


def test_a_held_gpu_moves_the_claim_or_fails_it() -> None:
    held = AllocatedDevices(exclusive={("gpu.example.com", NODE, "gpu-1")})
    message = reason(upstream_claim(), [*cpu_slices(), GPUS, NICS], allocated=held)
    assert 'constraint matchAttribute "resource.kubernetes.io/pcieRoot"' in message


def test_unqualified_constraint_names_are_refused_as_the_api_server_does() -> None:
    assert reason(upstream_claim("pcieRoot"), [*cpu_slices(), GPUS, NICS]) == (
        "claim default/aligned: spec.devices.constraints[0].matchAttribute: "
        'Invalid value: "pcieRoot": must include a domain'
    )


def test_a_drivers_unqualified_attribute_is_in_its_own_domain_only() -> None:
    gpus = other_slice("gpu.example.com", [("gpu-0", {"model": {"string": "a100"}})])
    nics = other_slice("nic.example.com", [("nic-0", {"model": {"string": "a100"}})])
    pair = [
        request("gpu", device_class="gpu.example.com"),
        request("nic", device_class="nic.example.com"),
    ]
    own = resource_claim(
        "c", requests=pair, constraints=[{"matchAttribute": "gpu.example.com/model"}]
    )
    # gpu-0's "model" is gpu.example.com/model; nic-0's is nic.example.com/model.
    assert 'no device for request "nic"' in reason(own, [gpus, nics])
    only_gpu = resource_claim(
        "c",
        requests=pair,
        constraints=[{"matchAttribute": "gpu.example.com/model", "requests": ["gpu"]}],
    )
    assert picked(run(only_gpu, [gpus, nics])) == {
        "gpu": ("gpu.example.com", "gpu-0"),
        "nic": ("nic.example.com", "nic-0"),
    }


def list_slice(values: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [other_slice("gpu.example.com", [(n, {"numa": v}) for n, v in values.items()])]


def gpus(count: int, kind: str, attribute: str = "gpu.example.com/numa") -> dict[str, Any]:
    return resource_claim(
        "c",
        requests=[request("gpu", device_class="gpu.example.com", count=count)],
        constraints=[{kind: attribute}],
    )


def names(allocation: dict[str, Any]) -> list[str]:
    return [r["device"] for r in allocation["devices"]["results"]]


def test_list_match_backtracks_to_the_wider_intersection() -> None:
    # kubernetes/kubernetes#140300: after dev2 (numa [1]) is taken back, the intersection
    # is {1, 2} again, so dev3 and dev4 (numa [2]) fit with dev1.
    slices = list_slice(
        {
            "dev1": {"ints": [1, 2]},
            "dev2": {"ints": [1]},
            "dev3": {"ints": [2]},
            "dev4": {"ints": [2]},
        }
    )
    assert names(run(gpus(3, "matchAttribute"), slices)) == ["dev1", "dev3", "dev4"]


def test_list_distinct_needs_pairwise_disjoint_sets() -> None:
    slices = list_slice(
        {"a": {"ints": [0, 1]}, "b": {"ints": [1, 2]}, "c": {"int": 2}, "d": {"ints": [3]}}
    )
    assert names(run(gpus(2, "distinctAttribute"), slices)) == ["a", "c"]
    assert names(run(gpus(3, "distinctAttribute"), slices)) == ["a", "c", "d"]
    assert "not enough free devices with distinct values" in reason(
        gpus(4, "distinctAttribute"), slices
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"int": 1}, {"bool": True}),
        ({"int": 1}, {"string": "1"}),
        ({"ints": [1]}, {"strings": ["1"]}),
        ({"version": "1.0.0"}, {"string": "1.0.0"}),
    ],
)
def test_values_of_different_types_never_match(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    slices = list_slice({"a": first, "b": second})
    assert "no set of free devices that share one value" in reason(
        gpus(2, "matchAttribute"), slices
    )
    # ... and so they are distinct.
    assert names(run(gpus(2, "distinctAttribute"), slices)) == ["a", "b"]


def test_a_scalar_matches_a_list_holding_it() -> None:
    slices = list_slice({"a": {"strings": ["x", "y"]}, "b": {"string": "y"}, "c": {"string": "x"}})
    assert names(run(gpus(2, "matchAttribute"), slices)) == ["a", "b"]
    assert "no set of free devices" in reason(gpus(3, "matchAttribute"), slices)
