"""Rendering the kustomize overlays with the real `kubectl kustomize`."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = ("grouped", "individual", "custom-kubelet-root")


def kubectl_path() -> str:
    """kubectl, or a skip outside CI; under CI=true a missing kubectl is a failure."""
    found = shutil.which("kubectl")
    if found is None and Path("/usr/bin/kubectl").exists():
        found = "/usr/bin/kubectl"
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


_CACHE: dict[Path, list[dict[str, Any]]] = {}


@pytest.fixture
def render() -> Callable[[str], list[dict[str, Any]]]:
    """Render `base` or an overlay name; each is built once per session, and every
    caller gets its own copy to inspect or change."""

    def _render(name: str) -> list[dict[str, Any]]:
        path = DEPLOY / "base" if name == "base" else DEPLOY / "overlays" / name
        if path not in _CACHE:
            _CACHE[path] = kustomize(path)
        return copy.deepcopy(_CACHE[path])

    return _render


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one object of `kind`."""
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]
