"""Shared test fixtures.

``tests/`` is on ``sys.path`` so that every test module imports the shared helpers in
``tests/builders.py`` as ``builders`` (pytest's default "prepend" import mode puts this
file's directory there too; the line below makes it explicit).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from builders import FAKE_SYSFS, short_dir  # noqa: E402


@pytest.fixture
def fake_sysfs() -> Path:
    """Root of the checked-in sysfs trees of real machine shapes."""
    return FAKE_SYSFS


@pytest.fixture(autouse=True)
def short_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh directory right under /tmp, for unix sockets: a socket path must stay under
    108 bytes, which pytest's ``tmp_path`` does not. Every test gets one; ask for it by name
    to use it. More short directories come from ``builders.short_dir``.

    When the test ends this directory is removed, and so is every other one made with
    ``tempfile.mkdtemp`` during the test: by ``builders.short_dir``, other helpers, or the
    code under test (the chaos run's and the demo's work directories)."""
    made: list[str] = []
    real = tempfile.mkdtemp

    def mkdtemp(*args: Any, **kwargs: Any) -> str:
        path: str = real(*args, **kwargs)
        made.append(path)
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    yield short_dir("dt")
    for path in made:
        shutil.rmtree(path, ignore_errors=True)
