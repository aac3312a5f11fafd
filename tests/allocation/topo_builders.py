"""The topology builders, now in ``tests/builders.py``; kept for ``golden_cases.py``,
which still imports them from here.

``golden_cases.py`` also runs as a script, without ``tests/conftest.py``, so ``tests/`` is
put on ``sys.path`` here."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.append(_TESTS)

from builders import Row, cs, from_rows, grid, grid_rows, quirk_19_1  # noqa: E402

__all__ = ["Row", "cs", "from_rows", "grid", "grid_rows", "quirk_19_1"]
