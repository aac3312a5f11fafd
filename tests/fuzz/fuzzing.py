"""Shared knobs of the fuzz tests: example counts and a hard bound on each example.

``FUZZ_EXAMPLES`` raises every target's example count for a long run
(``FUZZ_EXAMPLES=20000 pytest tests/fuzz``); CI uses the modest defaults. Each example runs
under ``bounded()``, a SIGALRM watchdog: a hang becomes a test failure, not a stuck CI job.
Hypothesis' own deadline is off, since timing on a loaded machine is noise.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from hypothesis import HealthCheck, settings

EXAMPLE_TIME_LIMIT = 10.0  # seconds; every example takes milliseconds


def fuzz_settings(default: int) -> settings:
    """``default`` examples, or ``FUZZ_EXAMPLES`` when set."""
    raw = os.environ.get("FUZZ_EXAMPLES", "")
    count = int(raw) if raw.strip() else default
    return settings(
        max_examples=count,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


class ExampleHung(Exception):
    """One example ran past ``EXAMPLE_TIME_LIMIT``."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise ExampleHung(f"fuzz example ran longer than {EXAMPLE_TIME_LIMIT} s")


@contextmanager
def bounded(limit: float = EXAMPLE_TIME_LIMIT) -> Iterator[None]:
    """Fail the example with ``ExampleHung`` if its body runs longer than ``limit``."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
