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

from dracpu.cli.common import CLIError
from dracpu.cli.gatherinfo import cmd_gatherinfo
from dracpu.cpuset import CPUSet
from dracpu.gatherinfo import (
    GatherinfoError,
    driver_kubeconfig,
    gather_api_objects_within,
    other_drivers_slices,
    path_in_process,
    read_bundle_objects,
)
from dracpu_sim.apiserver import SimAPIServer
from dracpu_sim.apiserver.server import kubeconfig_document, write_kubeconfig

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


async def _serve_cluster(nursery: trio.Nursery, node: str) -> SimAPIServer:
    """A simulated API server, serving in ``nursery``, holding ``_cluster_objects(node)``."""
    server = SimAPIServer(seed=1)
    await nursery.start(server.serve)
    for plural, obj in _cluster_objects(node):
        server.create(plural, obj)
    return server


async def _gatherinfo(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    (tmp_path / "host" / "proc").mkdir(parents=True, exist_ok=True)  # no daemon, unless made
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "HOST_ROOT": str(tmp_path / "host"), "TMPDIR": str(tmp_path / "tmp")}
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
    server = await _serve_cluster(nursery, "worker-3")
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
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
    server = await _serve_cluster(nursery, "worker-3")
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
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


# -- the running driver's kubeconfig, and the API step's time limit ---------------------------

DRIVER_PID = 4242


def _driver_process(tmp_path: Path, *flags: str) -> Path:
    """A running driver under ``$HOST_ROOT/proc`` whose root (``/proc/PID/root``) is a
    directory of its own; returns that root."""
    proc = tmp_path / "host" / "proc" / str(DRIVER_PID)
    root = proc / "root"
    root.mkdir(parents=True)
    (proc / "comm").write_text("dracpu\n")
    (proc / "cmdline").write_bytes(b"\0".join([b"dracpu", *(f.encode() for f in flags)]) + b"\0")
    return root


def test_the_files_a_driver_kubeconfig_names_are_the_drivers(tmp_path: Path) -> None:
    root = _driver_process(tmp_path)
    (root / "etc" / "dracpu").mkdir(parents=True)
    config = {
        "clusters": [
            {"name": "a", "cluster": {"server": "https://x", "certificate-authority": "ca.crt"}},
            {"name": "b", "cluster": {"server": "https://y", "certificate-authority-data": "Q0E="}},
        ],
        "users": [
            {
                "name": "u",
                "user": {
                    "client-certificate": "/etc/pki/client.crt",
                    "client-key": "../pki/client.key",
                    "tokenFile": "token",
                },
            }
        ],
    }
    (root / "etc" / "dracpu" / "kubeconfig").write_text(yaml.safe_dump(config))
    resolve = path_in_process(tmp_path / "host" / "proc", DRIVER_PID)
    got = driver_kubeconfig("/etc/dracpu/kubeconfig", resolve)
    inside = str(root)
    assert got["clusters"][0]["cluster"]["certificate-authority"] == f"{inside}/etc/dracpu/ca.crt"
    assert got["clusters"][1]["cluster"] == {
        "server": "https://y",
        "certificate-authority-data": "Q0E=",
    }
    assert got["users"][0]["user"] == {
        "client-certificate": f"{inside}/etc/pki/client.crt",
        "client-key": f"{inside}/etc/dracpu/../pki/client.key",
        "tokenFile": f"{inside}/etc/dracpu/token",
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "read the running driver's kubeconfig /etc/kc: No such file or directory"),
        ("[1, 2]", "the running driver's kubeconfig /etc/kc is not a kubeconfig"),
        ("{a: [", "read the running driver's kubeconfig /etc/kc: "),
        (
            yaml.safe_dump({"users": [{"name": "u", "user": {"exec": {"command": "aws"}}}]}),
            "gets user 'u''s credentials from a plugin (exec), which would run here",
        ),
        (
            yaml.safe_dump({"users": [{"name": "g", "user": {"auth-provider": {"name": "gcp"}}}]}),
            "from a plugin (auth-provider)",
        ),
    ],
    ids=["missing", "not-a-mapping", "not-yaml", "exec", "auth-provider"],
)
def test_a_driver_kubeconfig_that_cannot_be_used_here_is_refused(
    tmp_path: Path, content: str | None, message: str
) -> None:
    root = _driver_process(tmp_path)
    if content is not None:
        (root / "etc").mkdir()
        (root / "etc" / "kc").write_text(content)
    resolve = path_in_process(tmp_path / "host" / "proc", DRIVER_PID)
    with pytest.raises(GatherinfoError) as info:
        driver_kubeconfig("/etc/kc", resolve)
    assert message in str(info.value)


async def test_gatherinfo_reaches_the_api_server_with_the_drivers_kubeconfig(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # The token file exists only in the driver's root: read from gatherinfo's own
    # filesystem, the client could not load the kubeconfig at all.
    server = await _serve_cluster(nursery, "worker-3")
    root = _driver_process(tmp_path, "--kubeconfig", "/etc/dracpu/kubeconfig")
    (root / "etc" / "dracpu").mkdir(parents=True)
    document = kubeconfig_document(server.url)
    document["users"][0]["user"] = {"tokenFile": "token"}
    (root / "etc" / "dracpu" / "kubeconfig").write_text(yaml.safe_dump(document))
    (root / "etc" / "dracpu" / "token").write_text("a-token")
    assert not Path("/etc/dracpu/token").exists()
    code, out, err = await _gatherinfo(tmp_path, "--node-name", "worker-3")
    assert code == 0, err
    report = yaml.safe_load(out)
    assert report["driverConfigSource"] == f"PID {DRIVER_PID}"
    assert report["apiObjectsSource"].startswith(f"API server {server.url}: 2 ResourceSlice(s)")
    assert len(report["resourceSlices"]) == 2
    # The temporary kubeconfig with the resolved paths is gone again.
    assert not list((tmp_path / "tmp").glob("dracpu-gatherinfo-kubeconfig-*"))


async def test_a_driver_kubeconfig_with_a_plugin_leaves_a_report_that_says_so(
    tmp_path: Path,
) -> None:
    root = _driver_process(tmp_path, "--kubeconfig", "/etc/kc")
    (root / "etc").mkdir()
    document = kubeconfig_document("http://127.0.0.1:9")
    document["users"][0]["user"] = {"exec": {"apiVersion": "v1", "command": "get-token"}}
    (root / "etc" / "kc").write_text(yaml.safe_dump(document))
    code, out, err = await _gatherinfo(tmp_path, "--node-name", "worker-3")
    assert code == 0, err
    assert yaml.safe_load(out)["apiObjectsSource"] == (
        "not gathered: the running driver's kubeconfig /etc/kc gets user 'dracpu-sim''s "
        "credentials from a plugin (exec), which would run here rather than in the driver's "
        "filesystem; pass --kubeconfig"
    )


async def test_a_credential_plugin_that_hangs_is_stopped_at_the_time_limit(tmp_path: Path) -> None:
    pidfile = tmp_path / "plugin.pid"
    document = kubeconfig_document("http://127.0.0.1:9")
    document["users"][0]["user"] = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "sh",
            "args": ["-c", f"echo $$ > {pidfile}; exec sleep 120"],
        }
    }
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(yaml.safe_dump(document))
    code, out, err = await _gatherinfo(
        tmp_path, "--kubeconfig", str(kubeconfig), "--node-name", "n", "--api-timeout", "8"
    )
    assert code == 0, err
    assert yaml.safe_load(out)["apiObjectsSource"] == (
        "not gathered: the API step did not finish within 8 s (API server or credential "
        "plugin not answering); stopped it"
    )
    # The plugin ran, and was killed with the step's process group.
    pid = int(pidfile.read_text())
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z", "X")


def test_the_time_limit_must_be_positive() -> None:
    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(CLIError, match="--api-timeout must be a number of seconds > 0"):
            cmd_gatherinfo(["--stdout", "--api-timeout", bad])
    with pytest.raises(GatherinfoError, match="must be > 0 seconds"):
        gather_api_objects_within(None, "n", "dra.cpu", deadline=0)
