"""``python -m dracpu.sim.fleet --nodes N --mode grouped --duration S`` (see :mod:`.cli`)."""

from __future__ import annotations

import sys

from dracpu.sim.fleet.cli import main

if __name__ == "__main__":
    sys.exit(main())
