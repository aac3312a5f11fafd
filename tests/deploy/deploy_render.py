"""Rendering the kustomize overlays with the real `kubectl kustomize` (shared by the
deploy tests; the fixture is in conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
# The installs: each renders the whole driver (tests/deploy/test_deploy_manifests.py).
OVERLAYS = ("grouped", "individual", "custom-kubelet-root", "node-selector", "no-admission-policy")
# The grouped install plus monitoring objects (tests/deploy/test_monitoring.py).
MONITORING_OVERLAYS = ("monitoring", "monitoring-servicemonitor")
KUBECTL_FALLBACK = Path("/usr/bin/kubectl")


def kubectl_path() -> str:
    """kubectl, or a skip outside CI; under CI=true a missing kubectl is a failure."""
    found = shutil.which("kubectl")
    if found is None and KUBECTL_FALLBACK.exists():
        found = str(KUBECTL_FALLBACK)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is required under CI=true to render deploy/ overlays")
        pytest.skip("kubectl not installed (these checks are mandatory under CI=true)")
    return found


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR` parsed into objects; a failed build fails the test."""
    proc = subprocess.run(
        [kubectl_path(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc is not None]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one object of `kind`."""
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]
