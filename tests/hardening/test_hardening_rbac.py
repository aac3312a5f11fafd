"""RBAC: the ClusterRole in deploy/base against the API calls the driver's code makes.

The calls are collected from the source itself (an AST scan of everything but the
simulators): every attribute named like a ``CoreV1Api`` / ``ResourceV1Api`` method, mapped
to (API group, resource, verb), plus ``watch`` for each list method handed to
``watch_once``. A call the role does not grant fails the driver in a real cluster; a grant
the code never uses is privilege an attacker holding the driver's token would get for free.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from deploy_render import DEPLOY, by_kind, kustomize
from kubernetes import client as k8s_client

import dracpu

SRC = Path(__file__).resolve().parents[2] / "src" / "dracpu"
# The simulators play the kubelet, scheduler and API server; they are not the driver.
NOT_THE_DRIVER = ("sim", "demo")

GROUPS = {k8s_client.CoreV1Api: "", k8s_client.ResourceV1Api: "resource.k8s.io"}
VERBS = (
    ("delete_collection", "deletecollection"),
    ("read", "get"),
    ("list", "list"),
    ("create", "create"),
    ("replace", "update"),
    ("patch", "patch"),
    ("delete", "delete"),
)
PLURALS = {"device_class": "deviceclasses"}

Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

# Upstream's chart (behavior.md §17.2) also grants what its Go kubelet-plugin helper uses
# (device classes, pods, update on claim status); dracpu calls none of these, so its role
# must not grant them: the role and the calls found in the source must be equal.

# Grants the API server checks beside a call's own (authorization on synthetic
# subresources): from 1.36 a patch of a claim's status.devices is also authorized per
# driver on resourceclaims/driver, verb associated-node:patch for a node-local driver
# (kubernetes pkg/registry/resource/authz.go AuthorizedForDeviceStatus).
IMPLIED: dict[Grant, tuple[Grant, ...]] = {
    ("resource.k8s.io", "resourceclaims/status", "patch"): (
        ("resource.k8s.io", "resourceclaims/driver", "associated-node:patch"),
    ),
}


# Calls that only `dracpu gatherinfo` makes, best effort: it runs with whatever credentials
# it finds (--kubeconfig, the driver's, in-cluster) and a refusal keeps the rest of the
# bundle and says why (tests/demo/test_gatherinfo_replay.py, the 403 case). The driver's
# role leaves them out: saving a bundle's DeviceClasses is no reason to widen it.
BEST_EFFORT: dict[Grant, str] = {
    ("resource.k8s.io", "deviceclasses", "list"): "gatherinfo/api.py",
}

# Names a raw path may interpolate (f"/apis/{RESOURCE_API_VERSION}/..."): the scan resolves
# them to their values; any other interpolation fails the scan instead of hiding a call.
PATH_CONSTANTS = {"RESOURCE_API_VERSION": dracpu.RESOURCE_API_VERSION}


def _literal_path(arg: ast.expr, where: str) -> str | None:
    """The path a get_raw call names: a string, or an f-string over PATH_CONSTANTS."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if not isinstance(arg, ast.JoinedStr):
        return None
    out = []
    for part in arg.values:
        if isinstance(part, ast.Constant):
            out.append(str(part.value))
        else:
            assert isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name), where
            assert part.value.id in PATH_CONSTANTS, f"{where}: unknown name in a raw path"
            out.append(PATH_CONSTANTS[part.value.id])
    return "".join(out)


def _api_method(name: str) -> tuple[type, str] | None:
    """The API class whose resource method this is; None for anything else (close, ...)."""
    if not any(name.startswith(prefix + "_") for prefix, _ in VERBS):
        return None
    for api in GROUPS:
        if callable(getattr(api, name, None)):
            return api, name.removesuffix("_with_http_info")
    return None


def grant_of(method: str) -> Grant:
    """``list_resource_slice`` -> ("resource.k8s.io", "resourceslices", "list")."""
    found = _api_method(method)
    assert found is not None, method
    api, method = found
    prefix, verb = next((p, v) for p, v in VERBS if method.startswith(p + "_"))
    rest = method[len(prefix) + 1 :]
    rest = rest.removeprefix("namespaced_").removesuffix("_for_all_namespaces")
    sub = ""
    match = re.fullmatch(r"(.+?)_(status|binding|eviction|log|ephemeralcontainers)", rest)
    if match:
        rest, sub = match.group(1), "/" + match.group(2)
    plural = PLURALS.get(rest, rest.replace("_", "") + "s")
    return GROUPS[api], plural + sub, verb


def grant_of_path(path: str) -> Grant:
    """A ``KubeClient.get_raw`` path -> its grant: ``/api/v1/nodes/{name}`` ->
    ("", "nodes", "get"); ``/apis/<group>/<version>/[namespaces/{ns}/]<plural>[/{name}[/sub]]``."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        assert parts[0] == "apis", path
        group, rest = parts[1], parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] + ("/" + rest[2] if len(rest) > 2 else "")
    return group, resource, "get" if len(rest) > 1 else "list"


def calls_in_source() -> dict[Grant, list[str]]:
    """Every API grant the driver's code needs -> where it is needed."""
    found: dict[Grant, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] in NOT_THE_DRIVER:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _api_method(node.attr):
                where = f"{rel}:{node.lineno}"
                found.setdefault(grant_of(node.attr), []).append(where)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "watch_once"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Attribute)
            ):
                group, resource, _ = grant_of(node.args[1].attr)
                found.setdefault((group, resource, "watch"), []).append(f"{rel}:{node.lineno}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get_raw"
                and node.args
            ):
                where = f"{rel}:{node.lineno}"
                raw_path = _literal_path(node.args[0], where)
                assert raw_path is not None, f"{where}: get_raw of a path the scan cannot read"
                found.setdefault(grant_of_path(raw_path), []).append(where)
    for grant, implied in IMPLIED.items():
        for extra in implied if grant in found else ():
            found.setdefault(extra, []).extend(found[grant])
    return found


def granted() -> set[Grant]:
    role = by_kind(kustomize(DEPLOY / "base"), "ClusterRole")
    out: set[Grant] = set()
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert "nonResourceURLs" not in rule, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def test_grant_names_map_like_the_api_server_does() -> None:
    assert grant_of("read_node") == ("", "nodes", "get")
    assert grant_of("list_resource_slice") == ("resource.k8s.io", "resourceslices", "list")
    assert grant_of("replace_resource_slice") == ("resource.k8s.io", "resourceslices", "update")
    assert grant_of("read_namespaced_resource_claim") == (
        "resource.k8s.io",
        "resourceclaims",
        "get",
    )
    assert grant_of("patch_namespaced_resource_claim_status") == (
        "resource.k8s.io",
        "resourceclaims/status",
        "patch",
    )
    assert grant_of("list_pod_for_all_namespaces") == ("", "pods", "list")
    assert grant_of("delete_collection_resource_slice") == (
        "resource.k8s.io",
        "resourceslices",
        "deletecollection",
    )


def test_raw_paths_map_like_the_api_server_does() -> None:
    assert grant_of_path("/api/v1/nodes/{name}") == ("", "nodes", "get")
    assert grant_of_path("/api/v1/namespaces/{ns}/pods") == ("", "pods", "list")
    assert grant_of_path(
        "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status"
    ) == ("resource.k8s.io", "resourceclaims/status", "get")


def test_the_scan_finds_the_calls_the_driver_is_known_to_make() -> None:
    used = calls_in_source()
    # If these disappear, the scan is broken (the code certainly makes these calls).
    for grant in [
        ("", "nodes", "get"),
        ("resource.k8s.io", "resourceclaims", "get"),
        ("resource.k8s.io", "resourceslices", "list"),
        ("resource.k8s.io", "resourceslices", "watch"),
        ("resource.k8s.io", "resourceslices", "create"),
    ]:
        assert grant in used, grant


def test_every_call_the_code_makes_is_granted() -> None:
    missing = {
        g: where
        for g, where in calls_in_source().items()
        if g not in granted() and g not in BEST_EFFORT
    }
    assert missing == {}, f"the ClusterRole lacks grants the code needs: {missing}"


def test_best_effort_calls_are_gatherinfo_only_and_not_granted() -> None:
    used = calls_in_source()
    for grant, module in BEST_EFFORT.items():
        assert grant in used, grant  # still made, or the exception is stale
        assert {w.split(":")[0] for w in used[grant]} == {module}, used[grant]
        assert grant not in granted(), grant


def test_the_role_grants_nothing_beyond_what_the_code_calls() -> None:
    extra = granted() - set(calls_in_source())
    assert extra == set(), f"the ClusterRole grants calls the code never makes: {sorted(extra)}"
