"""``python -m dracpu_sim.fleet --nodes N --mode grouped --duration S`` (see :mod:`.cli`)."""

from __future__ import annotations

import sys

from dracpu_sim.fleet.cli import main

if __name__ == "__main__":
    sys.exit(main())
