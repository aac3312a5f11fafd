"""Concurrent prepares and unprepares share checkpoint writes (issue #18: a node drain's
unprepares no longer queue one fsync each), and still never hand out a CPU twice."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import trio
from builders import claim, result
from kubelet_harness import make_node

from dracpu.atomicfile import atomic_write
from dracpu.cpuset import CPUSet
from dracpu.kubelet import ClaimRef

CALLS = 16


async def test_concurrent_calls_share_checkpoint_writes(
    nursery: trio.Nursery, cdi_dir: str
) -> None:
    node = make_node(cdi_dir)
    writes: list[int] = []
    lock = threading.Lock()

    def slow_write(path: str, data: bytes, **kw: Any) -> None:
        time.sleep(0.05)  # an fsync on a busy disk
        with lock:
            writes.append(len(data))
        atomic_write(path, data, **kw)

    await node.start_checkpoint(nursery, os.path.join(cdi_dir, "state"), slow_write)
    refs = []
    for i in range(CALLS):
        uid = f"g{i:02d}"
        node.claims.put(claim(uid, result(f"cpudevnuma{i % 4:03d}", 2), name=f"c{i}"))
        refs.append(ClaimRef(namespace="default", name=f"c{i}", uid=uid))
    errors: list[str] = []

    async def prepare(ref: ClaimRef) -> None:
        errors.append((await node.service.prepare([ref]))[ref.uid].error)

    async with trio.open_nursery() as calls:
        for ref in refs:
            calls.start_soon(prepare, ref)
    assert errors == [""] * CALLS
    prepared = writes[:]
    held = [node.view.cpus_of(ref.uid) for ref in refs]
    union = CPUSet()
    for cpus in held:
        assert cpus is not None and len(cpus) == 2 and union.isdisjoint(cpus)
        union |= cpus
    # One write per call would be 16; calls waiting together share one.
    assert 1 <= len(prepared) <= CALLS // 2

    async def unprepare(ref: ClaimRef) -> None:
        errors.append((await node.service.unprepare([ref]))[ref.uid].error)

    errors.clear()
    async with trio.open_nursery() as calls:
        for ref in refs:
            calls.start_soon(unprepare, ref)
    assert errors == [""] * CALLS
    assert len(node.view.claims()) == 0
    assert 1 <= len(writes) - len(prepared) <= CALLS // 2
