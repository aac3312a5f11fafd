"""deploy/base/admission-policy.yaml: the ValidatingAdmissionPolicy that ties dracpu's
ResourceSlice writes to the node its token names.

The rendered policy's own CEL (match condition, variables, validations, message
expression) is evaluated with cel-python, the library the simulated scheduler uses, the way
the API server's admission plugin does: a request that fails the match condition is not
the policy's business; otherwise the variables are bound in order and the first validation
that is false, or that cannot be evaluated (failurePolicy Fail), refuses the request. The
slices are the ones dracpu itself publishes (`build_slices` on a fake sysfs tree).
"""

from __future__ import annotations

import copy
import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import pytest
from celpy import celtypes
from celpy.evaluation import CELEvalError
from deploy_render import DEPLOY, OVERLAYS, by_kind, kustomize

from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.topology import discover_from_root

Render = Callable[[str], list[dict[str, Any]]]

REPO = Path(__file__).resolve().parents[2]
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
DRACPU = "system:serviceaccount:kube-system:dracpu"
WITH_POLICY = [o for o in OVERLAYS if o != "no-admission-policy"]
_ENV = celpy.Environment()


@dataclass(frozen=True)
class Decision:
    matched: bool
    refusals: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return not self.refusals


def _run(expression: str, activation: dict[str, Any]) -> Any:
    """The expression's value, or the CELEvalError it ends in."""
    try:
        return _ENV.program(_ENV.compile(expression)).evaluate(activation)
    except CELEvalError as error:
        return error


def _true(value: Any) -> bool:
    """Only a boolean true passes; an error or another type refuses (failurePolicy Fail)."""
    return isinstance(value, celtypes.BoolType) and bool(value)


def admit(policy: dict[str, Any], request: dict[str, Any]) -> Decision:
    """The policy's verdict on one admission request (`request`, `object`, `oldObject`)."""
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel(request["request"]),
        "object": celpy.json_to_cel(request.get("object")),
        "oldObject": celpy.json_to_cel(request.get("oldObject")),
    }
    for condition in spec["matchConditions"]:
        matched = _run(condition["expression"], activation)
        if isinstance(matched, CELEvalError):  # failurePolicy Fail refuses
            return Decision(matched=True, refusals=(f"match condition: {matched}",))
        if not _true(matched):
            return Decision(matched=False)
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        bound = celtypes.MapType({celtypes.StringType(k): v for k, v in variables.items()})
        value = _run(variable["expression"], {**activation, "variables": bound})
        if isinstance(value, CELEvalError):
            return Decision(matched=True, refusals=(f"variable {variable['name']}: {value}",))
        variables[variable["name"]] = value
    activation["variables"] = celtypes.MapType(
        {celtypes.StringType(k): v for k, v in variables.items()}
    )
    for validation in spec["validations"]:
        if _true(_run(validation["expression"], activation)):
            continue
        if "messageExpression" in validation:
            message = str(_run(validation["messageExpression"], activation))
        else:
            message = " ".join(validation["message"].split())
        return Decision(matched=True, refusals=(message,))
    return Decision(matched=True)


def _request(
    operation: str,
    *,
    user: str = DRACPU,
    node: str | None,
    extra: dict[str, list[str]] | None = None,
    new: dict[str, Any] | None = None,
    old: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An admission request as the API server hands it to the policy. A token bound to a
    pod carries its pod and node in `extra`; a token without a node has no node-name key
    (or, when `extra` is None and `node` too, no extra at all)."""
    user_info: dict[str, Any] = {"username": user, "groups": ["system:authenticated"]}
    if node is not None or extra is not None:
        user_info["extra"] = dict(extra or {})
        if node is not None:
            user_info["extra"] |= {
                NODE_NAME_KEY: [node],
                "authentication.kubernetes.io/pod-name": ["dracpu-x7k2p"],
            }
    request: dict[str, Any] = {
        "request": {
            "operation": operation,
            "userInfo": user_info,
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceslices"},
        }
    }
    if operation in ("CREATE", "UPDATE"):
        assert new is not None
        request["object"] = new
    if operation in ("UPDATE", "DELETE"):
        assert old is not None
        request["oldObject"] = old
    return request


@functools.cache
def _slices_of(node: str) -> list[dict[str, Any]]:
    topo = discover_from_root(REPO / "tests" / "fake_sysfs" / "xeon-2s-ht")
    inventory = build_inventory(topo, DeviceSettings())
    return build_slices(inventory, node_name=node, node_uid=f"uid-{node}", expose_pcie_roots=False)


def _published_slice(node: str) -> dict[str, Any]:
    """The first ResourceSlice dracpu publishes for `node` (grouped mode, two sockets)."""
    return copy.deepcopy(_slices_of(node)[0])


def _writes(node: str, slice_node: str) -> list[dict[str, Any]]:
    """A create, an update and a delete of `slice_node`'s slice by dracpu on `node`."""
    current = _published_slice(slice_node)
    updated = {**current, "spec": {**current["spec"], "pool": {**current["spec"]["pool"]}}}
    updated["spec"]["pool"]["generation"] = current["spec"]["pool"]["generation"] + 1
    return [
        _request("CREATE", node=node, new=current),
        _request("UPDATE", node=node, old=current, new=updated),
        _request("DELETE", node=node, old=current),
    ]


@pytest.fixture(scope="module")
def policy() -> dict[str, Any]:
    return by_kind(kustomize(DEPLOY / "overlays" / "grouped"), "ValidatingAdmissionPolicy")


# -- the decisions -------------------------------------------------------------------------


def test_own_node_writes_are_allowed(policy: dict[str, Any]) -> None:
    for request in _writes("node-a", "node-a"):
        decision = admit(policy, request)
        assert decision.matched and decision.allowed, (request["request"]["operation"], decision)


def test_another_nodes_slice_is_refused(policy: dict[str, Any]) -> None:
    for request in _writes("node-a", "node-b"):
        decision = admit(policy, request)
        assert decision.refusals == (
            "dracpu on node node-a may write only ResourceSlices whose spec.nodeName is node-a",
        ), request["request"]["operation"]


@pytest.mark.parametrize(
    "extra", [None, {}, {"authentication.kubernetes.io/credential-id": ["JTI=1"]}]
)
def test_a_token_without_a_node_name_is_refused(
    policy: dict[str, Any], extra: dict[str, list[str]] | None
) -> None:
    current = _published_slice("node-a")
    for request in (
        _request("CREATE", node=None, extra=extra, new=current),
        _request("UPDATE", node=None, extra=extra, old=current, new=current),
        _request("DELETE", node=None, extra=extra, old=current),
    ):
        decision = admit(policy, request)
        assert decision.matched and not decision.allowed
        assert "only with a token bound to a pod on a node" in decision.refusals[0]


def test_an_update_cannot_move_a_slice_between_nodes(policy: dict[str, Any]) -> None:
    mine, theirs = _published_slice("node-a"), _published_slice("node-b")
    take = _request("UPDATE", node="node-a", old=theirs, new=mine)
    give = _request("UPDATE", node="node-a", old=mine, new=theirs)
    assert not admit(policy, take).allowed
    assert not admit(policy, give).allowed


def test_only_the_dra_cpu_driver(policy: dict[str, Any]) -> None:
    mine = _published_slice("node-a")
    other = {**mine, "spec": {**mine["spec"], "driver": "gpu.example.com"}}
    for request in (
        _request("CREATE", node="node-a", new=other),
        _request("UPDATE", node="node-a", old=mine, new=other),
        _request("DELETE", node="node-a", old=other),
    ):
        assert admit(policy, request).refusals == (
            "dracpu's ServiceAccount may write only ResourceSlices of the dra.cpu driver",
        )


def test_a_slice_without_a_node_name_is_refused(policy: dict[str, Any]) -> None:
    mine = _published_slice("node-a")
    spec = {k: v for k, v in mine["spec"].items() if k != "nodeName"}
    cluster_wide = {**mine, "spec": {**spec, "allNodes": True}}
    assert not admit(policy, _request("CREATE", node="node-a", new=cluster_wide)).allowed
    assert not admit(policy, _request("DELETE", node="node-a", old=cluster_wide)).allowed


@pytest.mark.parametrize(
    "user",
    [
        "system:admin",
        "system:node:node-a",
        "system:serviceaccount:kube-system:resourceclaim-controller",
        "system:serviceaccount:other:dracpu",
        "system:serviceaccount:kube-system:dracpu-other",
    ],
)
def test_other_users_are_not_matched(policy: dict[str, Any], user: str) -> None:
    theirs = _published_slice("node-b")
    for operation in ("CREATE", "UPDATE", "DELETE"):
        request = _request(operation, user=user, node="node-a", new=theirs, old=theirs)
        assert admit(policy, request) == Decision(matched=False), (user, operation)


def test_the_harness_is_not_vacuous(policy: dict[str, Any]) -> None:
    """An expression that errors refuses (failurePolicy Fail), as the API server does."""
    broken = {**policy, "spec": {**policy["spec"]}}
    broken["spec"]["variables"] = [
        {"name": "tokenNode", "expression": 'request.userInfo.extra["missing"][0]'},
        *policy["spec"]["variables"][1:],
    ]
    request = _writes("node-a", "node-a")[0]
    assert admit(policy, request).allowed
    assert not admit(broken, request).allowed


# -- the objects -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["base", *WITH_POLICY])
def test_policy_names_the_rendered_service_account(render: Render, name: str) -> None:
    objects = render(name)
    account = by_kind(objects, "ServiceAccount")
    namespace = account["metadata"].get("namespace", "default")
    if name == "base":
        # The base's placeholder is the same one its ClusterRoleBinding uses.
        assert by_kind(objects, "ClusterRoleBinding")["subjects"][0]["namespace"] == namespace
    policy = by_kind(objects, "ValidatingAdmissionPolicy")
    username = f"system:serviceaccount:{namespace}:{account['metadata']['name']}"
    assert policy["spec"]["matchConditions"] == [
        {
            "name": "dracpu-service-account",
            "expression": f'request.userInfo.username == "{username}"',
        }
    ]
    binding = by_kind(objects, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert "Deny" in binding["spec"]["validationActions"]
    assert "matchResources" not in binding["spec"]
    assert "namespace" not in policy["metadata"] and "namespace" not in binding["metadata"]


def test_policy_covers_every_write_dracpu_makes(render: Render) -> None:
    (rule,) = by_kind(render("grouped"), "ValidatingAdmissionPolicy")["spec"]["matchConstraints"][
        "resourceRules"
    ]
    assert rule["apiGroups"] == ["resource.k8s.io"]
    assert rule["apiVersions"] == ["*"]
    assert rule["resources"] == ["resourceslices"]
    role = by_kind(render("grouped"), "ClusterRole")
    slice_verbs = next(r["verbs"] for r in role["rules"] if r["resources"] == ["resourceslices"])
    writes = {"create": "CREATE", "update": "UPDATE", "delete": "DELETE"}
    assert sorted(rule["operations"]) == sorted(writes[v] for v in slice_verbs if v in writes)


def test_a_user_overlay_in_another_namespace_keeps_the_policy_on_its_account(
    tmp_path: Path,
) -> None:
    """The replacement follows `namespace:`: an overlay that moves the install and repeats
    the replacement (as docs/installation.md says) matches the moved account."""
    grouped = (DEPLOY / "overlays" / "grouped" / "kustomization.yaml").read_text()
    replacements = grouped[grouped.index("replacements:") : grouped.index("transformers:")]
    base = os.path.relpath(DEPLOY / "overlays" / "grouped", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"namespace: dracpu-system\nresources:\n- {base}\n{replacements}"
    )
    objects = kustomize(tmp_path)
    policy = by_kind(objects, "ValidatingAdmissionPolicy")
    assert policy["spec"]["matchConditions"][0]["expression"] == (
        'request.userInfo.username == "system:serviceaccount:dracpu-system:dracpu"'
    )


def test_the_refusal_shown_in_the_docs_is_the_policys(policy: dict[str, Any]) -> None:
    """docs/installation.md quotes the API server's answer to another node's slice."""
    text = (REPO / "docs" / "installation.md").read_text()
    shown = re.search(r"denied request: (.+)$", text, re.M)
    assert shown is not None
    (refusal,) = admit(policy, _writes("node-a", "node-b")[0]).refusals
    assert shown.group(1) == refusal
    assert f"'{policy['metadata']['name']}' with binding 'dracpu-resourceslices'" in text
