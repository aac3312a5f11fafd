"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

FAKE_SYSFS = Path(__file__).parent / "fake_sysfs"


@pytest.fixture
def fake_sysfs() -> Path:
    """Root of the checked-in sysfs trees of real machine shapes."""
    return FAKE_SYSFS
