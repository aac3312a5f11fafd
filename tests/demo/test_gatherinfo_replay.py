"""`dracpu gatherinfo` saves the node's other drivers' ResourceSlices (and the cluster's
DeviceClasses) from the API server, so that `dracpu demo --sysfs-root <report>` replays
claims on the node with every driver's devices. Against the loopback simulated API server."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from dracpu.cpuset import CPUSet
from dracpu.gatherinfo import GatherinfoError, other_drivers_slices, read_bundle_objects
from dracpu_sim.apiserver import SimAPIServer
from dracpu_sim.apiserver.server import write_kubeconfig

REPO = Path(__file__).parents[2]
SHAPE = REPO / "tests" / "fake_sysfs" / "xeon-2s-ht"
EXAMPLE = REPO / "docs" / "examples" / "gpu-cpu-nic.yaml"


def _example() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]


def _cluster_objects(node: str) -> list[tuple[str, dict[str, Any]]]:
    """The example's classes and slices as the GPU and NIC drivers would have published
    them on ``node``, plus what gatherinfo must leave out: our own slice, another node's."""
    out: list[tuple[str, dict[str, Any]]] = []
    for doc in _example():
        if doc["kind"] == "DeviceClass":
            out.append(("deviceclasses", doc))
        elif doc["kind"] == "ResourceSlice":
            doc["spec"]["nodeName"] = node
            out.append(("resourceslices", doc))
    ours = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "ours"},
        "spec": {
            "driver": "dra.cpu",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "cpudevnuma000"}],
        },
    }
    elsewhere = json.loads(json.dumps(out[-1][1]))
    elsewhere["metadata"]["name"] = "elsewhere"
    elsewhere["spec"]["nodeName"] = "worker-9"
    return [*out, ("resourceslices", ours), ("resourceslices", elsewhere)]


def _claims_only(path: Path) -> Path:
    """The example's claim and pod, without the other drivers' documents: the bundle
    brings those."""
    docs = [d for d in _example() if d["kind"] in ("ResourceClaim", "Pod")]
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


async def _gatherinfo(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    (tmp_path / "host" / "proc").mkdir(parents=True, exist_ok=True)  # no daemon runs
    env = {**os.environ, "HOST_ROOT": str(tmp_path / "host")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = await trio.run_process(
        [
            sys.executable,
            "-m",
            "dracpu",
            "gatherinfo",
            "--stdout",
            "--sysfs-root",
            str(SHAPE),
            *args,
        ],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env,
    )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def test_only_other_drivers_slices_of_this_node_without_server_metadata() -> None:
    slices = [
        {"metadata": {"name": "b", "uid": "u", "resourceVersion": "3", "ownerReferences": [{}]},
         "spec": {"driver": "gpu.example.com", "nodeName": "n1"}},
        {"metadata": {"name": "a", "labels": {"x": "y"}},
         "spec": {"driver": "nic.example.com", "nodeName": "n1"}},
        {"metadata": {"name": "c"}, "spec": {"driver": "dra.cpu", "nodeName": "n1"}},
        {"metadata": {"name": "d"}, "spec": {"driver": "gpu.example.com", "nodeName": "n2"}},
        {"metadata": {"name": "e"}, "spec": {"driver": "gpu.example.com", "allNodes": True}},
    ]  # fmt: skip
    got = other_drivers_slices(slices, "n1", "dra.cpu")
    assert [s["metadata"] for s in got] == [{"name": "a", "labels": {"x": "y"}}, {"name": "b"}]
    assert {s["kind"] for s in got} == {"ResourceSlice"}


async def test_gatherinfo_saves_other_drivers_slices_and_the_demo_replays_them(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = SimAPIServer(seed=1)
    await nursery.start(server.serve)
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    for plural, obj in _cluster_objects("worker-3"):
        server.create(plural, obj)
    code, out, err = await _gatherinfo(
        tmp_path, "--kubeconfig", str(kubeconfig), "--node-name", "worker-3"
    )
    assert code == 0, err
    report = yaml.safe_load(out)
    assert [(s["metadata"]["name"], s["spec"]["driver"]) for s in report["resourceSlices"]] == [
        ("demo-node-dra.net", "dra.net"),
        ("demo-node-gpu.example.com", "gpu.example.com"),
    ]
    assert {s["spec"]["nodeName"] for s in report["resourceSlices"]} == {"worker-3"}
    assert all("uid" not in s["metadata"] for s in report["resourceSlices"])
    assert [c["metadata"]["name"] for c in report["deviceClasses"]] == [
        "dranet",
        "gpu.example.com",
    ]
    assert report["apiObjectsSource"] == (
        f"API server {server.url}: 2 ResourceSlice(s) of other drivers on node worker-3 "
        "(dra.net, gpu.example.com), 2 DeviceClass(es)"
    )
    assert f"dracpu gatherinfo: saved from the API server {server.url}" in err
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text(out)
    assert [len(part) for part in read_bundle_objects(bundle)] == [2, 2]

    # The node whole: its topology, its PCIe roots and the other drivers' devices.
    proc = await trio.run_process(
        [sys.executable, "-m", "dracpu", "demo", "--expose-pcie-roots", "--sysfs-root",
         str(bundle), "--scenario", str(_claims_only(tmp_path / "my-claims.yaml")),
         "--output", "json"],
        capture_stdout=True, capture_stderr=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    claim = json.loads(proc.stdout)["claims"]["default/gpu-cpu-nic-claim"]
    assert [(d["driver"], d["device"]) for d in claim["devices"]] == [
        ("dra.cpu", "cpudevnuma001"),
        ("gpu.example.com", "gpu-1"),
        ("dra.net", "eth1"),
    ]
    assert CPUSet.parse(claim["cpus"]) <= CPUSet.parse("20-39,60-79")  # pci0000:85's CPUs


async def test_an_unreachable_api_server_leaves_a_report_that_says_so(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    code, out, err = await _gatherinfo(
        tmp_path, "--kubeconfig", str(kubeconfig), "--node-name", "worker-3"
    )
    assert code == 0, err
    report = yaml.safe_load(out)
    assert "resourceSlices" not in report
    assert report["apiObjectsSource"].startswith(
        "not gathered: list ResourceSlices: connection to the API server failed"
    )
    lines = [ln for ln in err.splitlines() if "ResourceSlices" in ln]
    assert len(lines) == 1
    assert lines[0].startswith("dracpu gatherinfo: other drivers' ResourceSlices not saved: ")


async def test_without_a_way_to_the_api_server_only_the_report_says_so(tmp_path: Path) -> None:
    code, out, err = await _gatherinfo(tmp_path)
    assert code == 0, err
    assert "ResourceSlices" not in err
    assert yaml.safe_load(out)["apiObjectsSource"] == (
        "not gathered: no --kubeconfig, the running driver has none, and this is not a pod "
        "(KUBERNETES_SERVICE_HOST is unset)"
    )
    code, out, err = await _gatherinfo(tmp_path, "--no-api")
    assert code == 0, err
    assert "apiObjectsSource" not in yaml.safe_load(out)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("resourceSlices: 3", "resourceSlices must be a list of objects"),
        ("deviceClasses: [a]", "deviceClasses must be a list of objects"),
    ],
)
def test_a_bundle_with_a_bad_section_is_refused(tmp_path: Path, section: str, message: str) -> None:
    bundle = tmp_path / "b.yaml"
    bundle.write_text(f"---\nsysfs: {{}}\n{section}\n")
    with pytest.raises(GatherinfoError, match=message):
        read_bundle_objects(bundle)


async def test_forbidden_device_classes_keep_the_slices(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # The driver's own ServiceAccount may list ResourceSlices but not DeviceClasses.
    server = SimAPIServer(seed=1)
    await nursery.start(server.serve)
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    for plural, obj in _cluster_objects("worker-3"):
        server.create(plural, obj)
    server.faults.inject(
        "list", "deviceclasses", status=403, message='deviceclasses is forbidden: User "x"'
    )
    code, out, err = await _gatherinfo(
        tmp_path, "--kubeconfig", str(kubeconfig), "--node-name", "worker-3"
    )
    assert code == 0, err
    report = yaml.safe_load(out)
    assert len(report["resourceSlices"]) == 2
    assert "deviceClasses" not in report
    assert report["apiObjectsSource"].startswith(
        f"API server {server.url}: 2 ResourceSlice(s) of other drivers on node worker-3 "
        "(dra.net, gpu.example.com); no DeviceClasses: list DeviceClasses: "
    )
    assert "forbidden" in report["apiObjectsSource"]
