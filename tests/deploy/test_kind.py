"""deploy/kind: one kind cluster definition per supported Kubernetes version and the
`make kind-e2e` script. Neither kind nor a cluster runs here: the definitions are checked
against kind's v1alpha4 Cluster fields (kind decodes its config strictly, so an unknown
field fails `kind create cluster`), the feature gates against the version table of
docs/quickstart.md, the containerd patches (TOML) against the paths the rendered DaemonSet
gives the daemon, and the script with `bash -n`, shellcheck when installed, and its cpuset
helpers run on their own.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from deploy_render import DEPLOY, by_kind

from dracpu.flags import parse_root_flags

Render = Callable[[str], list[dict[str, Any]]]

REPO = Path(__file__).resolve().parents[2]
KIND = DEPLOY / "kind"
SCRIPT = KIND / "e2e.sh"
EXAMPLES = REPO / "docs" / "examples"

# kind's v1alpha4 Cluster and Node (sigs.k8s.io/kind pkg/apis/config/v1alpha4/types.go).
_PATCH_6902 = {"type": "array", "items": {"type": "object"}}
_NODE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["role"],
    "properties": {
        "role": {"enum": ["control-plane", "worker"]},
        "image": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "extraMounts": {"type": "array"},
        "extraPortMappings": {"type": "array"},
        "kubeadmConfigPatches": {"type": "array", "items": {"type": "string"}},
        "kubeadmConfigPatchesJSON6902": _PATCH_6902,
    },
}
KIND_CLUSTER_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["kind", "apiVersion", "nodes"],
    "properties": {
        "kind": {"const": "Cluster"},
        "apiVersion": {"const": "kind.x-k8s.io/v1alpha4"},
        "name": {"type": "string"},
        "nodes": {"type": "array", "minItems": 1, "items": _NODE},
        "networking": {"type": "object"},
        "featureGates": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "runtimeConfig": {"type": "object", "additionalProperties": {"type": "string"}},
        "kubeadmConfigPatches": {"type": "array", "items": {"type": "string"}},
        "kubeadmConfigPatchesJSON6902": _PATCH_6902,
        "containerdConfigPatches": {"type": "array", "items": {"type": "string"}},
        "containerdConfigPatchesJSON6902": {"type": "array", "items": {"type": "string"}},
    },
}


def supported_versions() -> dict[str, dict[str, bool]]:
    """Kubernetes minor → the feature gates docs/quickstart.md says the default (grouped)
    install needs there; "1.36 and newer" counts as 1.36."""
    text = (REPO / "docs" / "quickstart.md").read_text()
    found: dict[str, dict[str, bool]] = {}
    for line in text.splitlines():
        match = re.match(r"\| (1\.\d+)( and newer)? \|.*\| (.+) \|$", line)
        if match is None or "not supported" in line:
            continue
        gates = dict.fromkeys(re.findall(r"--feature-gates=(\w+)=true", match.group(3)), True)
        found[match.group(1)] = gates
    return found


def _configs() -> dict[str, dict[str, Any]]:
    return {
        path.stem.removeprefix("kind-"): yaml.safe_load(path.read_text())
        for path in sorted(KIND.glob("kind-*.yaml"))
    }


def test_the_docs_table_is_read() -> None:
    assert supported_versions() == {
        "1.34": {"DRAConsumableCapacity": True},
        "1.35": {"DRAConsumableCapacity": True},
        "1.36": {},
    }


def test_one_config_per_supported_version() -> None:
    assert set(_configs()) == set(supported_versions())


@pytest.mark.parametrize("version", sorted(supported_versions()))
def test_config_is_a_valid_kind_cluster(version: str) -> None:
    config = _configs()[version]
    jsonschema.validate(config, KIND_CLUSTER_SCHEMA)
    assert config.get("featureGates", {}) == supported_versions()[version]
    roles = [n["role"] for n in config["nodes"]]
    assert roles == ["control-plane", "worker"]
    for node in config["nodes"]:
        assert re.fullmatch(rf"kindest/node:v{re.escape(version)}\.\d+", node["image"])


def test_the_schema_check_is_not_vacuous() -> None:
    config = _configs()["1.34"]
    config["featureGate"] = config.pop("featureGates")
    with pytest.raises(jsonschema.ValidationError, match="featureGate"):
        jsonschema.validate(config, KIND_CLUSTER_SCHEMA)
    config = _configs()["1.34"]
    config["featureGates"]["DRAConsumableCapacity"] = "true"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, KIND_CLUSTER_SCHEMA)


@pytest.mark.parametrize("version", sorted(supported_versions()))
def test_containerd_has_nri_and_cdi_where_the_daemonset_looks(render: Render, version: str) -> None:
    (patch,) = _configs()[version]["containerdConfigPatches"]
    toml = tomllib.loads(patch)
    nri = toml["plugins"]["io.containerd.nri.v1.nri"]
    cri = toml["plugins"]["io.containerd.grpc.v1.cri"]
    container = by_kind(render("grouped"), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    flags = parse_root_flags(container["args"]).explicit
    assert nri["disable"] is False and nri["disable_connections"] is False
    assert nri["socket_path"] == flags["nri-socket"]
    assert cri["enable_cdi"] is True
    assert flags["cdi-dir"] in cri["cdi_spec_dirs"]


# -- the script and its make target ---------------------------------------------------------


def test_make_kind_e2e_runs_the_script() -> None:
    makefile = (REPO / "Makefile").read_text()
    match = re.search(r"^kind-e2e:\n\t(.+)$", makefile, re.M)
    assert match is not None
    assert match.group(1) == "K8S_VERSION=$(K8S_VERSION) deploy/kind/e2e.sh"
    default = re.search(r"^K8S_VERSION \?= (1\.\d+)$", makefile, re.M)
    assert default is not None and default.group(1) in _configs()
    assert SCRIPT.stat().st_mode & 0o111


def test_script_parses() -> None:
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_script_passes_shellcheck() -> None:
    proc = subprocess.run(
        ["shellcheck", "-x", str(SCRIPT)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout


def _helpers(call: str) -> str:
    """Run the script's cpuset helpers (between its `# -- cpusets` and `# -- steps`
    markers) with `call`, without the rest of the script."""
    text = SCRIPT.read_text()
    helpers = text[text.index("# -- cpusets") : text.index("# -- steps")]
    proc = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{helpers}\n{call}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return f"{proc.returncode}:{proc.stdout}"


def test_cpuset_helpers() -> None:
    assert _helpers('expand_cpus "0-3,8,10-11"') == "0:0 1 2 3 8 10 11 "
    assert _helpers('expand_cpus "5"') == "0:5 "
    assert _helpers('cpus_within "1 2 " "0 1 2 3 " && echo yes') == "0:yes\n"
    assert _helpers('cpus_within "1 9 " "0 1 2 3 " || echo no') == "0:no\n"
    assert _helpers('cpus_overlap "4 5 " "5 6 " && echo yes') == "0:yes\n"
    assert _helpers('cpus_overlap "4 " "10 11 " || echo no') == "0:no\n"


def test_every_example_runs_in_the_mode_it_needs() -> None:
    """The script picks the individual install for files that name its overlay; those are
    exactly the examples that count devices instead of asking for capacity."""
    examples = sorted(EXAMPLES.glob("*.yaml"))
    assert examples
    skipped = [p.name for p in examples if "\n# kind-e2e: skip" in p.read_text()]
    # Only the example whose other devices come from the simulated node's stand-in drivers.
    assert skipped == ["gpu-cpu-nic.yaml"]
    for path in examples:
        text = path.read_text()
        if path.name in skipped:
            continue
        individual = "deploy/overlays/individual" in text
        assert individual == ("allocationMode: ExactCount" in text), path.name
        assert individual != ("dra.cpu/cpu:" in text), path.name
        # check_cpusets reads /proc and the env with sh, grep and env: busybox has them.
        for doc in yaml.safe_load_all(text):
            if doc["kind"] == "Pod":
                pod = doc["spec"]
            elif doc["kind"] == "Deployment":
                pod = doc["spec"]["template"]["spec"]
            else:
                continue
            for container in pod["containers"]:
                assert container["image"].startswith("busybox:"), (path.name, container["name"])
