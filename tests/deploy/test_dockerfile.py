"""The Dockerfile and .dockerignore, checked without Docker (it cannot run on these machines).

The Dockerfile is parsed into its stages and instructions and held to what the image must
be: a builder stage that makes the wheels, a final stage on the same slim base that
installs only those wheels offline from a build-time mount (so no wheel, cache or compiler
is left in a layer), `dracpu` as entrypoint with `run` as the default command, and the
`dracpu-gatherinfo` alias. The build context is then reproduced from .dockerignore, and
the wheel is really built from it and installed, as the builder and final stages do.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from dracpu.cli import SUBCOMMANDS

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "python:3.11-slim"


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for word, rest in self.instructions if word == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) — comments dropped, continuation lines joined, ARGs
    before the first FROM substituted into FROM, as the Dockerfile frontend does."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue  # comments (and the syntax directive); they may sit inside a continuation
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continuation"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in filter(str.strip, logical):
        word, _, rest = line.strip().partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "FROM":
            parts = rest.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            assert len(parts) in (1, 3), f"unexpected FROM: {rest}"
            stages.append(Stage(image, name))
        elif not stages:
            assert word == "ARG", f"{word} before the first FROM"
            key, _, default = rest.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append((word, rest))
    return global_args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile((REPO / "Dockerfile").read_text())[1]


def _runs(stage: Stage) -> list[list[str]]:
    return [shlex.split(cmd.replace("&&", " && ")) for cmd in stage.args("RUN")]


def test_parser_reads_continuations_and_stages() -> None:
    text = (
        "# syntax=docker/dockerfile:1\nARG B=img:1\nFROM ${B} AS one\nRUN a \\\n"
        '  # inside\n  b\nFROM img:2\nCMD ["x"]\n'
    )
    args, parsed = parse_dockerfile(text)
    assert args == {"B": "img:1"}
    assert [(s.image, s.name) for s in parsed] == [("img:1", "one"), ("img:2", None)]
    assert parsed[0].instructions == [("RUN", "a    b")]


def test_two_stages_on_the_slim_python_base(stages: list[Stage]) -> None:
    assert [(s.image, s.name) for s in stages] == [(BASE_IMAGE, "builder"), (BASE_IMAGE, None)]


def _commands(run: list[str]) -> list[list[str]]:
    """One RUN's `&&`-joined commands."""
    out: list[list[str]] = [[]]
    for word in run:
        if word == "&&":
            out.append([])
        else:
            out[-1].append(word)
    return out


def test_builder_makes_the_wheels_from_the_lock_and_the_source(stages: list[Stage]) -> None:
    builder = stages[0]
    assert builder.args("COPY") == [
        "pyproject.toml README.md ./",
        "requirements/image.txt ./requirements/",
        "src ./src",
    ]
    (run,) = _runs(builder)
    deps, own, keep = _commands(run)
    for wheel in (deps, own):
        assert wheel[:4] == ["python", "-m", "pip", "wheel"]
        assert "--wheel-dir" in wheel and wheel[wheel.index("--wheel-dir") + 1] == "/wheels"
    # Dependencies must arrive as wheels, exactly the locked files: nothing is compiled,
    # nothing unlocked is fetched.
    assert deps[deps.index("--only-binary") + 1] == ":all:"
    assert "--require-hashes" in deps and deps[-2:] == ["-r", "requirements/image.txt"]
    assert own[-2:] == ["--no-deps", "."]
    assert keep == ["cp", "requirements/image.txt", "/wheels/requirements.txt"]
    assert any("PIP_NO_CACHE_DIR=1" in env for env in builder.args("ENV"))


def test_final_stage_installs_only_the_wheels_offline(stages: list[Stage]) -> None:
    final = stages[-1]
    # Nothing is copied in: a COPY would leave the wheels (or the source) in a layer.
    assert not final.args("COPY") and not final.args("ADD")
    (run,) = _runs(final)
    assert run[0] == "--mount=type=bind,from=builder,source=/wheels,target=/wheels"
    deps, own = _commands(run[1:])[:2]
    for install in (deps, own):
        assert install[:4] == ["python", "-m", "pip", "install"]
        assert {"--no-cache-dir", "--no-index", "--find-links=/wheels"} <= set(install)
    assert "--require-hashes" in deps and deps[-2:] == ["-r", "/wheels/requirements.txt"]
    assert own[-2:] == ["--no-deps", "dracpu"]
    commands = " ".join(run)
    assert "pip uninstall --yes pip setuptools wheel" in commands
    for tool in ("apt-get", "apk", "gcc", "build-essential", "make ", "cc "):
        assert tool not in commands, tool


def test_entrypoint_runs_the_daemon(stages: list[Stage]) -> None:
    final = stages[-1]
    (entrypoint,) = final.args("ENTRYPOINT")
    (cmd,) = final.args("CMD")
    # Exec form (JSON), so signals reach dracpu and not a shell.
    assert json.loads(entrypoint) == ["dracpu"]
    assert json.loads(cmd) == ["run"]
    assert "run" in SUBCOMMANDS
    assert final.args("USER") == ["0:0"]
    assert final.args("EXPOSE") == ["8080"]


def test_image_and_daemonset_agree(stages: list[Stage]) -> None:
    """The DaemonSet runs what the image's entrypoint and command say, on the exposed port."""
    daemonset = yaml.safe_load((REPO / "deploy" / "base" / "daemonset.yaml").read_text())
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    final = stages[-1]
    (entrypoint,) = final.args("ENTRYPOINT")
    (cmd,) = final.args("CMD")
    assert container["command"] == json.loads(entrypoint) + json.loads(cmd)
    assert [p["containerPort"] for p in container["ports"]] == [int(final.args("EXPOSE")[0])]
    kustomization = yaml.safe_load((REPO / "deploy" / "base" / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert container["image"] == f"{image['name']}:{image['newTag']}"


def test_gatherinfo_alias_and_upstream_paths(stages: list[Stage]) -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {
        "dracpu": "dracpu.cli:main",
        "dracpu-gatherinfo": "dracpu.cli:gatherinfo_main",
    }
    commands = " ".join(" ".join(r) for r in _runs(stages[-1]))
    assert "ln -s /usr/local/bin/dracpu /dracpu" in commands
    assert "ln -s /usr/local/bin/dracpu-gatherinfo /dracpu-gatherinfo" in commands


# -- the build context -----------------------------------------------------------------------


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regex over a
    slash-separated relative path."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out.append(pattern[i : end + 1])
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def dockerignore(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        rules.append((negated, _glob_regex(pattern)))
    return rules


def in_context(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories
    decides; no match means included."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for negated, regex in rules:
        if any(regex.fullmatch(p) for p in prefixes):
            included = negated
    return included


@pytest.fixture(scope="module")
def rules() -> list[tuple[bool, re.Pattern[str]]]:
    return dockerignore((REPO / ".dockerignore").read_text())


def test_matcher_follows_docker_rules() -> None:
    rules = dockerignore("*\n!src/\nsrc/*.egg-info\n**/__pycache__\n")
    assert in_context("src/a/b.py", rules)
    assert not in_context("tests/x.py", rules)
    assert not in_context("src/x.egg-info/PKG-INFO", rules)
    assert not in_context("src/a/__pycache__/b.pyc", rules)


def test_context_holds_only_what_the_build_reads(rules: list[tuple[bool, re.Pattern[str]]]) -> None:
    for path in (
        "pyproject.toml",
        "README.md",
        "requirements/image.txt",
        "src/dracpu/cli/__init__.py",
        "src/dracpu/py.typed",
        "src/dracpu/proto/dra/v1/api_pb2.py",
    ):
        assert in_context(path, rules), path
    for path in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        "deploy/base/kustomization.yaml",
        "docs/quickstart.md",
        "bench/allocate.py",
        "sim/pyproject.toml",
        "sim/src/dracpu_sim/demo/runner.py",
        "Dockerfile",
        "src/dracpu.egg-info/PKG-INFO",
        "src/dracpu/__pycache__/cli.cpython-311.pyc",
        ".mypy_cache/3.11/x.json",
    ):
        assert not in_context(path, rules), path


def _context_files(rules: list[tuple[bool, re.Pattern[str]]]) -> list[str]:
    files = []
    for dirpath, dirnames, filenames in os.walk(REPO):
        rel_dir = os.path.relpath(dirpath, REPO)
        # Pruning is only for speed: the big trees are excluded as a whole anyway.
        # (Docker would still look inside for re-included paths; ours has none there.)
        dirnames[:] = [
            d for d in dirnames if in_context(os.path.normpath(os.path.join(rel_dir, d)), rules)
        ]
        for name in filenames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if in_context(rel, rules):
                files.append(rel)
    return sorted(files)


def test_wheel_builds_from_the_context_and_installs(
    rules: list[tuple[bool, re.Pattern[str]]], tmp_path: Path
) -> None:
    context = tmp_path / "context"
    for rel in _context_files(rules):
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, context / rel)
    assert sorted(p.name for p in context.iterdir()) == [
        "README.md",
        "pyproject.toml",
        "requirements",
        "src",
    ]
    assert [p.name for p in (context / "requirements").iterdir()] == ["image.txt"]

    # The builder stage's command, offline: build isolation would fetch setuptools.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "wheels"), str(context)],
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    (wheel,) = (tmp_path / "wheels").glob("dracpu-*.whl")
    sources = {
        str(p.relative_to(REPO / "src"))
        for p in (REPO / "src" / "dracpu").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert sources <= names, sorted(sources - names)
    assert "dracpu/py.typed" in names
    # The daemon only: the simulated node is its own distribution (sim/).
    simulator = sorted(
        n for n in names if n.startswith(("dracpu_sim", "dracpu/sim/", "dracpu/demo/"))
    )
    assert simulator == []
    assert "dracpu = dracpu.cli:main" in entry_points
    assert "dracpu-gatherinfo = dracpu.cli:gatherinfo_main" in entry_points

    # The final stage's install, offline from the wheel directory; dependencies come
    # from this venv, which the test extras make a superset of the runtime ones.
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--no-cache-dir", "--find-links", str(tmp_path / "wheels"), "--target", str(target),
         "dracpu"],
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = "import dracpu.cli, dracpu.proto.dra.v1.api_pb2; print(dracpu.__file__)"
    where = subprocess.run(
        [sys.executable, "-c", probe],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert where.stdout.startswith(str(target))
    alias = subprocess.run(
        [str(target / "bin" / "dracpu-gatherinfo"), "--help"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert alias.returncode == 0, alias.stderr
    assert alias.stdout.startswith("usage: dracpu gatherinfo")  # help goes to stdout


def test_simulator_is_its_own_distribution(tmp_path: Path) -> None:
    """sim/ builds a wheel holding the simulated node and none of the daemon's modules."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "wheels"), str(REPO / "sim")],
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    (wheel,) = (tmp_path / "wheels").glob("dracpu_sim-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        requires = next(zf.read(n).decode() for n in names if n.endswith("METADATA"))
    modules = {n for n in names if n.endswith(".py")}
    assert "dracpu_sim/demo/runner.py" in modules
    assert "dracpu_sim/chaos/run.py" in modules
    assert "dracpu_sim/py.typed" in names
    assert not {n for n in modules if not n.startswith("dracpu_sim/")}
    assert "Requires-Dist: dracpu\n" in requires
