"""Other drivers' devices in the dry run: scenario DeviceClasses and ResourceSlices, a
claim aligning CPUs with a GPU and a NIC on one PCIe root (docs/examples/gpu-cpu-nic.yaml),
and the demo's report of every device of a claim."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dracpu.cpuset import CPUSet
from dracpu_sim.demo.scenario import ScenarioError, node_slice, parse_scenario

REPO = Path(__file__).parents[2]
EXAMPLE = REPO / "docs" / "examples" / "gpu-cpu-nic.yaml"
SHAPE = REPO / "tests" / "fake_sysfs" / "xeon-2s-ht"

GPU_CLASS = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.example.com}
spec:
  selectors: [{cel: {expression: 'device.driver == "gpu.example.com"'}}]
"""
GPU_SLICE = """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: gpus}
spec:
  driver: gpu.example.com
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  devices: [{name: gpu-0}]
"""


def demo(*args: str, scenario: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dracpu",
            "demo",
            "--sysfs-root",
            str(SHAPE),
            "--scenario",
            str(scenario),
            "--output",
            "json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def root_cpus(root: str) -> CPUSet:
    """The CPUs local to a PCIe root of the fake machine, as sysfs says."""
    bus = root.removeprefix("pci")
    return CPUSet.parse(
        (SHAPE / "devices" / root / "pci_bus" / bus / "cpulistaffinity").read_text()
    )


def example_docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]


def gpu_root(docs: list[dict[str, Any]], device: str) -> str:
    for doc in docs:
        if doc["kind"] == "ResourceSlice" and doc["spec"]["driver"] == "gpu.example.com":
            for dev in doc["spec"]["devices"]:
                if dev["name"] == device:
                    return str(dev["attributes"]["resource.kubernetes.io/pcieRoot"]["string"])
    raise AssertionError(f"no GPU {device} in the example")


# -- the scenario ------------------------------------------------------------------------------


def test_other_drivers_classes_and_slices_are_read_cluster_scoped() -> None:
    text = GPU_CLASS + "---\n" + GPU_SLICE.replace("{name: gpus}", "{name: gpus, namespace: x}")
    scenario = parse_scenario(text, "s")
    assert [c["metadata"] for c in scenario.device_classes] == [{"name": "gpu.example.com"}]
    # The API server drops a namespace on a cluster-scoped object; so does the scenario.
    assert [s["metadata"] for s in scenario.slices] == [{"name": "gpus"}]
    assert scenario.origin(scenario.slices[0]) == "s: document 2 (ResourceSlice gpus)"
    assert "ResourceSlice" in {d["kind"] for d in yaml.safe_load_all(_yaml(scenario))}


def _yaml(scenario: Any) -> str:
    from dracpu_sim.demo.scenario import scenario_yaml

    return scenario_yaml(scenario)


def test_a_slice_naming_no_node_is_for_the_simulated_node() -> None:
    (raw,) = parse_scenario(GPU_SLICE, "s").slices
    assert node_slice(raw, "demo-node")["spec"]["nodeName"] == "demo-node"
    assert "nodeName" not in raw["spec"]  # the scenario's own copy is left alone
    everywhere = json.loads(json.dumps(raw))
    everywhere["spec"]["allNodes"] = True
    assert "nodeName" not in node_slice(everywhere, "demo-node")["spec"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            GPU_CLASS.replace("gpu.example.com}", "dra.cpu}"),
            "s: document 1 (DeviceClass dra.cpu): DeviceClass dra.cpu is the demo's own",
        ),
        (
            GPU_SLICE.replace("driver: gpu.example.com", "driver: dra.cpu"),
            "s: document 1 (ResourceSlice gpus): ResourceSlices of dra.cpu are the daemon's own",
        ),
        (
            GPU_SLICE + "---\n" + GPU_SLICE,
            "s: document 2 (ResourceSlice gpus): ResourceSlice gpus ",
        ),
        (GPU_CLASS + "---\n" + GPU_CLASS, "DeviceClass gpu.example.com defined twice"),
        (
            GPU_SLICE.replace("  driver: gpu.example.com\n", ""),
            "s: document 1 (ResourceSlice gpus): spec.driver is required",
        ),
        (
            "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: c}\nspec: 3",
            "s: document 1 (DeviceClass c): spec must be a mapping",
        ),
        (
            GPU_SLICE.replace("devices:", "devicez:"),
            'unknown field "spec.devicez"',
        ),
    ],
)
def test_bad_other_driver_documents(text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "s")
    assert message in str(info.value)


def test_bundle_slices_move_to_the_simulated_node() -> None:
    scenario = parse_scenario(GPU_CLASS, "s")
    gathered = yaml.safe_load(GPU_SLICE)
    gathered["metadata"] |= {"uid": "u", "resourceVersion": "7", "ownerReferences": [{}]}
    gathered["spec"]["nodeName"] = "worker-3"
    other_class = yaml.safe_load(GPU_CLASS.replace("gpu.example.com}", "nic.example.com}"))
    own_class = yaml.safe_load(GPU_CLASS.replace("gpu.example.com}", "dra.cpu}"))
    scenario.add_node_slices(
        [gathered], [yaml.safe_load(GPU_CLASS), other_class, own_class], "b.yaml"
    )
    (added,) = scenario.slices
    assert added["metadata"] == {"name": "gpus"}
    assert "nodeName" not in added["spec"]
    # The scenario's own class wins; dra.cpu is the demo's; the other one is added.
    assert [c["metadata"]["name"] for c in scenario.device_classes] == [
        "gpu.example.com",
        "nic.example.com",
    ]
    assert scenario.origin(added) == "b.yaml: resourceSlices[0]"
    with pytest.raises(ScenarioError, match=r"b.yaml: resourceSlices\[0\]: ResourceSlice gpus"):
        scenario.add_node_slices([gathered], [], "b.yaml")
    with pytest.raises(ScenarioError, match=r"resourceSlices\[0\]: expected a mapping"):
        scenario.add_node_slices(["x"], [], "b.yaml")  # type: ignore[list-item]


# -- the dry run -------------------------------------------------------------------------------


def test_gpu_cpu_nic_example_puts_the_cpus_on_the_gpus_pcie_root() -> None:
    proc = demo("--expose-pcie-roots", scenario=EXAMPLE)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    claim = json.loads(proc.stdout)["claims"]["default/gpu-cpu-nic-claim"]
    assert claim["error"] is None
    by_request = {d["request"]: d for d in claim["devices"]}
    assert {r: (d["driver"], d["device"]) for r, d in by_request.items()} == {
        "cpus": ("dra.cpu", "cpudevnuma001"),
        "gpu": ("gpu.example.com", "gpu-1"),
        "nic": ("dra.net", "eth1"),
    }
    assert {d["pool"] for d in claim["devices"]} == {"demo-node"}
    cpus = CPUSet.parse(claim["cpus"])
    assert len(cpus) == 8
    assert cpus <= root_cpus(gpu_root(example_docs(), "gpu-1"))


def test_a_constraint_that_cannot_be_met_exits_1_with_one_line(tmp_path: Path) -> None:
    # Move the only NIC on the GPU's root elsewhere: no root holds a GPU and a NIC.
    scenario = tmp_path / "apart.yaml"
    scenario.write_text(
        EXAMPLE.read_text().replace(
            "string: pci0000:85\n      dra.net", "string: pci0000:ae\n      dra.net"
        )
    )
    proc = demo("--expose-pcie-roots", scenario=scenario)
    assert proc.returncode == 1, proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        "dracpu demo: claim default/gpu-cpu-nic-claim: constraint matchAttribute "
        '"resource.kubernetes.io/pcieRoot" (cpus, gpu, nic): no set of free devices that '
        "share one value of it on demo-node"
    ]
    claim = json.loads(proc.stdout)["claims"]["default/gpu-cpu-nic-claim"]
    assert claim["devices"] == [] and claim["cpus"] == ""


def test_without_pcie_roots_the_cpus_cannot_join_the_constraint() -> None:
    proc = demo(scenario=EXAMPLE)
    assert proc.returncode == 1, proc.stderr + proc.stdout
    assert proc.stderr.strip().splitlines() == [
        "dracpu demo: claim default/gpu-cpu-nic-claim: constraint matchAttribute "
        '"resource.kubernetes.io/pcieRoot" (cpus, gpu, nic): no device for request "cpus" '
        "on demo-node has this attribute"
    ]


def test_slices_of_another_node_are_noted_and_not_used(tmp_path: Path) -> None:
    docs = example_docs()
    for doc in docs:
        if doc["kind"] == "ResourceSlice":
            doc["spec"]["nodeName"] = "worker-3"
    scenario = tmp_path / "elsewhere.yaml"
    scenario.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    proc = demo("--expose-pcie-roots", scenario=scenario)
    assert proc.returncode == 1, proc.stderr + proc.stdout
    assert 'request "gpu": no device in class gpu.example.com on demo-node' in proc.stderr
    notes = json.loads(proc.stdout)["notes"]
    assert notes == [
        f"{scenario}: document 5 (ResourceSlice demo-node-gpu.example.com) is for node "
        "worker-3, not the simulated node demo-node: no claim here gets its devices (leave "
        "spec.nodeName out to put them on this node)",
        f"{scenario}: document 6 (ResourceSlice demo-node-dra.net) is for node worker-3, not "
        "the simulated node demo-node: no claim here gets its devices (leave spec.nodeName "
        "out to put them on this node)",
    ]
