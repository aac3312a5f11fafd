"""Fixtures of the kubelet tests (the node harness is ``kubelet_harness.py``)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def cdi_dir(short_tmp: str) -> str:
    """The CDI spec directory of the test's node: ``cdi/`` in its short temp dir."""
    path = os.path.join(short_tmp, "cdi")
    os.mkdir(path)
    return path
