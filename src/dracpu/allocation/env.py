"""Moved: the ``DRA_CPUSET_<uid>`` env entries are ``dracpu.cdi.env`` (they are what the
claim's CDI spec injects), ``parse_cpuset`` is ``dracpu.cpuset``. The names stay importable
from here for the importers outside this package's owners' reach (the simulator's chaos
invariants, the fuzz harness) until they import from the new homes.
"""

from __future__ import annotations

from dracpu.cdi.env import DRA_ENV_KEY_PREFIX, DRA_ENV_PREFIX, DRAEnvError, parse_dra_env
from dracpu.cpuset import parse_cpuset

__all__ = [
    "DRA_ENV_KEY_PREFIX",
    "DRA_ENV_PREFIX",
    "DRAEnvError",
    "parse_cpuset",
    "parse_dra_env",
]
