"""heap.settle(), run in a child interpreter so the test process's own collector is untouched."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import trio
import trio.testing

from dracpu.heap import GEN0_THRESHOLD, settle_when_ready

CHILD = """
import gc, json
from dracpu import heap
before = (gc.get_freeze_count(), gc.get_threshold())
keep = [object() for _ in range(10)]          # alive at start-up
heap.settle()
after = (gc.get_freeze_count(), gc.get_threshold())
class Node:
    pass
collections = []
gc.callbacks.append(lambda phase, info: phase == "stop" and collections.append(info))
for _ in range(50_000):                        # cyclic garbage made later
    a, b = Node(), Node()
    a.peer, b.peer = b, a
del a, b
automatic = sum(info["collected"] for info in collections)
waiting = sum(isinstance(o, Node) for o in gc.get_objects())
gc.collect()
left = sum(isinstance(o, Node) for o in gc.get_objects())
print(json.dumps({"before": before, "after": after, "automatic": automatic,
                  "runs": len(collections), "waiting": waiting, "left": left}))
"""


def test_settle_freezes_what_is_alive_and_raises_the_young_threshold() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    seen = json.loads(out.stdout)
    frozen_before, threshold_before = seen["before"]
    frozen_after, threshold_after = seen["after"]
    assert frozen_before == 0 and frozen_after > 1000
    assert threshold_after == [GEN0_THRESHOLD, threshold_before[1], threshold_before[2]]
    # Cycles made after settling are collected without being asked, in fewer, bigger
    # batches: 100,000 objects pass the young threshold ~10 times, not ~140.
    assert seen["automatic"] > 80_000
    assert 5 <= seen["runs"] <= 25
    assert seen["waiting"] <= 2 * GEN0_THRESHOLD
    assert seen["left"] == 0


async def test_settle_waits_for_readiness(autojump_clock: trio.testing.MockClock) -> None:
    checks: list[float] = []
    settled: list[float] = []

    def ready() -> bool:
        checks.append(trio.current_time())
        return len(checks) >= 4

    await settle_when_ready(ready, settle=lambda: settled.append(trio.current_time()))
    assert len(checks) == 4 and settled == [checks[-1]]


async def test_settle_happens_anyway_when_never_ready(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settled: list[float] = []
    start = trio.current_time()
    await settle_when_ready(
        lambda: False, settle=lambda: settled.append(trio.current_time()), wait=7
    )
    assert settled == [start + 7]


async def test_a_failing_readiness_check_settles_and_does_not_raise(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # It runs as a Trio system task: an exception there would end the daemon.
    settled: list[bool] = []

    def ready() -> bool:
        raise RuntimeError("state not built")

    await settle_when_ready(ready, settle=lambda: settled.append(True))
    assert settled == [True]
    assert "readiness check failed; settling the heap now" in caplog.text
    assert any("state not built" in str(vars(r)) for r in caplog.records)  # the err value
