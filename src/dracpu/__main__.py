"""`python -m dracpu` runs the command line."""

import sys

from dracpu.cli import main

sys.exit(main())
