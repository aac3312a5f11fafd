"""Fixtures of the NRI tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest


@pytest.fixture
def sock_dir() -> Iterator[str]:
    # Unix socket paths must stay short: not under pytest's tmp_path.
    path = tempfile.mkdtemp(dir="/tmp", prefix="nri-")
    yield path
    shutil.rmtree(path, ignore_errors=True)
