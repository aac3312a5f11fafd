"""The claims' status.devices writer against the loopback API server, through the real
kubernetes client (dracpu.k8s.claim_status):

- ``event_us``: what a committed prepare pays for the writer, per claim: the state owner
  builds its ``ClaimPrepared`` (``dracpu.state.events.claim_prepared``, only when someone
  subscribed) and puts it in the writer's inbox without waiting;
- ``apply_<n>_claims_ms``: from the first of n prepared claims sent to the last one's
  entries applied (one server-side apply per claim, one at a time);
- ``remove_<n>_claims_ms``: the same for the n unprepares;
- ``apply_per_claim_ms``: the former divided by n.
"""

from __future__ import annotations

import math
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from dracpu.allocation.prepare import AllocationResult, ClaimAllocation
from dracpu.allocation.store import ClaimRecord, PreparedDevice
from dracpu.cpuset import CPUSet
from dracpu.k8s.claim_status import ClaimStatusWriter
from dracpu.k8s.client import KubeClient
from dracpu.messages import ClaimEvent, ClaimUnprepared
from dracpu.state.events import claim_prepared
from dracpu_sim.apiserver import SimAPIServer
from dracpu_sim.apiserver.resources import RESOURCE_CLAIMS

CLAIMS = 200
RUNS = 3
NODE = "bench"


def _claim(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"c{i}", "namespace": "default"},
        "spec": {
            "devices": {"requests": [{"name": "cpus", "exactly": {"deviceClassName": "dra.cpu"}}]}
        },
    }


def _allocate(server: SimAPIServer, i: int) -> str:
    store = server.store
    claim = store.get(RESOURCE_CLAIMS, "default", f"c{i}")
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "cpus",
                        "driver": "dra.cpu",
                        "pool": NODE,
                        "device": f"cpudev{i:03d}",
                    }
                ]
            }
        }
    }
    store.update(RESOURCE_CLAIMS, "default", f"c{i}", claim, subresource="status")
    return str(claim["metadata"]["uid"])


async def one_run(tmp: Path) -> tuple[float, float, float]:
    server = SimAPIServer(seed=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        for i in range(CLAIMS):
            server.create("resourceclaims", _claim(i))
        uids = [_allocate(server, i) for i in range(CLAIMS)]
        kube = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp / "kc")))
        done: list[str] = []
        writer = ClaimStatusWriter(
            kube,
            node_name=NODE,
            topology=lambda: None,
            count=lambda operation, result: done.append(result),
            rand=random.Random(1).random,
        )
        owner, events = trio.open_memory_channel[ClaimEvent](math.inf)
        await nursery.start(writer.run, events)
        # What the owner holds at the commit: the claim as the prepare read it, the record.
        held = [
            (
                ClaimAllocation(
                    uid=uid,
                    namespace="default",
                    name=f"c{i}",
                    results=(
                        AllocationResult(
                            request="cpus", driver="dra.cpu", pool=NODE, device=f"cpudev{i:03d}"
                        ),
                    ),
                ),
                ClaimRecord(
                    uid=uid,
                    cpus=CPUSet([i]),
                    namespace="default",
                    name=f"c{i}",
                    devices=(PreparedDevice(pool_name=NODE, device_name=f"cpudev{i:03d}"),),
                ),
            )
            for i, uid in enumerate(uids)
        ]
        start = time.perf_counter()
        for claim, record in held:
            owner.send_nowait(claim_prepared(record, claim))
        event_us = (time.perf_counter() - start) / CLAIMS * 1e6
        while len(done) < CLAIMS:
            await trio.sleep(0.001)
        apply_ms = (time.perf_counter() - start) * 1000
        assert set(done) == {"success"}, done
        start = time.perf_counter()
        for i, uid in enumerate(uids):
            owner.send_nowait(
                ClaimUnprepared(uid=uid, namespace="default", name=f"c{i}", cpus=str(i))
            )
        while len(done) < 2 * CLAIMS:
            await trio.sleep(0.001)
        remove_ms = (time.perf_counter() - start) * 1000
        kube.close()
        nursery.cancel_scope.cancel()
    return event_us, apply_ms, remove_ms


async def main() -> None:
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(RUNS):
            runs.append(await one_run(Path(tmp)))
    event_us = statistics.median(r[0] for r in runs)
    apply_ms = statistics.median(r[1] for r in runs)
    remove_ms = statistics.median(r[2] for r in runs)
    print(f"event_us: {event_us:.1f} us")
    print(f"apply_{CLAIMS}_claims_ms: {apply_ms:.0f} ms")
    print(f"remove_{CLAIMS}_claims_ms: {remove_ms:.0f} ms")
    print(f"apply_per_claim_ms: {apply_ms / CLAIMS:.2f} ms")


if __name__ == "__main__":
    trio.run(main)
