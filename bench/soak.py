"""Soak: many pod lifecycles through the simulated node against the real daemon.

The daemon runs as ``dracpu run`` (a child process) on the 768-CPU fixture in its default
grouped mode; the simulated node's kubelet answers its registration. The lifecycles are
then driven directly, much faster than the simulated scheduler and kubelet would:

- a claim pod: a ResourceClaim allocated on a NUMA device (created in-process on the
  loopback API server), ``NodePrepareResources`` over the daemon's DRA socket with the
  official grpcio client, the CDI env resolved as a runtime would, a pod sandbox with the
  claim's container (and, in every other pod, a sidecar on the shared pool) created through
  the NRI runtime simulator, its cpuset checked, then the containers stopped and removed,
  the pod removed, ``NodeUnprepareResources``, the claim deleted;
- a plain pod (every fourth): a sandbox and a container on the shared pool, stopped and
  removed.

Several lifecycles run at once (``--concurrency``), so claims are always held and every
prepare and unprepare makes the daemon push the new shared pool to the plain containers.

Prints:

- ``rss_growth_mb``: the daemon's RSS at the end minus its RSS after the warm-up (the first
  ``--warmup`` share of the lifecycles); target < 5 MB;
- ``prepare_p99_ms`` / ``create_container_p99_ms`` (and p50s) measured by the client
  during the run: one ``NodePrepareResources`` round trip, one CreateContainer through NRI.
  They include queueing: the daemon handles prepares and unprepares one at a time (each
  writes the CDI spec and fsyncs the checkpoint), and the simulated runtime serializes its
  NRI calls, so with ``--concurrency`` lifecycles in flight a call waits behind the others;
- lifecycles/s, total time, the daemon's threads and open fds before and after, and what
  ``/debug/state`` still holds once everything was removed (claims, containers: both 0).

``--lifecycles N`` for a quick run.
"""

from __future__ import annotations

import os
import sys

# bench/grpc.py shadows the grpcio package that this script and the simulated kubelet import.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import logging  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import grpc  # noqa: E402
import trio  # noqa: E402

from dracpu import cdi  # noqa: E402
from dracpu.proto.dra.v1 import api_pb2 as dra_pb  # noqa: E402
from dracpu_sim.node import SimNode  # noqa: E402

ROOT = str(Path(__file__).resolve().parent.parent / "tests" / "fake_sysfs" / "epyc-2s-768")
DEVICES = ("cpudevnuma000", "cpudevnuma001")
DRA_SERVICE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"


def proc_status(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def rss_mb(pid: int) -> float:
    return int(proc_status(pid)["VmRSS"].split()[0]) / 1024


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


class StaleUpdates(logging.Filter):
    """Counts, instead of printing, the runtime's "update of container ... failed": a pool
    push that crossed the container's removal, which the daemon then hands to its cgroupfs
    fallback (a real runtime answers the same)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("update of container"):
            self.count += 1
            return False
        return True


class DRAClient:
    """The kubelet's side of the DRA socket: one grpcio channel, calls from worker threads."""

    def __init__(self, socket_path: str) -> None:
        self.channel = grpc.insecure_channel("unix:" + socket_path)
        self.prepare = self.channel.unary_unary(
            f"{DRA_SERVICE}/NodePrepareResources",
            request_serializer=dra_pb.NodePrepareResourcesRequest.SerializeToString,
            response_deserializer=dra_pb.NodePrepareResourcesResponse.FromString,
        )
        self.unprepare = self.channel.unary_unary(
            f"{DRA_SERVICE}/NodeUnprepareResources",
            request_serializer=dra_pb.NodeUnprepareResourcesRequest.SerializeToString,
            response_deserializer=dra_pb.NodeUnprepareResourcesResponse.FromString,
        )

    def close(self) -> None:
        self.channel.close()


@dataclass
class Results:
    prepare_ms: list[float] = field(default_factory=list)
    unprepare_ms: list[float] = field(default_factory=list)
    create_ms: list[float] = field(default_factory=list)
    done: int = 0
    claim_pods: int = 0
    plain_pods: int = 0
    errors: list[str] = field(default_factory=list)


class Soak:
    def __init__(self, node: SimNode, dra: DRAClient, total: int, results: Results) -> None:
        self.node = node
        self.dra = dra
        self.total = total
        self.results = results
        self.next_index = 0
        self.warm = trio.Event()
        self.warmup_at = 0

    def _claim(self, i: int) -> tuple[str, str]:
        """Create claim ``s<i>`` allocated on a NUMA device; returns (name, uid)."""
        api = self.node.api
        name = f"s{i}"
        api.create(
            "resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "cpus", "exactly": {"deviceClassName": "dra.cpu"}}]
                    }
                },
            },
        )
        claim = api.get("resourceclaims", name, "default")
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "cpus",
                            "driver": "dra.cpu",
                            "pool": self.node.node_name,
                            "device": DEVICES[i % len(DEVICES)],
                            "consumedCapacity": {"dra.cpu/cpu": str(2 + i % 3)},
                        }
                    ]
                }
            },
            # Reserved for a consumer that is not a pod, so the simulated scheduler, which
            # deallocates claims no pod reserves, leaves these alone.
            "reservedFor": [
                {"apiGroup": "bench.dracpu.dev", "resource": "soaks", "name": name, "uid": name}
            ],
        }
        api.update("resourceclaims", claim, subresource="status")
        return name, str(claim["metadata"]["uid"])

    async def _container(self, pod_uid: str, name: str, env: list[str]) -> str:
        runtime = self.node.runtime
        assert runtime is not None
        t0 = time.perf_counter()
        container_id = await runtime.create_container(pod_uid, name, env)
        self.results.create_ms.append((time.perf_counter() - t0) * 1000)
        return container_id

    async def _call(self, method: Any, request: Any) -> Any:
        return await trio.to_thread.run_sync(lambda: method(request, timeout=30))

    async def claim_pod(self, i: int) -> None:
        runtime = self.node.runtime
        assert runtime is not None
        name, uid = self._claim(i)
        ref = dra_pb.Claim(namespace="default", uid=uid, name=name)
        pod_uid = f"soak-{i}"
        try:
            t0 = time.perf_counter()
            reply = await self._call(
                self.dra.prepare, dra_pb.NodePrepareResourcesRequest(claims=[ref])
            )
            self.results.prepare_ms.append((time.perf_counter() - t0) * 1000)
            result = reply.claims[uid]
            if result.error:
                raise RuntimeError(f"prepare {name}: {result.error}")
            ids = [i for d in result.devices for i in d.cdi_device_ids]
            env = cdi.device_env(self.node.cdi_dir, ids)
            await runtime.create_pod(pod_uid, f"claim-{i}")
            try:
                app = await self._container(pod_uid, "app", env)
                expected = env[0].partition("=")[2]
                if runtime.cpuset_of(app) != expected:
                    raise RuntimeError(
                        f"{name}: container cpuset {runtime.cpuset_of(app)}, claim has {expected}"
                    )
                if i % 2:
                    # A sidecar without the claim runs on the shared pool beside it.
                    await self._container(pod_uid, "sidecar", [])
                await trio.sleep(0)
            finally:
                await runtime.remove_pod(pod_uid)
        finally:
            t0 = time.perf_counter()
            unreply = await self._call(
                self.dra.unprepare, dra_pb.NodeUnprepareResourcesRequest(claims=[ref])
            )
            self.results.unprepare_ms.append((time.perf_counter() - t0) * 1000)
            self.node.api.delete("resourceclaims", name, "default")
        if unreply.claims[uid].error:
            raise RuntimeError(f"unprepare {name}: {unreply.claims[uid].error}")
        self.results.claim_pods += 1

    async def plain_pod(self, i: int) -> None:
        runtime = self.node.runtime
        assert runtime is not None
        pod_uid = f"soak-{i}"
        await runtime.create_pod(pod_uid, f"plain-{i}")
        try:
            await self._container(pod_uid, "app", [])
            # Hold the shared container a little so pool pushes reach live containers.
            await trio.sleep(0.02)
        finally:
            await runtime.remove_pod(pod_uid)
        self.results.plain_pods += 1

    async def worker(self) -> None:
        while self.next_index < self.total:
            i = self.next_index
            self.next_index += 1
            try:
                if i % 4 == 3:
                    await self.plain_pod(i)
                else:
                    await self.claim_pod(i)
            except Exception as exc:  # a failure is counted and reported, the soak goes on
                self.results.errors.append(f"lifecycle {i}: {type(exc).__name__}: {exc}")
            self.results.done += 1
            if self.results.done >= self.warmup_at:
                self.warm.set()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lifecycles", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--warmup", type=float, default=0.1, help="share of lifecycles")
    parser.add_argument("--sample-interval", type=float, default=1.0)
    args = parser.parse_args()

    stale = StaleUpdates()
    logging.getLogger("dracpu_sim.runtime.simulator").addFilter(stale)
    workdir = tempfile.mkdtemp(prefix="dsk", dir="/tmp")
    node = SimNode(workdir=workdir, node_cpus="0-767", node_mems="0-1")
    results = Results()
    samples: list[tuple[int, float]] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        daemon = await node.start_daemon(sysfs_root=ROOT)
        pid = daemon.process.pid
        start_threads = int(proc_status(pid)["Threads"])
        start_fds = open_fds(pid)
        rss_ready = rss_mb(pid)
        dra = DRAClient(os.path.join(node.kubelet_root, "plugins", "dra.cpu", "dra.sock"))
        soak = Soak(node, dra, args.lifecycles, results)
        soak.warmup_at = max(1, int(args.lifecycles * args.warmup))

        async def sample() -> None:
            while True:
                samples.append((results.done, rss_mb(pid)))
                await trio.sleep(args.sample_interval)

        nursery.start_soon(sample)
        t0 = time.perf_counter()
        warm_rss = float("nan")
        async with trio.open_nursery() as workers:
            for _ in range(args.concurrency):
                workers.start_soon(soak.worker)
            await soak.warm.wait()
            warm_rss = rss_mb(pid)
        elapsed = time.perf_counter() - t0
        # Let the last pool push and checkpoint settle before the final reading.
        await trio.sleep(1.5)
        end_rss = rss_mb(pid)
        end_threads = int(proc_status(pid)["Threads"])
        end_fds = open_fds(pid)
        state = await node.debug_state()
        dra.close()
        nursery.cancel_scope.cancel()
    max_rss = max((r for _, r in samples), default=end_rss)
    lifecycles = results.done
    print(f"lifecycles: {lifecycles} ({results.claim_pods} claim pods, {results.plain_pods} plain)")
    print(f"errors: {len(results.errors)}")
    for line in results.errors[:5]:
        print(f"  {line}")
    print(f"total_s: {elapsed:.1f} s")
    print(f"lifecycles_per_s: {lifecycles / elapsed:.1f} /s")
    growth = end_rss - warm_rss
    print(f"rss_growth_mb: {growth:.2f} MB (target < 5; after {soak.warmup_at} warm-up)")
    print(f"rss_ready_mb: {rss_ready:.1f} MB")
    print(f"rss_warm_mb: {warm_rss:.1f} MB")
    print(f"rss_end_mb: {end_rss:.1f} MB")
    print(f"rss_max_mb: {max_rss:.1f} MB")
    print(f"prepare_p50_ms: {percentile(results.prepare_ms, 50):.1f} ms")
    print(f"prepare_p99_ms: {percentile(results.prepare_ms, 99):.1f} ms")
    print(f"unprepare_p99_ms: {percentile(results.unprepare_ms, 99):.1f} ms")
    print(f"create_container_p50_ms: {percentile(results.create_ms, 50):.1f} ms")
    print(f"create_container_p99_ms: {percentile(results.create_ms, 99):.1f} ms")
    if results.create_ms:
        print(f"create_container_mean_ms: {statistics.fmean(results.create_ms):.1f} ms")
    print(f"stale_pool_updates: {stale.count} (pushes that crossed a container's removal)")
    print(f"daemon_threads: {start_threads} -> {end_threads}")
    print(f"daemon_fds: {start_fds} -> {end_fds}")
    print(f"left_claims: {len(state.get('claims', []))}")
    print(f"left_containers: {len(state.get('containers', []))}")
    step = max(1, len(samples) // 10)
    curve = ", ".join(f"{done}:{rss:.1f}" for done, rss in samples[::step])
    print(f"rss_curve (lifecycles:MB): {curve}")
    if results.errors:
        print(f"workdir kept for the daemon's log: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def run(argv: list[str] | None = None) -> Any:
    return trio.run(main)


if __name__ == "__main__":
    run()
