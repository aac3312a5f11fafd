"""``python -m dracpu_sim.chaos --seed N --duration S`` (see :mod:`dracpu_sim.chaos.cli`)."""

from __future__ import annotations

import os
import sys

from dracpu_sim.chaos.cli import main

if __name__ == "__main__":
    # The daemon child processes inherit it: their logs reach the file as they are written.
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
