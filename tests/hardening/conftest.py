"""The hardening tests reuse the kubelet tests' node harness and the deploy renderer."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
for helper_dir in (TESTS / "kubelet", TESTS / "deploy"):
    if str(helper_dir) not in sys.path:
        sys.path.append(str(helper_dir))
