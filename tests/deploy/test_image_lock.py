"""The image's dependency lock (requirements/image.txt): every pin has hashes, it covers the
daemon's dependencies from pyproject.toml and none of the simulator's, and what it installs
is enough for `dracpu run` while `dracpu demo` says what is missing."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements" / "image.txt"
SIM_ONLY = {"grpcio", "cel-python"}


def _pins() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of every requirement in the lock."""
    pins: dict[str, tuple[str, list[str]]] = {}
    text = re.sub(r"\\\n\s*", " ", LOCK.read_text())
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", line)
        assert match, f"not a pinned, hashed requirement: {line}"
        hashes = match.group(3).split()
        pins[canonicalize_name(match.group(1))] = (match.group(2), hashes)
    return pins


def _pyproject() -> dict[str, object]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def test_every_pin_has_a_version_and_hashes() -> None:
    pins = _pins()
    assert len(pins) >= 10
    assert all(hashes for _, hashes in pins.values())


def test_lock_covers_the_daemon_and_leaves_out_the_simulator() -> None:
    project = _pyproject()
    pins = _pins()
    for spec in project["dependencies"]:  # type: ignore[attr-defined]
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pins, f"{name} is a dependency but not in {LOCK.name}; regenerate it"
        assert req.specifier.contains(pins[name][0]), f"{name}=={pins[name][0]} breaks {req}"
    # The simulator's own dependencies, from its distribution (sim/pyproject.toml).
    sim_project = tomllib.loads((REPO / "sim" / "pyproject.toml").read_text())["project"]
    sim = {canonicalize_name(Requirement(s).name) for s in sim_project["dependencies"]} - {"dracpu"}
    assert sim == SIM_ONLY
    assert "sim" not in project.get("optional-dependencies", {})  # type: ignore[attr-defined]
    assert not sim & set(pins), "the simulator's dependencies are in the image lock"


def test_the_dockerfile_installs_from_the_lock_with_hashes() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "COPY requirements/image.txt ./requirements/" in dockerfile
    assert dockerfile.count("--require-hashes") == 2  # fetched in the builder, installed
    assert "!requirements/" in (REPO / ".dockerignore").read_text()


# Run in a child interpreter where only the lock's distributions (and the standard library
# and dracpu) can be imported, as in the image.
PROBE = """
import importlib.abc, importlib.metadata, json, sys

allowed = set(sys.stdlib_module_names) | {"dracpu", "_distutils_hack"}
locked = set(json.loads(sys.argv[1]))
for module, dists in importlib.metadata.packages_distributions().items():
    if any(d.lower().replace("_", "-") in locked for d in dists):
        allowed.add(module)


class ImageOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top not in allowed and not top.startswith("_"):
            raise ModuleNotFoundError(f"No module named {name!r} (not in the image)", name=name)
        return None


sys.meta_path.insert(0, ImageOnly())
from dracpu.daemon import lean_kubernetes_import
lean_kubernetes_import()
import dracpu.cli, dracpu.cli.run, dracpu.daemon.app, dracpu.k8s.client, dracpu.gatherinfo
from dracpu.cli import main
print("demo exit", main(["demo"]))
"""


def test_the_image_install_set_runs_the_daemon_not_the_simulator() -> None:
    import json

    locked = sorted(canonicalize_name(n) for n in _pins())
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(locked)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "demo exit 1"
    assert proc.stderr == (
        "dracpu: dracpu demo runs the simulated node, which is not installed: from a dracpu "
        "checkout, run make .venv (or pip install ./sim)\n"
    )
