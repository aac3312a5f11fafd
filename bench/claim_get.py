"""One claim GET as the daemon's prepare makes it: on the event loop (``k8s.loopget``,
h11 over a Trio socket) against the kubernetes client in a worker thread.

The simulated API server runs in a child process (its CPU is not counted) holding one
allocated claim; this process reads it with ``read_claim`` from ``CONCURRENCY`` tasks at
once, as a node drain's prepares do, through one ``KubeClient`` each way. Printed: this
process's CPU (user + system, from /proc) per read for each transport, and reads/s; runs
alternate between the transports and the medians are printed, with the ratio of the
loop's CPU per read over the thread's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CONCURRENCY = 64
READS_PER_TASK = 20
RUNS = 5


def _serve_api(kubeconfig: str) -> None:
    import trio

    from dracpu_sim.apiserver import SimAPIServer, write_kubeconfig

    async def main() -> None:
        server = SimAPIServer(seed=1)
        request = {"name": "cpus", "exactly": {"deviceClassName": "dra.cpu"}}
        created = server.create(
            "resourceclaims",
            {"metadata": {"name": "claim-0"}, "spec": {"devices": {"requests": [request]}}},
            "default",
        )
        result = {"request": "cpus", "driver": "dra.cpu", "pool": "node-a", "device": "d0"}
        server.patch(
            "resourceclaims",
            "claim-0",
            {"status": {"allocation": {"devices": {"results": [result]}}}},
            "default",
            subresource="status",
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            write_kubeconfig(kubeconfig, server.url)
            print(json.dumps(created["metadata"]["uid"]), flush=True)
            await trio.sleep_forever()

    trio.run(main)


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _measure(kubeconfig: str, uid: str, loop_get: bool) -> tuple[float, float]:
    """(CPU microseconds per read, reads per second) for one transport."""
    import trio

    from dracpu.k8s.claims import read_claim
    from dracpu.k8s.client import KubeClient

    kube = KubeClient.from_kubeconfig(kubeconfig, loop_get=loop_get)

    async def reader() -> None:
        for _ in range(READS_PER_TASK):
            await read_claim(kube, "default", "claim-0", uid, pool="node-a")

    async def main() -> tuple[float, float]:
        await reader()  # warm up: connections, imports
        cpu0, t0 = _cpu_seconds(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(CONCURRENCY):
                nursery.start_soon(reader)
        reads = CONCURRENCY * READS_PER_TASK
        elapsed = time.perf_counter() - t0
        return (_cpu_seconds() - cpu0) / reads * 1e6, reads / elapsed

    try:
        return trio.run(main)
    finally:
        kube.close()


def main() -> None:
    work = tempfile.mkdtemp(prefix="bench.")
    kubeconfig = os.path.join(work, "kubeconfig")
    api = subprocess.Popen(
        [sys.executable, __file__, "--serve-api", kubeconfig], stdout=subprocess.PIPE, text=True
    )
    try:
        assert api.stdout is not None
        uid = json.loads(api.stdout.readline())
        runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for i in range(RUNS):
            for loop_get in (True, False) if i % 2 == 0 else (False, True):
                runs[loop_get].append(_measure(kubeconfig, uid, loop_get))
    finally:
        api.terminate()
        api.wait()
        for name in os.listdir(work):
            os.unlink(os.path.join(work, name))
        os.rmdir(work)
    loop_cpu = statistics.median(c for c, _ in runs[True])
    thread_cpu = statistics.median(c for c, _ in runs[False])
    print(f"claim_get_loop_cpu_us: {loop_cpu:.0f} us")
    print(f"claim_get_loop_rps_conc64: {statistics.median(r for _, r in runs[True]):.0f} reads/s")
    print(f"claim_get_thread_cpu_us: {thread_cpu:.0f} us")
    print(
        f"claim_get_thread_rps_conc64: {statistics.median(r for _, r in runs[False]):.0f} reads/s"
    )
    ratio = statistics.median(a[0] / b[0] for a, b in zip(runs[True], runs[False], strict=True))
    print(f"claim_get_loop_vs_thread_cpu: {ratio:.2f} x")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-api":
        _serve_api(sys.argv[2])
    elif len(sys.argv) == 1:
        main()
    else:
        raise SystemExit(f"usage: {sys.argv[0]}")
