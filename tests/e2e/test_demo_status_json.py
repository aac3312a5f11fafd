"""Acceptance (issue 27): `dracpu demo --output json` shows each claim's status under
claims.<ns/name>.status as read back from the API server: dracpu's status.devices entries,
one per device of ours in the allocation, whose data holds the cpuset in the Linux list
format, equal to the cpuset of the container that uses the claim."""

from __future__ import annotations

import json

import pytest
from test_demo_cli import FIXTURES, run_demo

from dracpu.cpuset import CPUSet


@pytest.mark.parametrize("mode", ["grouped", "individual"])
def test_demo_json_has_each_claims_status_with_the_containers_cpuset(mode: str) -> None:
    proc = run_demo(
        "--sysfs-root",
        str(FIXTURES / "xeon-2s-ht"),
        "--cpu-device-mode",
        mode,
        "--output",
        "json",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    held = {key: c for key, c in doc["claims"].items() if c["cpus"]}
    assert held, doc["claims"]
    for key, claim in held.items():
        ours = [e for e in claim["status"]["devices"] if e["driver"] == "dra.cpu"]
        allocated = [(d["pool"], d["device"]) for d in claim["devices"] if d["driver"] == "dra.cpu"]
        assert sorted((e["pool"], e["device"]) for e in ours) == sorted(allocated), key
        for entry in ours:
            assert entry["data"]["cpuset"] == CPUSet.parse(claim["cpus"]).format(), key
            (ready,) = [c for c in entry["conditions"] if c["type"] == "Ready"]
            assert ready["status"] == "True"
    # Each claim's status names the cpuset a container of the scenario runs on (the
    # built-in scenario's claims are exclusive: the container gets exactly the claim's CPUs).
    running = {CPUSet.parse(cpus) for cpus in doc["containers"].values()}
    for key, claim in held.items():
        for entry in claim["status"]["devices"]:
            if entry["driver"] == "dra.cpu":
                assert CPUSet.parse(entry["data"]["cpuset"]) in running, key
