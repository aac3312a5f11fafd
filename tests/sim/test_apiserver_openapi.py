"""OpenAPI v3 of the simulated API server: the document shapes kubectl reads, and the real
kubectl creating, applying and explaining against `dracpu sim apiserver` with its default
validation (no --validate=false)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dracpu_sim.apiserver import openapi
from dracpu_sim.apiserver.faults import CallCounter, FaultInjector
from dracpu_sim.apiserver.handler import Handler, Request
from dracpu_sim.apiserver.store import ObjectStore

REPO = Path(__file__).parents[2]


def _schema(doc: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    target = ref["allOf"][0]["$ref"] if "allOf" in ref else ref["$ref"]
    schema: dict[str, Any] = doc["components"]["schemas"][target.rsplit("/", 1)[1]]
    return schema


def test_root_lists_every_served_group_version() -> None:
    root = openapi.document("/openapi/v3")
    assert root is not None
    assert set(root["paths"]) == {"api/v1", "apis/resource.k8s.io/v1", "apis/apps/v1"}
    url = root["paths"]["apis/resource.k8s.io/v1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/apis/resource.k8s.io/v1?hash=")
    assert openapi.document("/openapi/v3/apis/batch/v1") is None


def test_patch_of_every_kind_takes_field_validation() -> None:
    # What kubectl's QueryParamVerifierV3 looks for before it leaves validation to the server.
    for gv, kinds in (
        (
            "apis/resource.k8s.io/v1",
            {"ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "DeviceClass"},
        ),
        ("api/v1", {"Pod", "Node"}),
        ("apis/apps/v1", {"Deployment"}),
    ):
        doc = openapi.document(f"/openapi/v3/{gv}")
        assert doc is not None and doc["openapi"].startswith("3.")
        found = set()
        for item in doc["paths"].values():
            op = item.get("patch")
            if op is None:
                continue
            assert "fieldValidation" in [p["name"] for p in op["parameters"]]
            found.add(op["x-kubernetes-group-version-kind"]["kind"])
        assert found == kinds


def test_resource_claim_schema_reaches_the_request_fields() -> None:
    doc = openapi.document("/openapi/v3/apis/resource.k8s.io/v1")
    assert doc is not None
    claim = doc["components"]["schemas"]["io.k8s.api.resource.v1.ResourceClaim"]
    assert claim["x-kubernetes-group-version-kind"] == [
        {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"}
    ]
    assert "metadata" in claim["properties"]
    spec = _schema(doc, claim["properties"]["spec"])
    devices = _schema(doc, spec["properties"]["devices"])
    request = _schema(doc, devices["properties"]["requests"]["items"])
    exactly = _schema(doc, request["properties"]["exactly"])
    assert set(exactly["properties"]) >= {"deviceClassName", "count", "capacity", "selectors"}
    assert exactly["properties"]["count"]["type"] == "integer"
    assert request["required"] == ["name"]
    assert claim["properties"]["metadata"]["allOf"][0]["$ref"].endswith(
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    )


def test_strict_field_validation_names_every_unknown_field() -> None:
    from dracpu_sim.apiserver.resources import resource_by_plural

    claims = resource_by_plural("resourceclaims")
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "annotations": {"any/key": "v"}},
        "spec": {
            "devices": {
                "requests": [{"name": "cpus", "exactly": {"deviceClassName": "dra.cpu"}}],
                # Opaque parameters are free-form.
                "config": [{"opaque": {"driver": "dra.cpu", "parameters": {"anything": 1}}}],
            }
        },
    }
    assert openapi.strict_problems(claims, claim) is None
    claim["spec"]["devices"]["requests"][0]["exactly"]["cuont"] = 2
    claim["spec"]["oops"] = True
    assert openapi.strict_problems(claims, claim) == (
        'ResourceClaim in version "v1" cannot be handled as a ResourceClaim: strict decoding '
        'error: unknown field "spec.devices.requests[0].exactly.cuont", unknown field '
        '"spec.oops"'
    )
    handler = Handler(ObjectStore(), FaultInjector(), CallCounter())
    target = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    body = json.dumps(claim).encode()
    refused = handler.handle(Request("POST", target + "?fieldValidation=Strict", {}, body))
    assert getattr(refused, "status", None) == 400
    # Without Strict (the daemon's and the simulator's own clients) the object is kept.
    kept = handler.handle(Request("POST", target, {}, body))
    assert getattr(kept, "status", None) == 201


def test_handler_serves_the_documents() -> None:
    handler = Handler(ObjectStore(), FaultInjector(), CallCounter())
    for target in ("/openapi/v3", "/openapi/v3/api/v1?hash=ABC"):
        response = handler.handle(Request("GET", target, {}))
        assert getattr(response, "status", None) == 200, target
    missing = handler.handle(Request("GET", "/openapi/v3/apis/batch/v1", {}))
    assert getattr(missing, "status", None) == 404


# -- the real kubectl --------------------------------------------------------------------------


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[Path]:
    """`dracpu sim apiserver` as a user starts it; yields its kubeconfig."""
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dracpu", "sim", "apiserver", "--kubeconfig-out", str(kubeconfig)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("http://127.0.0.1:")
        yield kubeconfig
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    home = kubeconfig.parent
    env = {**os.environ, "HOME": str(home), "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), "--cache-dir", str(home / "cache"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=REPO,
    )


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_create_apply_explain(apiserver: Path) -> None:
    created = kubectl(apiserver, "create", "-f", "docs/examples/grouped-claim.yaml")
    assert (created.returncode, created.stderr) == (0, "")
    assert created.stdout.splitlines() == [
        "resourceclaim.resource.k8s.io/four-cpus created",
        "pod/pinned created",
    ]
    applied = kubectl(apiserver, "apply", "-f", "docs/examples/full-cores-claim.yaml")
    assert (applied.returncode, applied.stderr) == (0, "")
    assert applied.stdout.splitlines() == [
        "resourceclaim.resource.k8s.io/eight-whole-cores created",
        "pod/whole-cores created",
    ]
    again = kubectl(apiserver, "apply", "-f", "docs/examples/full-cores-claim.yaml")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        "resourceclaim.resource.k8s.io/eight-whole-cores unchanged",
        "pod/whole-cores unchanged",
    ]
    # A changed manifest is patched (client-side apply keeps its last-applied annotation).
    changed = (
        (REPO / "docs/examples/full-cores-claim.yaml")
        .read_text()
        .replace("  name: whole-cores\n", "  name: whole-cores\n  labels: {tier: batch}\n")
    )
    manifest = apiserver.parent / "changed.yaml"
    manifest.write_text(changed)
    patched = kubectl(apiserver, "apply", "-f", str(manifest))
    assert patched.returncode == 0, patched.stderr
    assert "pod/whole-cores configured" in patched.stdout.splitlines()
    label = kubectl(apiserver, "get", "pod", "whole-cores", "-o", "jsonpath={.metadata.labels}")
    assert label.stdout == '{"tier":"batch"}'
    explained = kubectl(apiserver, "explain", "resourceclaim.spec")
    assert explained.returncode == 0, explained.stderr
    assert "KIND:       ResourceClaim" in explained.stdout
    assert "FIELD: spec <ResourceClaimSpec>" in explained.stdout
    assert "devices\t<DeviceClaim>" in explained.stdout
    deep = kubectl(apiserver, "explain", "resourceclaim.spec.devices.requests.exactly.count")
    assert deep.returncode == 0, deep.stderr
    assert "FIELD: count <integer>" in deep.stdout


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_refuses_a_misspelt_field(apiserver: Path) -> None:
    manifest = apiserver.parent / "typo.yaml"
    manifest.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: typo}\n"
        "spec:\n  devices:\n    requestz: []\n"
    )
    proc = kubectl(apiserver, "create", "-f", str(manifest))
    assert proc.returncode == 1
    assert 'strict decoding error: unknown field "spec.devices.requestz"' in proc.stderr
    assert kubectl(apiserver, "get", "resourceclaims", "-o", "name").stdout == ""


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_creates_a_claim_template(apiserver: Path) -> None:
    template = apiserver.parent / "template.yaml"
    template.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: t}\n"
        "spec:\n  spec:\n    devices:\n      requests:\n      - name: cpus\n"
        "        exactly: {deviceClassName: dra.cpu, count: 2}\n"
    )
    created = kubectl(apiserver, "create", "-f", str(template))
    assert (created.returncode, created.stdout) == (
        0,
        "resourceclaimtemplate.resource.k8s.io/t created\n",
    ), created.stderr
    listed = kubectl(apiserver, "get", "resourceclaimtemplates", "-o", "name")
    assert listed.stdout == "resourceclaimtemplate.resource.k8s.io/t\n"
