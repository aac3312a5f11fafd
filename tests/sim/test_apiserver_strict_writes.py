"""Every write to the simulated API server is checked as a real one checks it: create,
update (PUT), merge / strategic merge / JSON patch and server-side apply refuse unknown
fields under ``fieldValidation=Strict`` (apply always), with the real texts, and leave the
stored object as it was; a ResourceClaim's spec and most of a Pod's spec cannot change;
apps/v1 Deployments are served. The real kubectl applies every docs/examples file whole."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_apiserver_openapi import REPO, apiserver, kubectl

from dracpu_sim.apiserver.faults import CallCounter, FaultInjector
from dracpu_sim.apiserver.handler import Handler, Request, Response
from dracpu_sim.apiserver.store import ObjectStore
from dracpu_sim.apiserver.strategic import strategic_merge_patch

__all__ = ["apiserver"]  # the fixture, shared with the OpenAPI tests

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates"
PODS = "/api/v1/namespaces/default/pods"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
TYPO = "spec.devices.requests[0].exactly.capacty"


class Api:
    """The handler called as HTTP would call it; answers (status, decoded body)."""

    def __init__(self) -> None:
        self.handler = Handler(ObjectStore(), FaultInjector(), CallCounter())

    def call(
        self, method: str, target: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, dict[str, Any]]:
        raw = (
            body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
        )
        answer = self.handler.handle(Request(method, target, {"content-type": content_type}, raw))
        assert isinstance(answer, Response)
        return answer.status, json.loads(answer.body)

    def ok(self, method: str, target: str, body: Any = None, content_type: str = "") -> Any:
        status, doc = self.call(method, target, body, content_type or "application/json")
        assert status in (200, 201), doc
        return doc


def claim(name: str = "c", cpus: str = "2") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "cpus",
                        "exactly": {
                            "deviceClassName": "dra.cpu",
                            "capacity": {"requests": {"dra.cpu/cpu": cpus}},
                        },
                    }
                ]
            }
        },
    }


def pod(name: str = "p", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "cpus", "resourceClaimName": "c"}],
            "containers": [
                {
                    "name": "worker",
                    "image": "busybox:1.36",
                    "resources": {"limits": {"cpu": "2"}, "claims": [{"name": "cpus"}]},
                }
            ],
            **spec,
        },
    }


def deployment(name: str = "d", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "worker", "image": "busybox:1.36"}]},
            },
            **spec,
        },
    }


def misspelt(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with the claim request's ``capacity`` spelt ``capacty``."""
    out = copy.deepcopy(obj)
    exactly = out["spec"]["devices"]["requests"][0]["exactly"]
    exactly["capacty"] = exactly.pop("capacity")
    return out


# -- unknown fields, verb by verb -------------------------------------------------------------

STRICT_DECODE = f'strict decoding error: unknown field "{TYPO}"'


def _write_misspelt(api: Api, verb: str, stored: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    item = f"{CLAIMS}/c?fieldValidation=Strict"
    typo = {"spec": {"devices": {"requests": [{"name": "cpus", "exactly": {"capacty": {}}}]}}}
    if verb == "create":
        return api.call("POST", f"{CLAIMS}?fieldValidation=Strict", misspelt(claim("c2")))
    if verb == "update":
        return api.call("PUT", item, misspelt(stored))
    if verb == "merge":
        return api.call("PATCH", item, typo, MERGE)
    if verb == "strategic":
        return api.call("PATCH", item, typo, STRATEGIC)
    if verb == "json":
        ops = [{"op": "add", "path": "/spec/devices/requests/0/exactly/capacty", "value": {}}]
        return api.call("PATCH", item, ops, JSON_PATCH)
    assert verb == "apply"
    return api.call("PATCH", f"{CLAIMS}/c?fieldManager=kubectl", misspelt(claim()), APPLY)


@pytest.mark.parametrize("verb", ["create", "update", "merge", "strategic", "json", "apply"])
def test_every_write_refuses_a_misspelt_field_and_keeps_the_object(verb: str) -> None:
    api = Api()
    stored = api.ok("POST", CLAIMS, claim())
    status, doc = _write_misspelt(api, verb, stored)
    if verb in ("create", "update"):
        # The strict decoder on the request body (transformDecodeError).
        assert (status, doc["reason"]) == (400, "BadRequest")
        assert doc["message"] == (
            'ResourceClaim in version "v1" cannot be handled as a ResourceClaim: ' + STRICT_DECODE
        )
    elif verb == "apply":
        # The field manager's typed conversion, returned unwrapped: 500 without a reason.
        assert status == 500 and "reason" not in doc
        assert doc["message"] == (
            "failed to create typed patch object (default/c; resource.k8s.io/v1, "
            f"Kind=ResourceClaim): .{TYPO}: field not declared in schema"
        )
    else:
        # The patchers decode the patched object strictly: 422, empty kind and name.
        assert (status, doc["reason"]) == (422, "Invalid")
        assert doc["message"].startswith(' "" is invalid: patch: Invalid value: "')
        assert doc["message"].endswith('": ' + STRICT_DECODE)
        [cause] = doc["details"]["causes"]
        assert (cause["field"], cause["reason"]) == ("patch", "FieldValueInvalid")
        shown = "map[spec:map[" if verb == "strategic" else '{\\"apiVersion\\":'
        assert doc["message"].startswith(f' "" is invalid: patch: Invalid value: "{shown}')
    assert api.ok("GET", f"{CLAIMS}/c") == stored
    assert api.call("GET", f"{CLAIMS}/c2")[0] == 404


def test_apply_names_every_unknown_field_by_its_list_key() -> None:
    api = Api()
    body = pod()
    body["spec"]["containers"][0]["imagee"] = "x"
    body["spec"]["nodeNme"] = "n"
    # Without fieldValidation: apply refuses unknown fields whatever it says.
    status, doc = api.call("PATCH", f"{PODS}/p?fieldManager=m", body, APPLY)
    assert status == 500
    assert doc["message"] == (
        "failed to create typed patch object (/p; /v1, Kind=Pod): errors:\n"
        '  .spec.containers[name="worker"].imagee: field not declared in schema\n'
        "  .spec.nodeNme: field not declared in schema"
    )
    assert api.call("GET", f"{PODS}/p")[0] == 404


def test_strict_patch_names_the_fields_of_the_patched_object() -> None:
    api = Api()
    api.ok("POST", PODS, pod())
    patch = {
        "spec": {
            "$setElementOrder/containers": [{"name": "worker"}],
            "containers": [{"name": "worker", "imagePulPolicy": "Always"}],
        }
    }
    status, doc = api.call("PATCH", f"{PODS}/p?fieldValidation=Strict", patch, STRATEGIC)
    assert status == 422
    assert doc["message"].endswith(
        'strict decoding error: unknown field "spec.containers[0].imagePulPolicy"'
    )
    # The directive is the patch's, not a field: it is neither stored nor refused.
    patch["spec"]["containers"][0] = {"name": "worker", "image": "busybox:1.37"}
    patched = api.ok("PATCH", f"{PODS}/p?fieldValidation=Strict", patch, STRATEGIC)
    assert patched["spec"]["containers"][0]["image"] == "busybox:1.37"
    assert patched["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "2"}
    assert "$setElementOrder/containers" not in patched["spec"]


# -- options of a write -----------------------------------------------------------------------


def test_write_options_are_checked() -> None:
    api = Api()
    status, doc = api.call("POST", f"{CLAIMS}?fieldValidation=strict", claim())
    assert (status, doc["message"]) == (
        422,
        'CreateOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: '
        '"strict": supported values: "", "Ignore", "Strict", "Warn"',
    )
    api.ok("POST", CLAIMS, claim())
    status, doc = api.call("PUT", f"{CLAIMS}/c?fieldValidation=yes", claim())
    assert status == 422 and doc["message"].startswith('UpdateOptions.meta.k8s.io "" is invalid')
    status, doc = api.call("PATCH", f"{CLAIMS}/c", claim(), APPLY)
    assert (status, doc["message"]) == (
        422,
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required '
        "for apply patch",
    )
    status, doc = api.call("PATCH", f"{CLAIMS}/c?force=true", {"metadata": {}}, MERGE)
    assert (status, doc["message"]) == (
        422,
        'PatchOptions.meta.k8s.io "" is invalid: force: Forbidden: may not be specified for '
        "non-apply patch",
    )


# -- immutable specs --------------------------------------------------------------------------


CHANGES: dict[str, Callable[[dict[str, Any]], tuple[str, Any, str]]] = {
    "update": lambda stored: ("PUT", {**stored, "spec": claim(cpus="4")["spec"]}, ""),
    "merge": lambda stored: ("PATCH", {"spec": claim(cpus="4")["spec"]}, MERGE),
    "strategic": lambda stored: ("PATCH", {"spec": claim(cpus="4")["spec"]}, STRATEGIC),
    "json": lambda stored: (
        "PATCH",
        [
            {
                "op": "replace",
                "path": "/spec/devices/requests/0/exactly/capacity/requests/dra.cpu~1cpu",
                "value": "4",
            }
        ],
        JSON_PATCH,
    ),
    "apply": lambda stored: ("PATCH", claim(cpus="4"), APPLY),
}


@pytest.mark.parametrize("verb", sorted(CHANGES))
def test_a_claim_spec_cannot_change(verb: str) -> None:
    api = Api()
    stored = api.ok("POST", CLAIMS, claim())
    method, body, content_type = CHANGES[verb](stored)
    target = f"{CLAIMS}/c?fieldManager=kubectl" if verb == "apply" else f"{CLAIMS}/c"
    status, doc = api.call(method, target, body, content_type or "application/json")
    assert (status, doc["reason"]) == (422, "Invalid")
    new_spec = json.dumps(claim(cpus="4")["spec"], separators=(",", ":"))
    assert doc["message"] == (
        f'ResourceClaim.resource.k8s.io "c" is invalid: spec: Invalid value: {new_spec}: '
        "field is immutable"
    )
    assert doc["details"]["causes"][0]["field"] == "spec"
    assert api.ok("GET", f"{CLAIMS}/c") == stored


def test_a_claim_keeps_taking_metadata_and_status_writes() -> None:
    api = Api()
    api.ok("POST", CLAIMS, claim())
    labelled = api.ok("PATCH", f"{CLAIMS}/c", {"metadata": {"labels": {"a": "b"}}}, MERGE)
    assert labelled["metadata"]["labels"] == {"a": "b"}
    reserved = {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}}
    api.ok("PATCH", f"{CLAIMS}/c/status", reserved, MERGE)
    # The same spec written back (what kubectl apply of an unchanged file does) is fine.
    api.ok("PATCH", f"{CLAIMS}/c?fieldManager=kubectl", claim(), APPLY)


def test_a_claim_template_spec_cannot_change() -> None:
    api = Api()
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {"spec": claim()["spec"]},
    }
    api.ok("POST", TEMPLATES, template)
    status, doc = api.call("PATCH", f"{TEMPLATES}/t", {"spec": {"spec": None}}, MERGE)
    assert (status, doc["message"]) == (
        422,
        'ResourceClaimTemplate.resource.k8s.io "t" is invalid: spec: Invalid value: {}: '
        "field is immutable",
    )


# -- pod updates ------------------------------------------------------------------------------

POD_FORBIDDEN = (
    'Pod "p" is invalid: spec: Forbidden: pod updates may not change fields other than '
    "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
    "`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously "
    "negative)\n  core.PodSpec{\n"
)


def _pod_write(api: Api, spec: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return api.call("PATCH", f"{PODS}/p", {"spec": spec}, STRATEGIC)


def test_pod_claims_and_containers_cannot_change() -> None:
    api = Api()
    stored = api.ok("POST", PODS, pod())
    other = [{"name": "cpus", "resourceClaimName": "other"}]
    status, doc = _pod_write(api, {"resourceClaims": other})
    assert status == 422
    assert doc["message"] == (
        POD_FORBIDDEN
        + '- \tResourceClaims: [{"name":"cpus","resourceClaimName":"c"}],\n'
        + '+ \tResourceClaims: [{"name":"cpus","resourceClaimName":"other"}],\n  }\n'
    )
    resized = copy.deepcopy(stored["spec"]["containers"])
    resized[0]["resources"]["limits"]["cpu"] = "4"
    status, doc = _pod_write(api, {"containers": resized})
    assert status == 422 and doc["message"].startswith(POD_FORBIDDEN + "- \tContainers: ")
    two = [*stored["spec"]["containers"], {"name": "second", "image": "busybox:1.36"}]
    status, doc = _pod_write(api, {"containers": two})
    assert (status, doc["message"]) == (
        422,
        'Pod "p" is invalid: spec.containers: Forbidden: pod updates may not add or remove '
        "containers",
    )
    # Through PUT and server-side apply alike.
    status, doc = api.call("PUT", f"{PODS}/p", {**stored, "spec": pod(nodeName="n")["spec"]})
    assert status == 422 and doc["message"].startswith(POD_FORBIDDEN + '+ \tNodeName: "n",')
    status, doc = api.call("PATCH", f"{PODS}/p?fieldManager=m", pod(hostname="h"), APPLY)
    assert status == 422 and doc["message"].startswith(POD_FORBIDDEN)
    assert api.ok("GET", f"{PODS}/p") == stored


def test_pod_updates_the_real_server_allows() -> None:
    api = Api()
    toleration = {"key": "k", "operator": "Exists", "effect": "NoExecute"}
    api.ok(
        "POST",
        PODS,
        pod(
            tolerations=[{**toleration, "tolerationSeconds": 30}],
            schedulingGates=[{"name": "g1"}, {"name": "g2"}],
            activeDeadlineSeconds=100,
        ),
    )
    image = [{"name": "worker", "image": "busybox:1.37"}]
    patched = api.ok("PATCH", f"{PODS}/p", {"spec": {"containers": image}}, STRATEGIC)
    assert patched["spec"]["containers"][0]["image"] == "busybox:1.37"
    added = [{**toleration, "tolerationSeconds": 10}, {"key": "new", "operator": "Exists"}]
    api.ok("PATCH", f"{PODS}/p", {"spec": {"tolerations": added}}, MERGE)
    api.ok("PATCH", f"{PODS}/p", {"spec": {"schedulingGates": [{"name": "g2"}]}}, MERGE)
    api.ok("PATCH", f"{PODS}/p", {"spec": {"activeDeadlineSeconds": 50}}, MERGE)
    api.ok("PATCH", f"{PODS}/p", {"metadata": {"labels": {"tier": "batch"}}}, MERGE)
    # pods/binding sets spec.nodeName, which no update may.
    binding = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}}
    api.ok("POST", f"{PODS}/p/binding", binding)
    assert api.ok("GET", f"{PODS}/p")["spec"]["nodeName"] == "n1"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"containers": [{"name": "worker", "image": ""}]},
            "spec.containers[0].image: Required value",
        ),
        (
            {"containers": [{"name": "worker", "image": " busybox"}]},
            'spec.containers[0].image: Invalid value: " busybox": must not have leading or '
            "trailing whitespace",
        ),
        (
            {"activeDeadlineSeconds": 200},
            "spec.activeDeadlineSeconds: Invalid value: 200: must be less than or equal to "
            "previous value",
        ),
        (
            {"activeDeadlineSeconds": -1},
            "spec.activeDeadlineSeconds: Invalid value: -1: must be between 0 and 2147483647, "
            "inclusive",
        ),
        (
            {"activeDeadlineSeconds": None},
            "spec.activeDeadlineSeconds: Invalid value: null: must not update from a positive "
            "integer to nil value",
        ),
        (
            {"tolerations": [{"key": "k", "operator": "Equal", "value": "v"}]},
            "spec.tolerations: Forbidden: existing toleration can not be modified except its "
            "tolerationSeconds",
        ),
        (
            {"schedulingGates": [{"name": "g1"}, {"name": "g9"}]},
            "spec.schedulingGates[1].name: Forbidden: only deletion is allowed, but found new "
            "scheduling gate 'g9'",
        ),
    ],
)
def test_pod_updates_the_real_server_refuses(spec: dict[str, Any], message: str) -> None:
    api = Api()
    created = pod(
        tolerations=[{"key": "k", "operator": "Exists"}],
        schedulingGates=[{"name": "g1"}],
        activeDeadlineSeconds=100,
    )
    stored = api.ok("POST", PODS, created)
    status, doc = _pod_write(api, spec)
    assert (status, doc["message"]) == (422, f'Pod "p" is invalid: {message}')
    assert api.ok("GET", f"{PODS}/p") == stored


# -- strategic merge patch and server-side apply semantics ------------------------------------


def test_strategic_merge_patch_merges_keyed_lists_and_follows_directives() -> None:
    api = Api()
    api.ok("POST", PODS, {**pod(), "metadata": {"name": "p", "finalizers": ["a/x", "a/y"]}})
    patch = {
        "metadata": {"finalizers": ["a/z"], "$deleteFromPrimitiveList/finalizers": ["a/x"]},
        "spec": {"containers": [{"name": "worker", "image": "busybox:1.37"}]},
    }
    patched = api.ok("PATCH", f"{PODS}/p", patch, STRATEGIC)
    assert patched["metadata"]["finalizers"] == ["a/y", "a/z"]
    [worker] = patched["spec"]["containers"]
    assert worker["image"] == "busybox:1.37" and worker["resources"]["limits"] == {"cpu": "2"}
    replaced = api.ok(
        "PATCH", f"{PODS}/p", {"metadata": {"labels": {"$patch": "replace", "b": "2"}}}, STRATEGIC
    )
    assert replaced["metadata"]["labels"] == {"b": "2"}
    for bad, status_code, message in (
        ({"$patch": "bogus"}, 500, "unknown patch type: bogus in map: map[$patch:bogus]"),
        ({"$retainKeys": "x"}, 400, "invalid patch format of retainKeys"),
        ({"$setElementOrder/containers": "x"}, 400, "invalid patch format of setElementOrder list"),
        ({"$deleteFromPrimitiveList/x": 1}, 400, "invalid patch format of primitive list"),
    ):
        status, doc = api.call("PATCH", f"{PODS}/p", {"spec": bad}, STRATEGIC)
        assert (status, doc["message"]) == (status_code, message)


def _c(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, **fields}


@pytest.mark.parametrize(
    ("original", "patch", "expected"),
    [
        ({"a": 1, "b": 2}, {"a": None}, {"b": 2}),
        ({"args": ["x", "y"]}, {"args": ["z"]}, {"args": ["z"]}),
        ({"a": {"b": 1}, "c": 1}, {"a": {"$patch": "delete"}}, {"c": 1}),
        (
            {"containers": [_c("a"), _c("b")]},
            {"containers": [_c("a", **{"$patch": "delete"})]},
            {"containers": [_c("b")]},
        ),
        (
            {"containers": [_c("a"), _c("b")]},
            {"containers": [{"$patch": "replace"}, _c("c")]},
            {"containers": [_c("c")]},
        ),
        (
            {"containers": [_c("a", image="1"), _c("b")]},
            {
                "$setElementOrder/containers": [_c("b"), _c("a")],
                "containers": [_c("a", image="2")],
            },
            {"containers": [_c("b"), _c("a", image="2")]},
        ),
        (
            {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}},
            {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}},
            {"strategy": {"type": "Recreate"}},
        ),
    ],
)
def test_strategic_merge_patch_cases(
    original: dict[str, Any], patch: dict[str, Any], expected: dict[str, Any]
) -> None:
    before = copy.deepcopy(original)
    assert strategic_merge_patch(original, patch) == expected
    assert original == before


def test_server_side_apply_creates_merges_and_forgets_what_it_left_out() -> None:
    api = Api()
    first = claim()
    first["metadata"]["labels"] = {"owner": "me", "tier": "batch"}
    status, created = api.call("PATCH", f"{CLAIMS}/c?fieldManager=me", first, APPLY)
    assert status == 201 and created["metadata"]["labels"] == {"owner": "me", "tier": "batch"}
    api.ok("PATCH", f"{CLAIMS}/c", {"metadata": {"labels": {"other": "x"}}}, MERGE)
    again = api.ok("PATCH", f"{CLAIMS}/c?fieldManager=me", first, APPLY)
    assert again["metadata"]["resourceVersion"] == "2"  # nothing changed: no write
    first["metadata"]["labels"] = {"owner": "me"}
    second = api.ok("PATCH", f"{CLAIMS}/c?fieldManager=me", first, APPLY)
    # tier was this manager's and is gone; other was another writer's and stays.
    assert second["metadata"]["labels"] == {"owner": "me", "other": "x"}
    # YAML bodies too, as the content type says.
    yaml_body = (
        b"apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n"
        b"metadata: {name: c, labels: {owner: you}}\n"
        b"spec:\n  devices:\n    requests:\n    - name: cpus\n      exactly:\n"
        b"        deviceClassName: dra.cpu\n        capacity: {requests: {dra.cpu/cpu: '2'}}\n"
    )
    third = api.ok("PATCH", f"{CLAIMS}/c?fieldManager=you", yaml_body, APPLY)
    assert third["metadata"]["labels"] == {"owner": "you", "other": "x"}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"[]", 400, "error decoding YAML: error unmarshaling JSON: while decoding JSON: json: "
         "cannot unmarshal array into Go value of type map[string]interface {}"),
        (b"a: [", 400, "error decoding YAML: "),
        ({**claim(), "apiVersion": "resource.k8s.io/v1beta1"}, 400,
         "invalid object type: resource.k8s.io/v1beta1, Kind=ResourceClaim"),
        ({**claim(), "kind": "Pod"}, 400, "invalid object type: resource.k8s.io/v1, Kind=Pod"),
        ({**claim(), "metadata": {"name": "c", "managedFields": []}}, 400,
         "metadata.managedFields must be nil"),
        (claim("d"), 400, "the name of the object (d) does not match the name on the URL (c)"),
    ],
)  # fmt: skip
def test_server_side_apply_refuses_bad_bodies(body: Any, status: int, message: str) -> None:
    api = Api()
    got, doc = api.call("PATCH", f"{CLAIMS}/c?fieldManager=m", body, APPLY)
    assert got == status and doc["message"].startswith(message), doc
    assert api.call("GET", f"{CLAIMS}/c")[0] == 404


# -- Deployments ------------------------------------------------------------------------------


def test_deployments_are_served() -> None:
    api = Api()
    resources = api.ok("GET", "/apis/apps/v1")["resources"]
    assert [(r["name"], r.get("shortNames")) for r in resources] == [
        ("deployments", ["deploy"]),
        ("deployments/status", None),
    ]
    assert "apps" in [g["name"] for g in api.ok("GET", "/apis")["groups"]]
    created = api.ok("POST", f"{DEPLOYMENTS}?fieldValidation=Strict", deployment())
    assert (created["kind"], created["metadata"]["generation"]) == ("Deployment", 1)
    api.ok("POST", DEPLOYMENTS, deployment("e"))
    assert api.ok("GET", f"{DEPLOYMENTS}/d")["spec"]["replicas"] == 2
    listed = api.ok("GET", DEPLOYMENTS)
    assert listed["kind"] == "DeploymentList"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["d", "e"]
    scaled = api.ok("PATCH", f"{DEPLOYMENTS}/d", {"spec": {"replicas": 3}}, STRATEGIC)
    assert (scaled["spec"]["replicas"], scaled["metadata"]["generation"]) == (3, 2)
    api.ok("DELETE", f"{DEPLOYMENTS}/d")
    assert api.call("GET", f"{DEPLOYMENTS}/d")[0] == 404
    assert [i["metadata"]["name"] for i in api.ok("GET", DEPLOYMENTS)["items"]] == ["e"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"selector": None}, "spec.selector: Required value"),
        ({"selector": {}}, "spec.selector: Invalid value: {}: empty selector is invalid for "
         "deployment"),
        ({"selector": {"matchLabels": {"app": "other"}}},
         'spec.template.metadata.labels: Invalid value: {"app":"d"}: `selector` does not '
         "match template `labels`"),
        ({"replicas": -1}, "spec.replicas: Invalid value: -1: must be greater than or equal "
         "to 0"),
        ({"template": {"metadata": {"labels": {"app": "d"}},
                       "spec": {"restartPolicy": "Never", "containers": [{"name": "w"}]}}},
         '[spec.template.spec.containers[0].image: Required value, '
         'spec.template.spec.restartPolicy: Unsupported value: "Never": supported values: '
         '"Always"]'),
        ({"strategy": {"type": "BlueGreen"}}, 'spec.strategy.type: Unsupported value: '
         '"BlueGreen": supported values: "Recreate", "RollingUpdate"'),
    ],
)  # fmt: skip
def test_deployments_are_validated(spec: dict[str, Any], message: str) -> None:
    api = Api()
    status, doc = api.call("POST", DEPLOYMENTS, deployment(**spec))
    assert (status, doc["message"]) == (422, f'Deployment.apps "d" is invalid: {message}')
    assert api.ok("GET", DEPLOYMENTS)["items"] == []


def test_a_deployment_keeps_its_selector_and_refuses_unknown_fields() -> None:
    api = Api()
    api.ok("POST", DEPLOYMENTS, deployment())
    moved = {"spec": {"selector": {"matchLabels": {"app": "d", "x": "y"}}}}
    status, doc = api.call("PATCH", f"{DEPLOYMENTS}/d", moved, MERGE)
    assert status == 422
    assert doc["message"].endswith(
        'spec.selector: Invalid value: {"matchLabels":{"app":"d","x":"y"}}: field is immutable]'
    )
    typo = deployment("t")
    typo["spec"]["template"]["spec"]["containers"][0]["imagee"] = "x"
    status, doc = api.call("POST", f"{DEPLOYMENTS}?fieldValidation=Strict", typo)
    assert (status, doc["message"]) == (
        400,
        'Deployment in version "v1" cannot be handled as a Deployment: strict decoding error: '
        'unknown field "spec.template.spec.containers[0].imagee"',
    )


# -- the real kubectl -------------------------------------------------------------------------

needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
EXAMPLES = sorted((REPO / "docs/examples").glob("*.yaml"))


def _kinds_in(path: Path) -> list[tuple[str, str]]:
    import yaml

    return [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(path.read_text()) if d]


@needs_kubectl
@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_kubectl_applies_every_example_whole(apiserver: Path, example: Path) -> None:
    applied = kubectl(apiserver, "apply", "-f", str(example))
    assert (applied.returncode, applied.stderr) == (0, ""), applied.stderr
    objects = _kinds_in(example)
    assert len(applied.stdout.splitlines()) == len(objects)
    assert all(line.endswith(" created") for line in applied.stdout.splitlines())
    for kind, name in objects:
        got = kubectl(apiserver, "get", kind.lower(), name, "-o", "jsonpath={.kind}")
        assert (got.returncode, got.stdout) == (0, kind), got.stderr
    again = kubectl(apiserver, "apply", "-f", str(example))
    assert again.returncode == 0, again.stderr
    assert all(line.endswith(" unchanged") for line in again.stdout.splitlines())


@needs_kubectl
def test_kubectl_refuses_a_misspelt_field_over_an_existing_claim(apiserver: Path) -> None:
    example = REPO / "docs/examples/grouped-claim.yaml"
    assert kubectl(apiserver, "apply", "-f", str(example)).returncode == 0
    before = kubectl(apiserver, "get", "resourceclaim", "four-cpus", "-o", "json").stdout
    typo = apiserver.parent / "typo.yaml"
    typo.write_text(example.read_text().replace("        capacity:\n", "        capacty:\n"))
    proc = kubectl(apiserver, "apply", "-f", str(typo))
    assert proc.returncode == 1
    assert f'strict decoding error: unknown field "{TYPO}"' in proc.stderr
    server_side = kubectl(apiserver, "apply", "--server-side", "-f", str(typo))
    assert server_side.returncode == 1
    assert (
        "Error from server: failed to create typed patch object (default/four-cpus; "
        f"resource.k8s.io/v1, Kind=ResourceClaim): .{TYPO}: field not declared in schema"
    ) in server_side.stderr
    after = kubectl(apiserver, "get", "resourceclaim", "four-cpus", "-o", "json").stdout
    assert json.loads(after) == json.loads(before)


@needs_kubectl
def test_kubectl_cannot_change_a_claim_or_a_pod_spec(apiserver: Path) -> None:
    example = REPO / "docs/examples/grouped-claim.yaml"
    assert kubectl(apiserver, "apply", "-f", str(example)).returncode == 0
    changed = apiserver.parent / "changed.yaml"
    changed.write_text(example.read_text().replace('"4"', '"6"'))
    proc = kubectl(apiserver, "apply", "-f", str(changed))
    assert proc.returncode == 1
    assert 'ResourceClaim.resource.k8s.io "four-cpus" is invalid: spec: Invalid value: ' in (
        proc.stderr
    )
    assert 'Pod "pinned" is invalid: spec: Forbidden: pod updates may not change fields' in (
        proc.stderr
    )


@needs_kubectl
def test_kubectl_gets_and_deletes_a_deployment(apiserver: Path) -> None:
    example = REPO / "docs/examples/individual-claim.yaml"
    assert kubectl(apiserver, "apply", "--server-side", "-f", str(example)).returncode == 0
    listed = kubectl(apiserver, "get", "deploy", "-o", "name")
    assert listed.stdout == "deployment.apps/pinned-workers\n"
    deleted = kubectl(apiserver, "delete", "deployment", "pinned-workers")
    assert deleted.stdout == 'deployment.apps "pinned-workers" deleted\n'
    assert kubectl(apiserver, "get", "deployments", "-o", "name").stdout == ""
