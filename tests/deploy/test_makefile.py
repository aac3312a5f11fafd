"""`make .venv`: builds the venv, keeps a good one, rebuilds one made by another Python,
and refuses a Python older than 3.11 with one clear line. Runs make on a copy of the
Makefile with a stand-in interpreter (no real venv, no pip)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]

# A stand-in for python: answers the Makefile's identity question from $FAKE_ID, its
# version check from $FAKE_OK, and `-m venv DIR` with a copy of itself that keeps the
# identity it was made with; `-m pip` succeeds.
FAKE_PYTHON = """#!/bin/sh
case "$1" in
  -V) echo "Python ${FAKE_ID%% *}" ;;
  -c) case "$2" in *version_info*) [ "$FAKE_OK" = 1 ] ;; *) echo "$FAKE_ID" ;; esac ;;
  -m) if [ "$2" = venv ]; then
        mkdir -p "$3/bin"
        { echo '#!/bin/sh'; echo "FAKE_ID='$FAKE_ID' FAKE_OK=1"; sed 1d "$0"; } >"$3/bin/python"
        chmod +x "$3/bin/python"
      fi ;;
esac
"""

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _make(tmp: Path, *args: str, ident: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    # Run as a top-level make even under `make test`: no "make[1]:" prefixes, no jobserver.
    outer = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEFILES")
    env = {k: v for k, v in os.environ.items() if k not in outer}
    env |= {"FAKE_ID": ident, "FAKE_OK": "1" if ok else "0"}
    env.pop("MAKEFLAGS", None)
    return subprocess.run(
        ["make", "--no-print-directory", f"PYTHON={tmp / 'python'}", *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    shutil.copy(REPO / "Makefile", tmp_path)
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    (tmp_path / "sim").mkdir()
    shutil.copy(REPO / "sim" / "pyproject.toml", tmp_path / "sim")
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    return tmp_path


def test_make_venv_builds_then_keeps_it(checkout: Path) -> None:
    first = _make(checkout, ".venv", ident="3.12.1 /opt/py312")
    assert first.returncode == 0, first.stderr
    assert (checkout / ".venv" / "bin" / "python").exists()
    assert (checkout / ".venv" / ".installed").exists()
    again = _make(checkout, ".venv", ident="3.12.1 /opt/py312")
    assert again.returncode == 0
    assert again.stdout.strip() == "make: Nothing to be done for '.venv'."


def test_venv_of_another_python_is_rebuilt(checkout: Path) -> None:
    assert _make(checkout, ".venv", ident="3.11.2 /usr").returncode == 0
    marker = checkout / ".venv" / "left-over"
    marker.touch()
    # `make -n` says it would rebuild, and leaves the venv alone.
    dry = _make(checkout, "-n", ".venv", ident="3.12.1 /opt/py312")
    assert ".venv was not built by" in dry.stdout and marker.exists()
    proc = _make(checkout, ".venv", ident="3.12.1 /opt/py312")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(
        f".venv was not built by {checkout / 'python'} (3.12.1 /opt/py312): building it again"
    )
    assert not marker.exists()
    assert (checkout / ".venv" / ".installed").exists()


def test_too_old_python_is_one_clear_line(checkout: Path) -> None:
    proc = _make(checkout, ".venv", ident="3.9.18 /usr", ok=False)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("make: ***")]
    assert lines == [
        f"dracpu needs Python 3.11 or newer; {checkout / 'python'} is Python 3.9.18. "
        "Run make PYTHON=python3.11 (or newer) .venv"
    ]
    assert not (checkout / ".venv").exists()
    # A later run with a good Python is not stuck on the failure.
    assert _make(checkout, ".venv", ident="3.12.1 /opt/py312").returncode == 0
