"""A reader that closes stdout early (`dracpu demo | head -2`) ends the command quietly:
exit 141 (128 + SIGPIPE, as a shell reports for `yes | head -1`), nothing on stderr, and
no "Exception ignored ... BrokenPipeError" from Python's own flush at exit (issue 26)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRACPU = str(REPO / ".venv" / "bin" / "dracpu")
FIXTURES = REPO / "tests" / "fake_sysfs"


def with_closed_stdout(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run dracpu with a stdout pipe nobody reads: every write is EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [DRACPU, *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
            check=False,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "args",
    [
        ["introspect", "metrics"],
        ["--help"],
        ["demo", "--help"],
        ["version"],
        ["introspect", "slices", "--sysfs-root", str(FIXTURES / "epyc-nps4")],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_closed_stdout_ends_quietly(args: list[str]) -> None:
    proc = with_closed_stdout(*args)
    assert (proc.returncode, proc.stderr) == (141, "")


def _pipeline(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("head") is None, reason="bash")
def test_introspect_slices_into_head() -> None:
    # The output (~40 KB of YAML, more than one write) outlives `head -1`.
    slices = f"{DRACPU} introspect slices --sysfs-root {FIXTURES / 'epyc-nps4'}"
    config = REPO / "deploy" / "overlays" / "individual" / "config.yaml"
    if config.exists():
        slices += f" --config {shlex.quote(str(config))}"
    proc = _pipeline(f"{slices} | head -1")
    assert proc.stdout == "---\n"
    assert proc.stderr == ""
    assert proc.returncode in (0, 141)  # 0 only if it all fit in the pipe before head left


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("head") is None, reason="bash")
def test_demo_into_head() -> None:
    proc = _pipeline(f"{DRACPU} demo --sysfs-root {FIXTURES / 'xeon-2s-ht'} | head -2")
    assert len(proc.stdout.splitlines()) == 2
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 141, proc.stderr


def test_python_m_dracpu_too() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "dracpu", "introspect", "metrics"],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")
