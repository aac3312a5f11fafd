"""Demo scenarios: parsing ordinary Kubernetes YAML, its errors, and the built-in scenario."""

from __future__ import annotations

from pathlib import Path

import pytest

from dracpu.demo.scenario import (
    ScenarioError,
    default_scenario,
    load_scenario,
    parse_scenario,
    scenario_yaml,
)
from dracpu.topology.discover import discover_from_root

FIXTURES = Path(__file__).parents[1] / "fake_sysfs"

CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: four}
spec:
  devices:
    requests:
    - name: cpus
      exactly: {deviceClassName: dra.cpu, capacity: {requests: {dra.cpu/cpu: "4"}}}
"""
POD = """
apiVersion: v1
kind: Pod
metadata: {name: p, annotations: {demo.dracpu.io/delete-after-start: "true"}}
spec:
  resourceClaims: [{name: cpus, resourceClaimName: four}]
  containers:
  - name: c
    resources: {claims: [{name: cpus}]}
"""


def test_parse_valid_stream_defaults_namespace_and_finds_deletions() -> None:
    sc = parse_scenario(CLAIM + "---" + POD)
    assert [c["metadata"]["name"] for c in sc.claims] == ["four"]
    assert sc.pods[0]["metadata"]["namespace"] == "default"
    assert sc.pods_to_delete() == [("default", "p")]
    # Round trip through YAML gives the same scenario.
    again = parse_scenario(scenario_yaml(sc))
    assert again.claims == sc.claims and again.pods == sc.pods


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "s: no documents"),
        ("a: [", "s: not valid YAML"),
        ("- 1", "s: document 1: expected a mapping, got list"),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}",
            "s: document 1 (Deployment d): unsupported apiVersion/kind apps/v1/Deployment",
        ),
        ("apiVersion: v1\nkind: Pod\nmetadata: {}", "s: document 1: metadata.name is required"),
        (
            CLAIM + "---" + CLAIM,
            "s: document 2 (ResourceClaim four): ResourceClaim default/four defined twice",
        ),
        (
            CLAIM.replace("requests:\n    - name: cpus", "requests: []\n    x:\n    - name: c"),
            "spec.devices.requests must be a non-empty list",
        ),
        (POD, "ResourceClaim default/four is not defined earlier in the scenario"),
        (
            CLAIM + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: q}\nspec: {containers: []}",
            "document 2 (Pod q): a pod needs at least one container",
        ),
        (
            CLAIM
            + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: q}\nspec:\n"
            + "  containers: [{name: c, resources: {claims: [{name: other}]}}]",
            "container c uses claim {'name': 'other'}, which is not in spec.resourceClaims",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: q}\nspec:\n"
            + "  resourceClaims: [{name: x, resourceClaimTemplateName: t}]\n"
            + "  containers: [{name: c}]",
            "resourceClaims[x] must name a ResourceClaim (resourceClaimName); claim templates "
            "are not supported by the demo",
        ),
    ],
)
def test_bad_scenarios_say_which_document_and_why(text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "s")
    assert message in str(info.value)


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"cannot read scenario .*/nope.yaml: No such file"):
        load_scenario(str(tmp_path / "nope.yaml"))


def test_default_scenario_on_a_two_socket_server() -> None:
    topo = discover_from_root(FIXTURES / "xeon-2s-ht")
    sc = default_scenario(topo, mode="grouped", group_by="numanode", reserved=0)
    assert [c["metadata"]["name"] for c in sc.claims] == [
        "numa-pinned",
        "full-cores",
        "grouped",
        "short-lived",
    ]
    assert [p["metadata"]["name"] for p in sc.pods] == [
        "pinned",
        "fullcore",
        "worker",
        "short-lived",
        "plain",
    ]
    pinned = sc.claims[0]["spec"]["devices"]["requests"][0]["exactly"]
    assert pinned["capacity"] == {"requests": {"dra.cpu/cpu": "2"}}
    assert pinned["selectors"] == [
        {"cel": {"expression": 'device.attributes["resource.kubernetes.io"].numaNode == 1'}}
    ]
    full = sc.claims[1]["spec"]["devices"]
    assert full["requests"][0]["exactly"]["capacity"]["requests"]["dra.cpu/cpu"] == "4"
    assert full["config"][0]["opaque"]["parameters"]["fullPCPUsOnly"] is True
    assert sc.pods_to_delete() == [("default", "short-lived")]
    assert sc.notes == []
    # The built-in scenario passes the same checks as a user's file.
    parse_scenario(scenario_yaml(sc))


def test_default_scenario_individual_mode_uses_count() -> None:
    topo = discover_from_root(FIXTURES / "epyc-nps4")
    sc = default_scenario(topo, mode="individual", group_by="numanode", reserved=0)
    exact = sc.claims[0]["spec"]["devices"]["requests"][0]["exactly"]
    assert exact["count"] == 2 and "capacity" not in exact
    assert "config" not in sc.claims[1]["spec"]["devices"]


def test_default_scenario_shrinks_on_a_tiny_node() -> None:
    topo = discover_from_root(FIXTURES / "vm-1cpu")
    sc = default_scenario(topo, mode="grouped", group_by="numanode", reserved=0)
    assert sc.claims == []
    assert [p["metadata"]["name"] for p in sc.pods] == ["plain"]
    assert sc.notes[0] == (
        "claim numa-pinned (1 CPUs) left out: the node has 0 CPU(s) left for claims"
    )


def test_default_scenario_machine_grouping_has_no_claims() -> None:
    topo = discover_from_root(FIXTURES / "xeon-2s-ht")
    sc = default_scenario(topo, mode="grouped", group_by="machine", reserved=0)
    assert sc.claims == []
    assert all("machine grouping takes cpusets from an external scheduler" in n for n in sc.notes)
