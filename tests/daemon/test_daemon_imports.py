"""What the daemon's process imports: nothing it never uses (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dracpu.daemon import lean_kubernetes_import

# Run in a child interpreter: the test process has imported half the world already.
PROBE = """
import json, sys
from dracpu.daemon import lean_kubernetes_import
lean = lean_kubernetes_import()
import dracpu.daemon.app
from dracpu.k8s.client import KubeClient
kube = KubeClient.from_kubeconfig(sys.argv[1])
kube.resource  # used by the slice reconciler and the claim reader
print(json.dumps({"lean": lean, "modules": sorted(sys.modules)}))
"""

NEVER = (
    "celpy",  # CEL is the simulated scheduler's, not the driver's
    "kubernetes.client.api.core_v1_api",  # ~300 pydantic models for one GET of the Node
    "kubernetes.dynamic",
    "kubernetes.stream",
    "kubernetes.leaderelection",
    "kubernetes_validate",
    "jsonschema",
    "websocket",
)


def probe(kubeconfig: Path) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_the_daemon_imports_only_what_it_uses(kubeconfig: Path) -> None:
    result = probe(kubeconfig)
    assert result["lean"] is True
    modules = set(result["modules"])  # type: ignore[arg-type]
    assert "kubernetes.client" in modules and "kubernetes.config.kube_config" in modules
    assert "kubernetes.client.api.resource_v1_api" in modules
    loaded = sorted(m for m in modules if m in NEVER or m.split(".")[0] in NEVER)
    assert loaded == []


def test_lean_import_does_nothing_once_kubernetes_is_imported() -> None:
    import kubernetes

    before = sys.modules["kubernetes"]
    assert lean_kubernetes_import() is False
    assert sys.modules["kubernetes"] is before is kubernetes
