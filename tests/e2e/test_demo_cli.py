"""`dracpu demo --output json` end to end: the real daemon on the simulated node.

Each run starts `dracpu run` as a child process against the simulated API server, kubelet,
scheduler and NRI runtime, applies the built-in scenario and reads the cpusets back from
the runtime's cgroup tree.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from dracpu.cpuset import CPUSet
from dracpu.topology.discover import discover_from_root

FIXTURES = Path(__file__).parents[1] / "fake_sysfs"
REPO = Path(__file__).parents[2]


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dracpu", "demo", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("fixture", "mode", "cgroup"),
    [
        ("xeon-2s-ht", "grouped", ("1", "cgroupfs")),
        ("xeon-2s-ht", "grouped", ("2", "systemd")),
        ("epyc-nps4", "individual", ("2", "systemd")),
        ("intel-hybrid", "grouped", ("1", "systemd")),
        ("intel-hybrid", "grouped", ("2", "cgroupfs")),
    ],
    ids=lambda v: f"v{v[0]}-{v[1]}" if isinstance(v, tuple) else v,
)
def test_demo_json_on_fixtures(fixture: str, mode: str, cgroup: tuple[str, str]) -> None:
    root = FIXTURES / fixture
    topo = discover_from_root(root)
    version, driver = cgroup
    proc = run_demo(
        "--sysfs-root",
        str(root),
        "--cpu-device-mode",
        mode,
        "--output",
        "json",
        "--cgroup-version",
        version,
        "--cgroup-driver",
        driver,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = json.loads(proc.stdout)
    assert list(doc) == ["slices", "claims", "containers", "notes"]
    assert doc["notes"] == []
    devices = [d["name"] for s in doc["slices"] for d in s["spec"]["devices"]]
    if mode == "individual":
        # No --reserved-cpus: the core of the lowest CPU is the shared pool's floor, never
        # a device (allocation/floor.py).
        floor = topo.cpus[min(topo.online - topo.isolated)].thread_siblings
        assert len(devices) == topo.num_cpus - len(floor)
    else:
        assert devices == [f"cpudevnuma{n:03d}" for n in sorted(topo.by_numa)]
    claims = {k: CPUSet.parse(v["cpus"]) for k, v in doc["claims"].items()}
    assert all(v["error"] is None for v in doc["claims"].values())
    assert list(claims) == [
        "default/numa-pinned",
        "default/full-cores",
        "default/grouped",
        "default/short-lived",
    ]
    # The pod of short-lived was deleted: its claim holds nothing any more.
    assert claims["default/short-lived"] == CPUSet()
    held = [c for k, c in claims.items() if k != "default/short-lived"]
    assert sum(len(c) for c in held) == len(_union(held)), "a CPU is in two claims"
    assert len(claims["default/numa-pinned"]) == 2
    last_numa = max(topo.by_numa)
    assert claims["default/numa-pinned"] <= topo.by_numa[last_numa]
    threads = topo.cpus_per_core
    assert len(claims["default/full-cores"]) == 2 * threads
    if mode == "grouped":
        # fullPCPUsOnly: whole physical cores only.
        for cpu in claims["default/full-cores"]:
            assert topo.cpus[cpu].thread_siblings <= claims["default/full-cores"]
    # Every container runs where its claim says; the plain pod gets everything else.
    ctrs = {k: CPUSet.parse(v) for k, v in doc["containers"].items()}
    assert ctrs["default/pinned/app"] == claims["default/numa-pinned"]
    assert ctrs["default/fullcore/app"] == claims["default/full-cores"]
    assert ctrs["default/worker/app"] == claims["default/grouped"]
    assert ctrs["default/plain/app"] == topo.all_cpus - _union(held)
    assert "default/short-lived/app" not in ctrs


def _union(sets: list[CPUSet]) -> CPUSet:
    out = CPUSet()
    for s in sets:
        out |= s
    return out


def test_demo_text_report_and_unsatisfiable_scenario(tmp_path: Path) -> None:
    scenario = tmp_path / "big.yaml"
    scenario.write_text(
        """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: huge}
spec:
  devices:
    requests:
    - name: cpus
      exactly: {deviceClassName: dra.cpu, capacity: {requests: {dra.cpu/cpu: "500"}}}
---
apiVersion: v1
kind: Pod
metadata: {name: greedy}
spec:
  resourceClaims: [{name: cpus, resourceClaimName: huge}]
  containers: [{name: app, resources: {claims: [{name: cpus}]}}]
---
apiVersion: v1
kind: Pod
metadata: {name: plain}
spec:
  containers: [{name: app}]
"""
    )
    proc = run_demo("--sysfs-root", str(FIXTURES / "xeon-2s-ht"), "--scenario", str(scenario))
    assert proc.returncode == 1, proc.stdout
    assert "dracpu demo: claim default/huge: " in proc.stderr
    assert "500" in proc.stderr.split("claim default/huge: ", 1)[1]
    # Each problem once, and its subject named once.
    assert proc.stderr.count("claim default/huge") == 1, proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    out = proc.stdout
    assert "pod default/plain running: app=0-79" in out
    assert "pod default/greedy not running: " in out
    assert "CPU map:" in out and "shared pool" in out
    assert "  default/huge" in out and "not allocated: " in out


def _without_volatile(value: object) -> object:
    """The document minus what differs between runs by nature: timestamps and UIDs (the
    claims' status.devices conditions say when dracpu prepared the claim; a share of a
    device is named by a UID the scheduler makes)."""
    if isinstance(value, dict):
        return {
            k: _without_volatile(v)
            for k, v in value.items()
            if k
            not in ("uid", "creationTimestamp", "resourceVersion", "lastTransitionTime", "shareID")
        }
    if isinstance(value, list):
        return [_without_volatile(v) for v in value]
    return value


def test_demo_json_is_the_same_on_every_run() -> None:
    args = ("--sysfs-root", str(FIXTURES / "xeon-2s-ht"), "--output", "json")
    first, second = run_demo(*args), run_demo(*args)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert _without_volatile(json.loads(first.stdout)) == _without_volatile(
        json.loads(second.stdout)
    )


def test_demo_on_a_tiny_node_notes_every_claim_left_out() -> None:
    proc = run_demo("--sysfs-root", str(FIXTURES / "vm-1cpu"), "--output", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["claims"] == {}
    left_out = [n for n in doc["notes"] if " left out: " in n]
    assert [n.split(" ", 2)[1] for n in left_out] == [
        "numa-pinned",
        "full-cores",
        "grouped",
        "short-lived",
    ]
    assert "--sysfs-root tests/fake_sysfs/xeon-2s-ht" in doc["notes"][-1]
    assert doc["containers"] == {"default/plain/app": "0"}


def test_demo_bad_scenario_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n")
    proc = run_demo("--scenario", str(bad))
    assert proc.returncode == 1
    assert proc.stderr == (
        f"dracpu: {bad}: document 1 (Deployment d): spec.template must be a pod template\n"
    )


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--cgroup-version", "3", "argument --cgroup-version: must be 1 or 2, got '3'"),
        ("--cgroup-driver", "sd", "argument --cgroup-driver: invalid choice: 'sd'"),
    ],
)
def test_demo_bad_cgroup_flag_is_one_line(flag: str, value: str, message: str) -> None:
    proc = run_demo(flag, value)
    assert proc.returncode == 2
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"dracpu: demo: {message}")


def _keep_running_demo() -> subprocess.Popen[str]:
    """`dracpu demo --keep-running` on the two-socket shape, its output read as text."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dracpu",
            "demo",
            "--sysfs-root",
            str(FIXTURES / "xeon-2s-ht"),
            "--keep-running",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_keep_running_serves_until_interrupted() -> None:
    proc = _keep_running_demo()
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("  sockets:"):
                break
        text = "".join(lines)
        assert "Running until Ctrl-C. Work directory /tmp/dracpu-demo-" in text
        workdir = text.split("Work directory ", 1)[1].split("\n", 1)[0]
        debug_url = text.split("  debug state:    ", 1)[1].split("/debug/state", 1)[0]
        pid = int(text.split("dracpu run (pid ", 1)[1].split(")", 1)[0])
        state = json.loads(urllib.request.urlopen(debug_url + "/debug/state", timeout=10).read())
        assert set(state["ready"].values()) == {True}
        assert Path(workdir, "kubelet", "plugins_registry", "dra.cpu-reg.sock").exists()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout.read() == "Stopping the daemon and the simulated node.\n"
    finally:
        if proc.poll() is None:
            proc.kill()
    # The daemon stopped with the demo and the work directory is gone.
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert not Path(workdir).exists()


# -- issue 26: the demo's report and its errors ------------------------------------------------

UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_a_misspelt_field_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    scenario = tmp_path / "typo.yaml"
    scenario.write_text(
        (REPO / "docs/examples/grouped-claim.yaml").read_text().replace("capacity:", "capacty:")
    )
    proc = run_demo("--sysfs-root", str(FIXTURES / "xeon-2s-ht"), "--scenario", str(scenario))
    assert proc.returncode == 1
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"dracpu: {scenario}: document 1 (ResourceClaim four-cpus): unknown ")
    assert '"spec.devices.requests[0].exactly.capacty"' in line


def _stamped(out: str, needle: str) -> list[float]:
    """The elapsed times of the progress lines that contain ``needle``."""
    return [float(ln[1:6]) for ln in out.splitlines() if ln.startswith("[") and needle in ln]


def test_pods_that_cannot_start_fail_fast(tmp_path: Path) -> None:
    docs = []
    for i in range(4):
        docs.append(
            f"apiVersion: v1\nkind: Pod\nmetadata: {{name: greedy-{i}}}\nspec:\n"
            f"  resourceClaims: [{{name: cpus, resourceClaimName: huge-{i}}}]\n"
            "  containers: [{name: app, resources: {claims: [{name: cpus}]}}]\n"
        )
        # Claims after the pods: documents may come in any order.
        docs.append(
            f"apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: huge-{i}}}\n"
            "spec:\n  devices:\n    requests:\n    - name: cpus\n      exactly:\n"
            "        deviceClassName: dra.cpu\n"
            '        capacity: {requests: {dra.cpu/cpu: "500"}}\n'
        )
    scenario = tmp_path / "greedy.yaml"
    scenario.write_text("---\n".join(docs[0::2] + docs[1::2]))
    proc = run_demo("--sysfs-root", str(FIXTURES / "xeon-2s-ht"), "--scenario", str(scenario))
    assert proc.returncode == 1, proc.stderr
    applied = _stamped(proc.stdout, "applied scenario")
    refused = _stamped(proc.stdout, " not running: ")
    assert len(applied) == 1 and len(refused) == 4, proc.stdout
    # Each one used to cost a second's second look; now the scheduler's word is final.
    assert refused[-1] - applied[0] < 2.0, proc.stdout
    assert len(proc.stderr.splitlines()) == 4
    assert all("500" in line for line in proc.stderr.splitlines())


def test_errors_name_pods_not_uids(tmp_path: Path) -> None:
    # Two pods whose containers use one claim: the daemon binds it to the first container
    # and refuses the second, naming the holder by UID.
    scenario = tmp_path / "shared.yaml"
    scenario.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: first}\nspec:\n"
        "  resourceClaims: [{name: cpus, resourceClaimName: two}]\n"
        "  containers: [{name: app, resources: {claims: [{name: cpus}]}}]\n"
        "---\napiVersion: v1\nkind: Pod\nmetadata: {name: second}\nspec:\n"
        "  resourceClaims: [{name: cpus, resourceClaimName: two}]\n"
        "  containers: [{name: app, resources: {claims: [{name: cpus}]}}]\n"
        "---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: two}\n"
        "spec:\n  devices:\n    requests:\n    - name: cpus\n      exactly:\n"
        "        deviceClassName: dra.cpu\n"
        '        capacity: {requests: {dra.cpu/cpu: "2"}}\n'
    )
    proc = run_demo("--sysfs-root", str(FIXTURES / "xeon-2s-ht"), "--scenario", str(scenario))
    assert proc.returncode == 1, proc.stdout
    assert "pod default/first running" in proc.stdout
    [line] = proc.stderr.splitlines()
    assert line.startswith("dracpu demo: claim default/two: "), line
    assert "already bound to pod default/first" in line, line
    # The claim is held (by the first pod): the report says so, and that a user failed.
    [row] = [ln for ln in proc.stdout.splitlines() if ln.startswith("  default/two ")]
    assert "not allocated" not in row and "; a pod using it did not start: " in row, row
    assert not UID.search(proc.stderr + proc.stdout), proc.stderr


def test_shared_pool_access_is_told_apart() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dracpu",
            "demo",
            "--sysfs-root",
            "tests/fake_sysfs/xeon-2s-ht",
            "--scenario",
            "docs/examples/shared-pool-access.yaml",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("  default/packet-processor/")]
    fields = line.split()
    assert fields[1:5] == ["exclusive", "+", "shared", "pool"], line
    cpus, claimed, pool = (
        CPUSet.parse(fields[5]),
        CPUSet.parse(fields[7]),
        CPUSet.parse(fields[11][:-1]),
    )
    assert len(claimed) == 4 and cpus == claimed | pool and not claimed & pool, line
    assert "(claimed" in line and "+ shared pool" in line


def test_a_daemon_that_dies_midway_is_one_line() -> None:
    proc = _keep_running_demo()
    kept = ""
    try:
        assert proc.stdout is not None and proc.stderr is not None
        text = ""
        for line in proc.stdout:
            text += line
            if line.startswith("  sockets:"):
                break
        pid = int(text.split("dracpu run (pid ", 1)[1].split(")", 1)[0])
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == 1
        [line] = proc.stderr.read().splitlines()
        assert line.startswith(
            f"dracpu: demo: dracpu run (pid {pid}) was killed by SIGKILL while the demo was running"
        ), line
        kept = line.rsplit("; its log: ", 1)[1]
        assert kept.startswith("/tmp/dracpu-demo-daemon-") and Path(kept).stat().st_size > 0
        assert "URLError" not in line and "Traceback" not in line
    finally:
        if proc.poll() is None:
            proc.kill()
        if kept:
            Path(kept).unlink(missing_ok=True)
