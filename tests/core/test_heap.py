"""heap.settle(), run in a child interpreter so the test process's own collector is untouched."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial

import trio
import trio.testing

from dracpu.heap import GEN0_THRESHOLD, settle_when_ready
from dracpu.nursery import Readiness, Service, Supervisor

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


async def test_settle_wakes_when_the_last_component_reports_ready(
    autojump_clock: trio.testing.MockClock,
) -> None:
    readiness = Readiness()
    flags = [readiness.declare(name) for name in ("kubelet-registration", "nri", "slices")]
    settled: list[float] = []

    async def report() -> None:
        for at, flag in zip((1.0, 2.5, 4.25), flags, strict=True):
            await trio.sleep_until(at)
            flag.set_ready()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(report)
        await settle_when_ready(
            readiness.view(), settle=lambda: settled.append(trio.current_time())
        )
    # The moment of the last report, not the next tick of a poll.
    assert settled == [4.25]


async def test_settle_happens_anyway_when_never_ready(
    autojump_clock: trio.testing.MockClock,
) -> None:
    readiness = Readiness()
    readiness.declare("nri")
    settled: list[float] = []
    start = trio.current_time()
    await settle_when_ready(
        readiness.view(), settle=lambda: settled.append(trio.current_time()), wait=7
    )
    assert settled == [start + 7]


async def test_settling_is_a_one_shot_service_of_the_supervisor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = Supervisor()
    nri = sup.readiness.declare("nri")
    settled: list[float] = []
    settle = partial(
        settle_when_ready,
        sup.readiness.view(),
        settle=lambda: settled.append(trio.current_time()),
    )
    async with sup.open():
        # Started at once: nothing on the path to readiness waits for it.
        await sup.start(Service(name="heap", run=settle, restart=False))
        assert trio.current_time() == 0 and sup.status()["heap"].state == "running"
        await trio.sleep(3)
        nri.set_ready()
        await trio.testing.wait_all_tasks_blocked()
        assert settled == [3.0]
        assert sup.status()["heap"].state == "stopped"
