"""Fixtures of the kubelet tests (the node harness is ``kubelet_harness.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def cdi_dir(short_tmp: str) -> str:
    """The CDI spec directory of the test's node: ``cdi/`` in its short temp dir."""
    path = os.path.join(short_tmp, "cdi")
    os.mkdir(path)
    return path


@pytest.fixture
def plugin_cdi_dirs(tmp_path: Path) -> tuple[str, str]:
    """The plugin's data directory and the CDI directory, both empty, under ``tmp_path``."""
    plugin_dir, cdi_dir = tmp_path / "plugin", tmp_path / "cdi"
    plugin_dir.mkdir()
    cdi_dir.mkdir()
    return str(plugin_dir), str(cdi_dir)
