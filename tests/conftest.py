"""Shared test fixtures."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FAKE_SYSFS = Path(__file__).parent / "fake_sysfs"


@pytest.fixture
def fake_sysfs() -> Path:
    """Root of the checked-in sysfs trees of real machine shapes."""
    return FAKE_SYSFS


@pytest.fixture(autouse=True)
def _remove_short_temp_dirs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Unix socket paths must stay under 108 bytes, so many tests make short directories
    with ``tempfile.mkdtemp(dir="/tmp")`` instead of ``tmp_path``; remove each one when
    its test ends."""
    made: list[str] = []
    real = tempfile.mkdtemp

    def mkdtemp(*args: Any, **kwargs: Any) -> str:
        path = real(*args, **kwargs)
        made.append(path)
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    yield
    for path in made:
        shutil.rmtree(path, ignore_errors=True)
