"""Demo scenarios: parsing ordinary Kubernetes YAML, its errors, and the built-in scenario."""

from __future__ import annotations

from pathlib import Path

import pytest

from dracpu.topology.discover import discover_from_root
from dracpu_sim.demo.scenario import (
    ScenarioError,
    default_scenario,
    load_scenario,
    parse_scenario,
    scenario_yaml,
)

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
TEMPLATE = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: t}
spec:
  spec:
    devices:
      requests:
      - name: cpus
        exactly: {deviceClassName: dra.cpu, count: 2}
"""
DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: team}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      resourceClaims: [{name: cpus, resourceClaimTemplateName: t}]
      containers: [{name: c, resources: {claims: [{name: cpus}]}}]
"""


def test_templates_and_deployments() -> None:
    sc = parse_scenario(
        TEMPLATE.replace("{name: t}", "{name: t, namespace: team}") + "---" + DEPLOYMENT
    )
    assert [t["metadata"]["name"] for t in sc.templates] == ["t"]
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in sc.pods] == [
        ("team", "web-0"),
        ("team", "web-1"),
        ("team", "web-2"),
    ]
    assert sc.pods[0]["metadata"]["labels"] == {"app": "web"}
    assert sc.pods[0]["spec"]["resourceClaims"] == [
        {"name": "cpus", "resourceClaimTemplateName": "t"}
    ]
    # A template lives in the pod's namespace.
    with pytest.raises(ScenarioError, match="ResourceClaimTemplate team/t is not in the scenario"):
        parse_scenario(TEMPLATE + "---" + DEPLOYMENT)


def test_every_docs_example_parses() -> None:
    for example in sorted((Path(__file__).parents[2] / "docs" / "examples").glob("*.yaml")):
        sc = load_scenario(str(example))
        assert sc.pods, example.name


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
            "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: d}",
            "s: document 1 (StatefulSet d): unsupported apiVersion/kind apps/v1/StatefulSet; a "
            "scenario holds v1 Pods, resource.k8s.io/v1 ResourceClaims and "
            "ResourceClaimTemplates, apps/v1 Deployments, and other drivers' "
            "resource.k8s.io/v1 DeviceClasses and ResourceSlices",
        ),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}",
            "s: document 1 (Deployment d): spec.template must be a pod template",
        ),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n"
            "spec: {replicas: -1, template: {spec: {containers: [{name: c}]}}}",
            "spec.replicas must be a whole number from 0 to 64",
        ),
        (
            TEMPLATE + "---" + TEMPLATE,
            "s: document 2 (ResourceClaimTemplate t): ResourceClaimTemplate default/t defined "
            "twice",
        ),
        (
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: t}\n"
            "spec: {spec: {devices: {}}}",
            "spec.spec.devices.requests must be a non-empty list",
        ),
        ("apiVersion: v1\nkind: Pod\nmetadata: {}", "s: document 1: metadata.name is required"),
        (
            CLAIM + "---" + CLAIM,
            "s: document 2 (ResourceClaim four): ResourceClaim default/four defined twice",
        ),
        (
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: four}\n"
            "spec: {devices: {requests: []}}",
            "spec.devices.requests must be a non-empty list",
        ),
        (POD, "ResourceClaim default/four is not in the scenario"),
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
            "ResourceClaimTemplate default/t is not in the scenario",
        ),
        (
            CLAIM
            + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: q}\nspec:\n"
            + "  resourceClaims:\n"
            + "  - {name: x, resourceClaimName: four, resourceClaimTemplateName: t}\n"
            + "  containers: [{name: c}]",
            "resourceClaims[x] must set exactly one of resourceClaimName and "
            "resourceClaimTemplateName",
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
    # The node's one CPU is the shared pool's floor: the daemon publishes nothing.
    sc = default_scenario(topo, mode="grouped", group_by="numanode", reserved=1)
    assert sc.claims == []
    assert [p["metadata"]["name"] for p in sc.pods] == ["plain"]
    assert sc.notes[0] == (
        "claim numa-pinned (1 CPUs) left out: 0 CPU(s) of this node's 1 are left for claims "
        "(the reserved CPUs, or one core, always stay in the shared pool)"
    )
    assert sc.notes[-1].startswith(
        "to see every claim kind, run the demo on a bigger machine shape: dracpu demo "
        "--sysfs-root tests/fake_sysfs/xeon-2s-ht"
    )


def test_default_scenario_socket_grouping_says_why_numa_pinned_is_left_out() -> None:
    topo = discover_from_root(FIXTURES / "xeon-2s-ht")
    sc = default_scenario(topo, mode="grouped", group_by="socket", reserved=0)
    assert [c["metadata"]["name"] for c in sc.claims] == ["full-cores", "grouped", "short-lived"]
    assert sc.notes == [
        "claim numa-pinned left out: with --group-by socket one device spans a whole socket, "
        "so a claim cannot select a NUMA node; run with --group-by numanode or "
        "--cpu-device-mode individual to see it"
    ]


def test_default_scenario_machine_grouping_has_no_claims() -> None:
    topo = discover_from_root(FIXTURES / "xeon-2s-ht")
    sc = default_scenario(topo, mode="grouped", group_by="machine", reserved=0)
    assert sc.claims == []
    assert all("machine grouping takes cpusets from an external scheduler" in n for n in sc.notes)
    # The NUMA-pinned claim too (it was dropped without a word).
    assert sc.notes[0].startswith("claim numa-pinned (2 CPUs) left out: machine grouping")


BUILT_IN_CLAIMS = ("numa-pinned", "full-cores", "grouped", "short-lived")


@pytest.mark.parametrize("fixture", ["xeon-2s-ht", "epyc-nps4", "intel-hybrid", "vm-1cpu"])
@pytest.mark.parametrize(
    ("mode", "group_by"),
    [
        ("grouped", "numanode"),
        ("grouped", "socket"),
        ("grouped", "machine"),
        ("individual", "numanode"),
    ],
)
def test_every_built_in_claim_is_there_or_has_a_note(
    fixture: str, mode: str, group_by: str
) -> None:
    topo = discover_from_root(FIXTURES / fixture)
    for reserved in (0, 1, topo.num_cpus):
        sc = default_scenario(topo, mode=mode, group_by=group_by, reserved=reserved)
        present = {c["metadata"]["name"] for c in sc.claims}
        for name in BUILT_IN_CLAIMS:
            noted = [n for n in sc.notes if n.startswith(f"claim {name} ") and " left out: " in n]
            assert (name in present) != bool(noted), (fixture, mode, group_by, reserved, name)


def test_documents_in_any_order() -> None:
    # As `kubectl apply -f` takes them: the pod first, its claim and template after.
    pod_with_both = POD.replace(
        "resourceClaims: [{name: cpus, resourceClaimName: four}]",
        "resourceClaims:\n  - {name: cpus, resourceClaimName: four}\n"
        "  - {name: more, resourceClaimTemplateName: t}",
    )
    sc = parse_scenario(
        pod_with_both
        + "---"
        + DEPLOYMENT.replace("team", "default")
        + "---"
        + CLAIM
        + "---"
        + TEMPLATE
    )
    assert [c["metadata"]["name"] for c in sc.claims] == ["four"]
    assert [t["metadata"]["name"] for t in sc.templates] == ["t"]
    # Pods keep the order they were given in.
    assert [p["metadata"]["name"] for p in sc.pods] == ["p", "web-0", "web-1", "web-2"]
    assert sc.origin(sc.pods[1]) == "scenario: document 2 (Deployment web)"
    assert sc.origin(sc.claims[0]) == "scenario: document 3 (ResourceClaim four)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            CLAIM.replace("capacity:", "capacty:"),
            "s: document 1 (ResourceClaim four): unknown field "
            '"spec.devices.requests[0].exactly.capacty" (not in the resource.k8s.io/v1 '
            "ResourceClaim schema)",
        ),
        (
            CLAIM.replace("capacity: {", "selector: [], capacity: {"),
            "s: document 1 (ResourceClaim four): unknown field "
            '"spec.devices.requests[0].exactly.selector"',
        ),
        (
            CLAIM + "---" + POD.replace("  - name: c\n", "  - name: c\n    imagee: x\n"),
            's: document 2 (Pod p): unknown field "spec.containers[0].imagee"',
        ),
        (
            TEMPLATE.replace("count: 2", "count: 2, cont: 1")
            + "---"
            + DEPLOYMENT.replace("replicas: 3", "replicas: 3\n  replcas: 2").replace(
                "team", "default"
            ),
            "s: document 1 (ResourceClaimTemplate t): unknown field "
            '"spec.spec.devices.requests[0].exactly.cont"',
        ),
        (
            DEPLOYMENT.replace("replicas: 3", "replicas: 3\n  replcas: 2"),
            's: document 1 (Deployment web): unknown field "spec.replcas"',
        ),
    ],
)
def test_a_misspelt_field_is_named_with_its_path(text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "s")
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)
