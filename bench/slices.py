"""Time from SliceReconciler start to a converged pool: the 768-CPU node, individual mode
(6 slices), against the loopback API server through the real kubernetes client."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import trio

from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.k8s.client import KubeClient
from dracpu.k8s.slices import SliceReconciler
from dracpu.sim.apiserver import SimAPIServer
from dracpu.topology import discover_from_root

ROOT = Path(__file__).resolve().parent.parent / "tests" / "fake_sysfs" / "epyc-2s-768"


async def main() -> None:
    topo = discover_from_root(ROOT)
    inv = build_inventory(topo, DeviceSettings(mode="individual"))
    want = build_slices(inv, node_name="bench", node_uid="uid-bench", expose_pcie_roots=False)
    server = SimAPIServer(seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            kube = KubeClient.from_kubeconfig(str(server.write_kubeconfig(Path(tmp) / "kc")))
            r = SliceReconciler(kube, node_name="bench", desired=want)
            start = time.perf_counter()
            await nursery.start(r.run)
            elapsed = (time.perf_counter() - start) * 1000
            nursery.cancel_scope.cancel()
            kube.close()
    print(f"publish_768cpu_ms: {elapsed:.1f}")
    print(f"slices: {len(want)}")
    print(f"api_calls: {r.api_calls}")


if __name__ == "__main__":
    trio.run(main)
