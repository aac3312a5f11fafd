"""Every shell command in docs/ is run here, or checked as far as it can be without a
cluster (docs/development.md lists the markers)."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from mdblocks import REPO, SHELL_LANGS, Block, all_blocks, blocks, pages, words

from dracpu.cli import SUBCOMMANDS

SHELL_MARKERS = ("run", "cluster-only", "pending", "ci")
OTHER_MARKERS = ("output", "attributes", "cel grouped", "cel individual")
# Built by the daemon and demo work; their blocks switch to `run` when those land.
# Commands documented before they exist; every documented command is built today.
PENDING_COMMANDS: set[tuple[str, str]] = set()
CLUSTER_PROGRAMS = {
    "kubectl", "curl", "containerd", "crio", "ls", "docker", "dracpu",
    "podman", "buildah", "kind", "ctr",
}  # fmt: skip
BLOCK_TIMEOUT = 120

_BLOCKS = all_blocks()
_SHELL = [b for b in _BLOCKS if b.lang in SHELL_LANGS]


def _ids(found: list[Block]) -> list[str]:
    return [b.where for b in found]


def _marked(marker: str) -> list[Block]:
    return [b for b in _SHELL if b.marker == marker]


def _kubectl() -> str | None:
    found = shutil.which("kubectl")
    return found or ("/usr/bin/kubectl" if Path("/usr/bin/kubectl").exists() else None)


def _program(word: str) -> str:
    return word.removeprefix(".venv/bin/")


# -- every block is classified ----------------------------------------------------------------


def test_docs_have_shell_blocks_of_every_kind() -> None:
    markers = {b.marker for b in _SHELL}
    assert markers <= set(SHELL_MARKERS)
    assert {"run", "cluster-only", "ci"} <= markers
    assert len(_marked("run")) >= 10


@pytest.mark.parametrize("block", _SHELL, ids=_ids(_SHELL))
def test_every_shell_block_is_marked(block: Block) -> None:
    assert block.marker in SHELL_MARKERS, (
        f"{block.where}: put one of {', '.join(f'<!-- docs-check: {m} -->' for m in SHELL_MARKERS)}"
        " on the line above the fence"
    )


def test_markers_are_known_and_on_the_right_blocks() -> None:
    for block in _BLOCKS:
        if block.marker is None:
            continue
        assert block.marker in (*SHELL_MARKERS, *OTHER_MARKERS), block.where
        if block.marker in SHELL_MARKERS:
            assert block.lang in SHELL_LANGS, f"{block.where}: {block.marker} on a {block.lang}"
        if block.marker == "output":
            assert block.lang == "text", block.where
        if block.marker.startswith("cel"):
            assert block.lang == "yaml", block.where


def test_output_blocks_follow_a_run_block() -> None:
    for page in pages():
        found = blocks(page)
        for before, block in itertools.pairwise(found):
            if block.marker == "output":
                assert before.marker == "run", f"{block.where}: no run block right above"


# -- run blocks ---------------------------------------------------------------------------------


def _sandbox(tmp_path: Path) -> Path:
    """A directory that looks like the checkout (every top-level entry linked) but where
    files written at the top level stay in the temp dir."""
    work = tmp_path / "work"
    work.mkdir()
    for entry in REPO.iterdir():
        if entry.name != ".git":
            (work / entry.name).symlink_to(entry)
    return work


def _expected_output(block: Block) -> str | None:
    found = blocks(block.page)
    index = found.index(block)
    if index + 1 < len(found) and found[index + 1].marker == "output":
        return found[index + 1].text
    return None


_RUN = _marked("run")


@pytest.mark.parametrize("block", _RUN, ids=_ids(_RUN))
def test_run_block(block: Block, tmp_path: Path) -> None:
    if "kubectl" in block.text and _kubectl() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is required under CI=true")
        pytest.skip("kubectl not installed (mandatory under CI=true)")
    work = _sandbox(tmp_path)
    path = os.pathsep.join((str(REPO / ".venv" / "bin"), "/usr/bin", os.environ.get("PATH", "")))
    env = {
        **os.environ,
        "PATH": path,
        "TMPDIR": str(tmp_path),
        "HOME": str(tmp_path),
    }
    proc = subprocess.Popen(
        ["bash", "-e", "-u", "-o", "pipefail", "-c", block.text],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, so background jobs die with it
    )
    try:
        output, _ = proc.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{block.where}: still running after {BLOCK_TIMEOUT} s:\n{output}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    assert proc.returncode == 0, f"{block.where} exited {proc.returncode}:\n{output}"
    # A reader runs these in the checkout: whatever they write goes to a temp dir.
    written = sorted(e.name for e in work.iterdir() if not e.is_symlink())
    assert not written, f"{block.where} wrote {written} into the checkout; use mktemp -d"
    expected = _expected_output(block)
    if expected is not None:
        # `mktemp -d` names differ per run; the docs show them as /tmp/tmp.XXXXXXXXXX.
        shown = re.sub(r"/tmp\.[A-Za-z0-9]{10}", "/tmp.XXXXXXXXXX", output)
        shown = shown.replace(str(tmp_path), "/tmp")
        for line in expected.splitlines():
            assert line in shown.splitlines(), f"{block.where}: {line!r} not in:\n{output}"


# -- blocks that cannot run here ---------------------------------------------------------------


def _dracpu_help(args: list[str]) -> str:
    """`dracpu <subcommand...> --help` as the user would see it."""
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "dracpu"), *args, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


def _check_dracpu(argv: list[str], where: str) -> None:
    """The subcommand exists and every long option it is given appears in its help."""
    assert len(argv) >= 2 and argv[1] in SUBCOMMANDS, f"{where}: {' '.join(argv)}"
    path = argv[1:3] if argv[1] in ("introspect", "sim") else argv[1:2]
    text = _dracpu_help(path)
    for word in argv:
        if word.startswith("--") and word != "--help":
            option = word.split("=", 1)[0]
            assert option in text, f"{where}: {option} is not an option of {' '.join(path)}"


def _kubectl_paths(argv: list[str]) -> list[str]:
    paths = []
    for i, word in enumerate(argv):
        if word in ("-f", "-k") and i + 1 < len(argv):
            paths.append(argv[i + 1])
        elif word.startswith(("-f=", "-k=")):
            paths.append(word[3:])
    return paths


_CLUSTER = _marked("cluster-only")


@pytest.mark.parametrize("block", _CLUSTER, ids=_ids(_CLUSTER))
def test_cluster_only_block(block: Block) -> None:
    assert block.commands(), block.where
    for command in block.commands():
        argv = words(command)
        program = _program(argv[0])
        assert program in CLUSTER_PROGRAMS, f"{block.where}: unexpected program {argv[0]}"
        if program == "kubectl":
            for path in _kubectl_paths(argv):
                assert (REPO / path).exists(), f"{block.where}: {path} does not exist"
            if "--" in argv:  # kubectl exec POD -- dracpu ...
                inner = argv[argv.index("--") + 1 :]
                if _program(inner[0]) == "dracpu":
                    _check_dracpu(inner, block.where)
        elif program == "dracpu" and tuple(argv[:2]) not in PENDING_COMMANDS:
            _check_dracpu([program, *argv[1:]], block.where)


_PENDING = _marked("pending")


@pytest.mark.parametrize("block", _PENDING, ids=_ids(_PENDING))
def test_pending_block_names_a_command_being_built(block: Block) -> None:
    for command in block.commands():
        argv = words(command)
        if _program(argv[0]) == "kubectl" and "--" in argv:
            argv = argv[argv.index("--") + 1 :]
        assert (_program(argv[0]), argv[1]) in PENDING_COMMANDS, (
            f"{block.where}: `{command}` is not pending work; mark it run or cluster-only"
        )


_CI = _marked("ci")
_MAKE_TARGET = re.compile(r"^([\w-]+):", re.M)


@pytest.mark.parametrize("block", _CI, ids=_ids(_CI))
def test_ci_block_names_make_targets(block: Block) -> None:
    targets = set(_MAKE_TARGET.findall((REPO / "Makefile").read_text()))
    for command in block.commands():
        argv = words(command)
        assert argv[0] == "make" and len(argv) == 2, f"{block.where}: only `make TARGET` here"
        assert argv[1] in targets, f"{block.where}: no make target {argv[1]}"


def test_kubectl_is_available_for_the_run_blocks() -> None:
    """The run blocks render the overlays; under CI=true kubectl must be there."""
    uses_kubectl = any("kubectl" in b.text for b in _RUN)
    if _kubectl() is None:
        if os.environ.get("CI") == "true" and uses_kubectl:
            pytest.fail("kubectl is required under CI=true")
        pytest.skip("kubectl not installed")
    assert uses_kubectl
