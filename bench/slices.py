"""ResourceSlice publication for the 768-CPU node, individual mode (6 slices), against the
loopback API server through the real kubernetes client:

- ``publish_768cpu_ms``: from SliceReconciler start to a converged pool; ``api_calls``: the
  calls that took (one list, one create per slice);
- ``watch_repair_768cpu_ms``: from an external deletion of one slice to the pool repaired,
  noticed through the watch (the periodic resync is off).
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from pathlib import Path

import trio

from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.k8s.client import KubeClient
from dracpu.k8s.slices import SliceReconciler
from dracpu.topology import discover_from_root
from dracpu_sim.apiserver import SimAPIServer

ROOT = Path(__file__).resolve().parent.parent / "tests" / "fake_sysfs" / "epyc-2s-768"
NODE = "bench"
SELECTOR = f"spec.nodeName={NODE},spec.driver=dra.cpu"
RUNS = 5


async def one_run(want: list[dict[str, object]], tmp: Path) -> tuple[float, int, float]:
    server = SimAPIServer(seed=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        kube = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp / "kc")))
        r = SliceReconciler(kube, node_name=NODE, desired=want, resync_interval=math.inf)
        start = time.perf_counter()
        await nursery.start(r.run)
        publish_ms = (time.perf_counter() - start) * 1000
        calls = r.api_calls
        while not server.connections.watches:
            await trio.sleep(0.001)
        victim = server.list("resourceslices", field_selector=SELECTOR)[2]["metadata"]["name"]
        start = time.perf_counter()
        server.delete("resourceslices", victim)
        await r.wait_next_sync()
        repair_ms = (time.perf_counter() - start) * 1000
        assert len(server.list("resourceslices", field_selector=SELECTOR)) == len(want)
        nursery.cancel_scope.cancel()
    kube.close()
    return publish_ms, calls, repair_ms


async def main() -> None:
    topo = discover_from_root(ROOT)
    inv = build_inventory(topo, DeviceSettings(mode="individual"))
    want = build_slices(inv, node_name=NODE, node_uid="uid-bench", expose_pcie_roots=False)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(RUNS):
            results.append(await one_run(want, Path(tmp)))
    print(f"publish_768cpu_ms: {statistics.median(r[0] for r in results):.1f}")
    print(f"slices: {len(want)}")
    print(f"api_calls: {results[-1][1]}")
    print(f"watch_repair_768cpu_ms: {statistics.median(r[2] for r in results):.1f}")


if __name__ == "__main__":
    trio.run(main)
