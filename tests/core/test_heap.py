"""heap.settle(), run in a child interpreter so the test process's own collector is untouched."""

from __future__ import annotations

import json
import subprocess
import sys

from dracpu.heap import GEN0_THRESHOLD

CHILD = """
import gc, json
from dracpu import heap
before = (gc.get_freeze_count(), gc.get_threshold())
keep = [object() for _ in range(10)]          # alive at start-up
heap.settle()
after = (gc.get_freeze_count(), gc.get_threshold())
class Node:
    pass
for _ in range(50_000):                        # cyclic garbage made later
    a, b = Node(), Node()
    a.peer, b.peer = b, a
del a, b
gc.collect()
left = sum(isinstance(o, Node) for o in gc.get_objects())
print(json.dumps({"before": before, "after": after, "left": left}))
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
    # Cycles made after settling are still collected.
    assert seen["left"] == 0
