"""deploy/: every overlay renders with `kubectl kustomize`, validates offline against the
Kubernetes 1.34 schemas, and says what behavior.md §17 and dracpu's flags require.

The daemon's own code reads the rendered manifests wherever it can: the container's
arguments go through `dracpu.flags.parse_root_flags`, the ConfigMap through
`dracpu.config.load_config`, and the kubelet socket directories come from
`dracpu.config.kubelet_paths`, so a flag rename or a config change that the manifests do
not follow fails here.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from deploy_render import DEPLOY, OVERLAYS, by_kind, kustomize

from dracpu.cli import SUBCOMMANDS
from dracpu.config import DriverConfig, kubelet_paths, load_config
from dracpu.flags import parse_root_flags

Render = Callable[[str], list[dict[str, Any]]]

# resource.k8s.io/v1 (DeviceClass, ResourceSlice) is GA from 1.34, dracpu's minimum.
K8S_VERSION = "1.34"
IMAGE = "ghcr.io/dracpu/dracpu:v0.1.0"
KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "ConfigMap",
    "DaemonSet",
    "DeviceClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
NAMESPACED = {"ServiceAccount", "ConfigMap", "DaemonSet"}

# behavior.md §17.2, row by row: (apiGroups, resources, resourceNames, verbs).
RBAC_RULES = {
    (("",), ("nodes",), (), ("get",)),
    (
        ("resource.k8s.io",),
        ("resourceslices",),
        (),
        ("list", "watch", "create", "update", "delete"),
    ),
    (("resource.k8s.io",), ("resourceclaims",), (), ("get",)),
    # The claim's status.devices (dracpu.k8s.claim_status): server-side apply is a patch,
    # and from 1.36 the per-driver check on the synthetic resourceclaims/driver.
    (("resource.k8s.io",), ("resourceclaims/status",), (), ("patch",)),
    (("resource.k8s.io",), ("resourceclaims/driver",), ("dra.cpu",), ("associated-node:patch",)),
}

# name → (path inside = path on the host, read-only, hostPath type).
HOST_MOUNTS = {
    "kubelet-plugin": ("/var/lib/kubelet/plugins/dra.cpu", False, "DirectoryOrCreate"),
    "kubelet-registry": ("/var/lib/kubelet/plugins_registry", False, "Directory"),
    "nri": ("/var/run/nri", False, "DirectoryOrCreate"),
    "cdi": ("/var/run/cdi", False, "DirectoryOrCreate"),
    "state": ("/var/lib/dracpu", False, "DirectoryOrCreate"),
    "sysfs": ("/sys", True, "Directory"),
    "cgroupfs": ("/sys/fs/cgroup", False, "Directory"),
}
K0S_ROOT = "/var/lib/k0s/kubelet"


def _daemonset(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(objects, "DaemonSet")


def _pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = _daemonset(objects)["spec"]["template"]["spec"]
    return spec


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = _pod(objects)["containers"]
    assert [c["name"] for c in containers] == ["dracpu"]
    container: dict[str, Any] = containers[0]
    return container


def _daemon_config(
    objects: list[dict[str, Any]], tmp_path: Path
) -> tuple[dict[str, object], DriverConfig]:
    """The container's flags and the config the daemon resolves from them and the
    rendered ConfigMap, with dracpu's own parser and loader."""
    container = _container(objects)
    assert container["command"] == ["dracpu", "run"]
    assert "run" in SUBCOMMANDS
    parsed = parse_root_flags(container["args"])
    assert parsed.positionals == [] and not parsed.help
    config_path = str(parsed.explicit["config"])
    mount = next(
        m for m in container["volumeMounts"] if m["mountPath"] == posixpath.dirname(config_path)
    )
    assert mount["readOnly"] is True
    configmap = by_kind(objects, "ConfigMap")
    local = tmp_path / "config.yaml"
    local.write_text(configmap["data"][posixpath.basename(config_path)])
    explicit = dict(parsed.explicit)
    explicit.pop("config")
    return parsed.explicit, load_config(str(local), explicit)


# -- rendering and schema validation ------------------------------------------------------


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_renders_the_expected_objects(render: Render, name: str) -> None:
    objects = render(name)
    expected = KINDS - POLICY_KINDS if name == "no-admission-policy" else KINDS
    assert sorted(o["kind"] for o in objects) == sorted(expected)
    for obj in objects:
        assert obj["metadata"]["labels"]["app"] == "dracpu", obj["kind"]
        namespace = obj["metadata"].get("namespace")
        if name == "base":
            assert namespace is None, f"the base is namespace-agnostic: {obj['kind']}"
        elif obj["kind"] in NAMESPACED:
            assert namespace == "kube-system", obj["kind"]
        else:
            assert namespace is None, obj["kind"]


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_every_object_validates_against_the_kubernetes_schemas(render: Render, name: str) -> None:
    for obj in render(name):
        for version in (K8S_VERSION, kubernetes_validate.latest_version()):
            # strict: unknown fields are errors too (a misspelt key would otherwise be
            # dropped silently by the API server's decoder).
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_validator_rejects_what_the_api_server_would(render: Render) -> None:
    """The schema check is not vacuous: a misspelt field and a wrong type both fail."""
    objects = render("grouped")
    daemonset = _daemonset(objects)
    daemonset["spec"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="hostNetwrok"):
        kubernetes_validate.validate(daemonset, K8S_VERSION, strict=True)
    deviceclass = by_kind(objects, "DeviceClass")
    deviceclass["spec"]["selectors"] = [{"cel": {"expression": 7}}]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deviceclass, K8S_VERSION, strict=True)


# -- RBAC and DeviceClass (behavior.md §17.1, §17.2) --------------------------------------


@pytest.mark.parametrize("name", OVERLAYS)
def test_rbac_grants_exactly_what_the_code_calls(render: Render, name: str) -> None:
    objects = render(name)
    rules = by_kind(objects, "ClusterRole")["rules"]
    got = [
        (
            tuple(r["apiGroups"]),
            tuple(r["resources"]),
            tuple(r.get("resourceNames", ())),
            tuple(r["verbs"]),
        )
        for r in rules
    ]
    assert len(got) == len(set(got)) == len(RBAC_RULES)
    assert set(got) == RBAC_RULES
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert set(rule) <= {"apiGroups", "resources", "resourceNames", "verbs"}

    binding = by_kind(objects, "ClusterRoleBinding")
    account = by_kind(objects, "ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": by_kind(objects, "ClusterRole")["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    assert _pod(objects)["serviceAccountName"] == account["metadata"]["name"]


def test_deviceclass_is_the_spec_one(render: Render) -> None:
    deviceclass = by_kind(render("grouped"), "DeviceClass")
    assert deviceclass["apiVersion"] == "resource.k8s.io/v1"
    assert deviceclass["metadata"]["name"] == "dra.cpu"
    assert deviceclass["spec"] == {
        "selectors": [{"cel": {"expression": 'device.driver == "dra.cpu"'}}]
    }


# -- the DaemonSet (behavior.md §17.3) -----------------------------------------------------


@pytest.mark.parametrize("name", OVERLAYS)
def test_daemonset_pod_shape(render: Render, name: str) -> None:
    objects = render(name)
    daemonset = _daemonset(objects)
    assert daemonset["metadata"]["name"] == "dracpu"
    assert daemonset["spec"]["selector"] == {"matchLabels": {"app": "dracpu"}}
    assert daemonset["spec"]["template"]["metadata"]["labels"]["app"] == "dracpu"
    pod = _pod(objects)
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["hostNetwork"] is True
    assert pod["tolerations"] == [
        {"operator": "Exists", "effect": "NoSchedule"},
        {"operator": "Exists", "effect": "NoExecute"},
    ]
    assert pod["nodeSelector"]["kubernetes.io/os"] == "linux"
    container = _container(objects)
    assert container["image"] == IMAGE
    assert container["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    ]
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "96Mi"}
    assert set(container["resources"]["limits"]) == {"memory"}


@pytest.mark.parametrize("name", OVERLAYS)
def test_probes_use_the_healthz_port_of_the_bind_address(
    render: Render, name: str, tmp_path: Path
) -> None:
    objects = render(name)
    container = _container(objects)
    _, config = _daemon_config(objects, tmp_path)
    host, _, port = config.bindAddress.rpartition(":")
    assert host == "", "hostNetwork: the kubelet probes the node's address"
    assert container["ports"] == [
        {"name": "healthz", "containerPort": int(port), "protocol": "TCP"}
    ]
    probes = {
        kind: container[kind]["httpGet"]
        for kind in ("livenessProbe", "readinessProbe", "startupProbe")
    }
    assert probes == {
        "livenessProbe": {"path": "/healthz", "port": "healthz"},
        "readinessProbe": {"path": "/readyz", "port": "healthz"},
        "startupProbe": {"path": "/healthz", "port": "healthz"},
    }
    assert container["livenessProbe"]["initialDelaySeconds"] == 10
    assert container["readinessProbe"]["initialDelaySeconds"] == 5
    # /debug/state names every pod's CPUs: it stays on the node's loopback.
    assert config.debugAddress.startswith("127.0.0.1:")


@pytest.mark.parametrize("name", OVERLAYS)
def test_security_context_is_least_privilege(render: Render, name: str) -> None:
    objects = render(name)
    context = _container(objects)["securityContext"]
    assert context["privileged"] is False
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["runAsUser"] == 0
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    pod = _pod(objects)
    assert not pod.get("hostPID") and not pod.get("hostIPC")
    assert "privileged" not in pod.get("securityContext", {})


def _mounts(objects: list[dict[str, Any]]) -> dict[str, tuple[str, bool, str]]:
    """name → (mount path, read-only, hostPath type) for the hostPath volumes, checking
    that each is mounted at its host path."""
    volumes = {v["name"]: v for v in _pod(objects)["volumes"]}
    result = {}
    for mount in _container(objects)["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "hostPath" not in volume:
            continue
        assert volume["hostPath"]["path"] == mount["mountPath"], mount["name"]
        result[mount["name"]] = (
            mount["mountPath"],
            mount.get("readOnly", False),
            volume["hostPath"]["type"],
        )
    return result


@pytest.mark.parametrize("name", ["grouped", "individual"])
def test_host_mounts(render: Render, name: str) -> None:
    objects = render(name)
    assert _mounts(objects) == HOST_MOUNTS
    volumes = {v["name"]: v for v in _pod(objects)["volumes"]}
    assert set(volumes) == {*HOST_MOUNTS, "config", "tmp"}
    mounts = {m["name"]: m for m in _container(objects)["volumeMounts"]}
    assert mounts["config"] == {"name": "config", "mountPath": "/etc/dracpu", "readOnly": True}
    assert mounts["tmp"] == {"name": "tmp", "mountPath": "/tmp"}
    assert "emptyDir" in volumes["tmp"]
    assert mounts["sysfs"]["recursiveReadOnly"] == "IfPossible"


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_path_the_daemon_uses_is_mounted(render: Render, name: str, tmp_path: Path) -> None:
    """The paths come from the daemon's own flag parsing and config resolution."""
    objects = render(name)
    _, config = _daemon_config(objects, tmp_path)
    mounts = _mounts(objects)
    by_path = {path: read_only for path, read_only, _ in mounts.values()}
    paths = kubelet_paths(config)
    writable = {
        paths.registrar_dir,
        paths.plugin_dir,
        config.cdiDir,
        config.stateDir,
        posixpath.dirname(config.nriSocket),
        config.cgroupRoot,
    }
    for path in writable:
        assert by_path.get(path) is False, f"{path} must be a read-write host mount"
    assert by_path[config.sysfsRoot] is True
    assert set(by_path) == writable | {config.sysfsRoot}


# -- the ConfigMap and the overlays --------------------------------------------------------

_HASHED = re.compile(r"dracpu-config-[a-z0-9]{10}")


@pytest.mark.parametrize(
    ("name", "mode", "group_by"),
    [
        ("grouped", "grouped", "numanode"),
        ("individual", "individual", "numanode"),
        ("custom-kubelet-root", "grouped", "numanode"),
        ("node-selector", "grouped", "numanode"),
        ("no-admission-policy", "grouped", "numanode"),
    ],
)
def test_overlay_config(
    render: Render, name: str, mode: str, group_by: str, tmp_path: Path
) -> None:
    objects = render(name)
    configmap = by_kind(objects, "ConfigMap")
    assert _HASHED.fullmatch(configmap["metadata"]["name"])
    assert set(configmap["data"]) == {"config.yaml"}
    volumes = {v["name"]: v for v in _pod(objects)["volumes"]}
    assert volumes["config"]["configMap"]["name"] == configmap["metadata"]["name"]
    _, config = _daemon_config(objects, tmp_path)
    assert (config.cpuDeviceMode, config.groupBy) == (mode, group_by)
    root = K0S_ROOT if name == "custom-kubelet-root" else "/var/lib/kubelet"
    assert config.kubeletRootDir == root


def test_each_overlay_config_file_loads(tmp_path: Path) -> None:
    """The files users edit, read by the daemon's loader (not only their rendered copy)."""
    for name in ("grouped", "individual"):
        config = load_config(str(DEPLOY / "overlays" / name / "config.yaml"), {})
        assert config.cpuDeviceMode == name
    assert load_config(str(DEPLOY / "base" / "config.yaml"), {}) == DriverConfig()


def _same_except(a: Any, b: Any, path: str = "") -> list[str]:
    """The paths where two rendered objects differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d
            for k in sorted(set(a) | set(b))
            for d in _same_except(a.get(k), b.get(k), f"{path}/{k}")
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _same_except(x, y, f"{path}/{i}")
        ]
    return [] if a == b else [path]


def test_grouped_and_individual_differ_only_in_the_config(render: Render) -> None:
    grouped = {o["kind"]: o for o in render("grouped")}
    individual = {o["kind"]: o for o in render("individual")}
    diffs = {kind: _same_except(grouped[kind], individual[kind]) for kind in KINDS}
    assert diffs.pop("ConfigMap") == ["/data/config.yaml", "/metadata/name"]
    assert diffs.pop("DaemonSet") == ["/spec/template/spec/volumes/7/configMap/name"]
    assert all(not d for d in diffs.values()), diffs


def test_custom_kubelet_root_differs_only_in_the_kubelet_paths(render: Render) -> None:
    grouped = {o["kind"]: o for o in render("grouped")}
    custom = {o["kind"]: o for o in render("custom-kubelet-root")}
    for kind in KINDS - {"DaemonSet"}:
        assert custom[kind] == grouped[kind], kind
    container = _container(render("custom-kubelet-root"))
    assert container["args"][-1] == f"--kubelet-root-dir={K0S_ROOT}"
    assert sum(a.startswith("--kubelet-root-dir") for a in container["args"]) == 1
    assert "--kubelet-root-dir" not in " ".join(_container(render("grouped"))["args"])
    assert _mounts(render("custom-kubelet-root")) == {
        **HOST_MOUNTS,
        "kubelet-plugin": (f"{K0S_ROOT}/plugins/dra.cpu", False, "DirectoryOrCreate"),
        "kubelet-registry": (f"{K0S_ROOT}/plugins_registry", False, "Directory"),
    }
    # Nothing else moved: undoing the root change gives the grouped DaemonSet back.
    custom["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["args"].pop()
    undone = repr(custom["DaemonSet"]).replace(K0S_ROOT, "/var/lib/kubelet")
    assert undone == repr(grouped["DaemonSet"])


def test_node_selector_overlay_differs_only_in_the_node_selector(render: Render) -> None:
    grouped = {o["kind"]: o for o in render("grouped")}
    selected = {o["kind"]: o for o in render("node-selector")}
    diffs = {kind: _same_except(grouped[kind], selected[kind]) for kind in KINDS}
    assert diffs.pop("DaemonSet") == ["/spec/template/spec/nodeSelector/dra.cpu/enabled"]
    assert all(not d for d in diffs.values()), diffs
    pod = selected["DaemonSet"]["spec"]["template"]["spec"]
    # Added beside the base's Linux selector, not instead of it.
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", "dra.cpu/enabled": "true"}


def test_no_admission_policy_overlay_only_leaves_out_the_policy(render: Render) -> None:
    grouped = render("grouped")
    without = render("no-admission-policy")
    assert [o for o in grouped if o["kind"] not in POLICY_KINDS] == without


# -- where the pod runs, and what it tolerates ---------------------------------------------------


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, str]) -> bool:
    """Kubernetes' matching (k8s.io/api/core/v1 Toleration.ToleratesTaint): an empty key
    with Exists matches every key, an empty effect every effect; Equal compares values."""
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint["effect"]:
            continue
        if toleration.get("key") and toleration["key"] != taint["key"]:
            continue
        operator = toleration.get("operator", "Equal")
        if operator == "Exists" or toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_pod_stays_on_tainted_nodes(render: Render, name: str) -> None:
    """A node tainted NoExecute may still run pods with claims: dracpu is not evicted."""
    tolerations = _pod(render(name))["tolerations"]
    for taint in (
        {"key": "example.com/maintenance", "value": "true", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "latency", "effect": "NoExecute"},
    ):
        assert _tolerates(tolerations, taint), taint
    # The matcher is not vacuous: the old tolerations let a NoExecute taint evict the pod.
    old = [{"operator": "Exists", "effect": "NoSchedule"}]
    assert not _tolerates(old, {"key": "dedicated", "value": "x", "effect": "NoExecute"})


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_pod_runs_on_linux_nodes_only(render: Render, name: str) -> None:
    selector = _pod(render(name))["nodeSelector"]
    assert selector["kubernetes.io/os"] == "linux"
    windows = {"kubernetes.io/os": "windows", "dra.cpu/enabled": "true"}
    assert not all(windows.get(k) == v for k, v in selector.items())


# -- what users do with it -----------------------------------------------------------------


def _overlay_in(tmp_path: Path, kustomization: str, config: str | None = None) -> Path:
    """A user's overlay on top of deploy/overlays/grouped, in a temp dir (kustomize wants
    relative paths to bases)."""
    grouped = os.path.relpath(DEPLOY / "overlays" / "grouped", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(f"resources:\n- {grouped}\n{kustomization}")
    if config is not None:
        (tmp_path / "config.yaml").write_text(config)
    return tmp_path


def test_a_config_change_renames_the_configmap_and_rolls_the_pods(
    render: Render, tmp_path: Path
) -> None:
    before = by_kind(render("grouped"), "ConfigMap")["metadata"]["name"]
    overlay = _overlay_in(
        tmp_path,
        "configMapGenerator:\n- name: dracpu-config\n  behavior: replace\n  files: [config.yaml]\n",
        'apiVersion: v1alpha1\ncpuDeviceMode: grouped\ngroupBy: numanode\nreservedCPUs: "0-1"\n',
    )
    objects = kustomize(overlay)
    after = by_kind(objects, "ConfigMap")["metadata"]["name"]
    assert _HASHED.fullmatch(after) and after != before
    volumes = {v["name"]: v for v in _pod(objects)["volumes"]}
    assert volumes["config"]["configMap"]["name"] == after
    _, config = _daemon_config(objects, tmp_path)
    assert config.reservedCPUs == "0-1"


def test_the_image_can_be_overridden(tmp_path: Path) -> None:
    overlay = _overlay_in(
        tmp_path,
        "images:\n- name: ghcr.io/dracpu/dracpu\n"
        "  newName: registry.example/dracpu\n  newTag: dev\n",
    )
    assert _container(kustomize(overlay))["image"] == "registry.example/dracpu:dev"


def test_missing_kubectl_skips_locally_and_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import deploy_render

    monkeypatch.setattr(deploy_render.shutil, "which", lambda name: None)
    monkeypatch.setattr(deploy_render, "KUBECTL_FALLBACK", tmp_path / "kubectl")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="mandatory under CI=true"):
        deploy_render.kubectl_path()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="kubectl is required under CI=true"):
        deploy_render.kubectl_path()
