"""Fixtures of the deploy tests."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from deploy_render import DEPLOY, kustomize

_CACHE: dict[Path, list[dict[str, Any]]] = {}


@pytest.fixture
def render() -> Callable[[str], list[dict[str, Any]]]:
    """Render `base` or an overlay name; each is built once per session, and every
    caller gets its own copy to inspect or change."""

    def _render(name: str) -> list[dict[str, Any]]:
        path = DEPLOY / "base" if name == "base" else DEPLOY / "overlays" / name
        if path not in _CACHE:
            _CACHE[path] = kustomize(path)
        return copy.deepcopy(_CACHE[path])

    return _render
