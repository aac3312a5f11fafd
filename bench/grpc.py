"""NodePrepareResources through the real DRA handler: dracpu's Trio server vs grpclib's.

Both servers run the same ``DRAService`` handler objects (grouped NUMA mode on the 128-CPU
epyc-nps4 fixture, claims served from memory, CDI specs written to a temp dir) in a child
process; a grpcio client in this process calls prepare then unprepare, so the node never
fills up. Latency is measured with one call in flight, as a kubelet preparing one pod at a
time sends them (prepare/unprepare are serialized, so with N in flight a call also waits
for the N-1 before it); throughput with 16 clients in flight. Runs alternate A/B;
latencies are pooled over the runs of a server, calls/s and the ratio are medians
(protocols.md §1.13).

`unprepare_p50_ms_conc64` and `pairs_rps_conc64` measure a node drain: 64 claims prepared
and unprepared at once, 5 pairs each, on dracpu's server with the daemon's whole file work
(specs on tmpfs, the checkpoint fsynced on disk by the checkpoint writer, whose queued
changes share one write). The `grpclib_` lines are the same handlers and file work on
grpclib with the checkpoint written the plain way (each change waits for a write of its
own, one at a time); `pairs_rps_conc64_vs_grpclib` is the median ratio of alternated runs.
The `real_` lines are the drain on the path a node takes: the same daemon file work, and
besides each prepare GETs its claim from a simulated API server (in a child process of its
own, so its CPU is not counted) through the daemon's own claim source and kubernetes
client, and the device metadata files go to a plugin directory on disk, fsynced, as the
kubelet plugin's data dir is on a node, written by the daemon's device metadata writer
process, as `dracpu run` does. `real_cpu_ms_per_pair` is the CPU of the dracpu server and
its writer per prepare+unprepare pair; `real_vs_echo_pairs` the median ratio of its pairs/s over the
echo floor's in alternated runs.
The `echo_` lines are the floor: the same Trio + h2 server with handlers that answer at
once, no planning, no files. With 64 calls in flight and the server's one core busy, a
call's latency is about 64 divided by the calls per second (Little's law): the unprepare
p50 falls only as the CPU per call does, and cannot fall below the echo's.
"""

from __future__ import annotations

import os
import sys

# This file is named like the grpcio package; keep its directory off the import path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

if __name__ == "grpc":
    # A sibling script (bench/*.py has bench/ first on its path) asked for grpcio and found
    # this file: hand the real package over in our place (the import system returns
    # whatever sys.modules holds under the name once this module has run).
    import importlib

    del sys.modules["grpc"]
    sys.modules["grpc"] = importlib.import_module("grpc")

import contextlib  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, TypeVar  # noqa: E402

FIXTURE = Path(_HERE).parent / "tests" / "fake_sysfs" / "epyc-nps4"
IN_FLIGHT = 16
CLAIMS_PER_CLIENT = 8
ROUNDS = 10  # each client prepares and unprepares each of its claims this many times
LATENCY_CYCLES = 300
PAIRS = 4
SERVERS = ("trio", "grpclib")
R = TypeVar("R")
DRAIN_SERVERS = ("durable", "grpclib-durable", "echo", "real")
DRAIN_PREFIXES = ("", "grpclib_", "echo_")  # "real" prints its own lines
DRAIN_RUNS = 3
NODE = "node-a"
SPEC_TMPFS = "/dev/shm"
CONCURRENCY = 64  # claims prepared and unprepared at once (a node drain)
CONC_ROUNDS = 5
# `python bench/grpc.py --real` runs only the echo floor and the real path. With this set
# (e.g. "py-spy record -f raw -o real.txt"), that command is started with `--pid` of the
# real path's server once it listens and stopped with SIGINT after the pairs.
PROFILE_ENV = "DRACPU_BENCH_PROFILE"


def _claims() -> list[Any]:
    from dracpu.allocation.prepare import AllocationResult, ClaimAllocation

    return [
        ClaimAllocation(
            uid=f"6f1c2a3e-0b5d-4c1e-9a57-{i:012d}",
            namespace="default",
            name=f"claim-{i}",
            results=(
                AllocationResult(
                    request="cpus",
                    driver="dra.cpu",
                    pool=NODE,
                    device=f"cpudevnuma{i % 4:03d}",
                    consumed_capacity={"dra.cpu/cpu": "1"},
                ),
            ),
        )
        for i in range(IN_FLIGHT * CLAIMS_PER_CLIENT)
    ]


def _service(
    cdi_dir: str,
    serial: Any = None,
    state: Any = None,
    claims: Any = None,
    plugin_data_dir: str | None = None,
    metadata_process: Any = None,
) -> Any:
    from prometheus_client import CollectorRegistry

    from dracpu.allocation.store import AllocationStore
    from dracpu.cpuset import CPUSet
    from dracpu.devices import DeviceSettings, build_inventory
    from dracpu.kubelet import DRAService, MemoryClaimSource
    from dracpu.metrics import DriverMetrics
    from dracpu.state import NodeState
    from dracpu.topology import discover_from_root

    topo = discover_from_root(FIXTURE)
    return DRAService(
        claims=claims or MemoryClaimSource(_claims()),
        state=state or NodeState(AllocationStore(topo.all_cpus, CPUSet())),
        inventory=build_inventory(topo, DeviceSettings(mode="grouped", group_by="numanode")),
        topology=topo,
        online=topo.online,
        cdi_dir=cdi_dir,
        metrics=DriverMetrics(CollectorRegistry()),
        node_name=NODE,
        serial=serial,
        plugin_data_dir=plugin_data_dir,
        metadata_process=metadata_process,
    )


class _AsyncioSerial:
    """What ``DRAService`` needs from its serializer, on asyncio: dracpu serves on Trio
    only, so the grpclib side of the comparison brings this adapter of its own."""

    def __init__(self) -> None:
        import asyncio

        self._lock = asyncio.Lock()
        self._claims: dict[str, Any] = {}

    def lock(self) -> Any:
        return self._lock

    @contextlib.asynccontextmanager
    async def claim_turn(self, claim_uid: str) -> Any:
        import asyncio

        while (busy := self._claims.get(claim_uid)) is not None:
            await busy.wait()
        done = self._claims[claim_uid] = asyncio.Event()
        try:
            yield
        finally:
            del self._claims[claim_uid]
            done.set()

    async def run_blocking(self, fn: Any, *args: object, inline: bool = False) -> Any:
        import asyncio

        return fn(*args) if inline else await asyncio.to_thread(fn, *args)

    def commit_scope(self) -> Any:
        # asyncio has no shield for a block; the comparison never cancels a call.
        import types

        class _Scope(types.SimpleNamespace):
            def __enter__(self) -> Any:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

        return _Scope(shield=False)


async def _serve_durable(
    path: str, cdi_dir: str, state_dir: str, kubeconfig: str | None = None
) -> None:
    """The daemon's file work: CDI specs on tmpfs and the checkpoint, fsynced, on disk.
    With ``kubeconfig``, the real path: claims read from that API server as the daemon
    reads them, device metadata written to a plugin dir on disk next to the state dir."""
    import trio

    from dracpu.state import CheckpointFile

    if kubeconfig is None:
        service = _service(cdi_dir)
    else:
        from dracpu.k8s.client import KubeClient
        from dracpu.kubelet import ApiClaimSource
        from dracpu.kubelet.metadata_proc import MetadataProcess

        # As cli/run.py and daemon/app.py build them.
        kube = KubeClient.from_kubeconfig(kubeconfig)
        plugin_dir = os.path.join(os.path.dirname(state_dir), "plugin")
        service = _service(
            cdi_dir,
            claims=ApiClaimSource(kube, pool=NODE),
            plugin_data_dir=plugin_dir,
            metadata_process=MetadataProcess(plugin_dir) if plugin_dir else None,
        )
    checkpoint = CheckpointFile(service.state, state_dir, boot_id="b", config_fingerprint="f")
    async with trio.open_nursery() as nursery:
        await nursery.start(checkpoint.run, service.state.claims_changes())
        if service.metadata_process is not None:  # dracpu run's metadata-writer service
            await nursery.start(service.metadata_process.run)
        if service.metadata_purger is not None:
            nursery.start_soon(service.metadata_purger.run)
        await _serve_settled(path, service.grpc_handlers())


def _serve_api(kubeconfig: str, count: int) -> None:
    """The simulated API server holding ``count`` claims allocated on NODE, as
    ``_claims()`` has them; prints their UIDs (the server assigns them) as one JSON line."""
    import json

    import trio

    from dracpu_sim.apiserver import SimAPIServer, write_kubeconfig

    async def main() -> None:
        server = SimAPIServer(seed=1)
        uids = {}
        for c in _claims()[:count]:
            result = c.results[0]
            request = {"name": "cpus", "exactly": {"deviceClassName": "dra.cpu"}}
            created = server.create(
                "resourceclaims",
                {"metadata": {"name": c.name}, "spec": {"devices": {"requests": [request]}}},
                c.namespace,
            )
            allocated = {
                "request": result.request,
                "driver": result.driver,
                "pool": result.pool,
                "device": result.device,
                "consumedCapacity": dict(result.consumed_capacity),
            }
            server.patch(
                "resourceclaims",
                c.name,
                {"status": {"allocation": {"devices": {"results": [allocated]}}}},
                c.namespace,
                subresource="status",
            )
            uids[c.name] = created["metadata"]["uid"]
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            write_kubeconfig(kubeconfig, server.url)
            print(json.dumps(uids), flush=True)
            await trio.sleep_forever()

    trio.run(main)


async def _serve_settled(path: str, handlers: Any) -> None:
    """``serve_unix``, the heap settled once it listens: as `dracpu run` does once it is
    ready. Every server here settles, so the comparisons are like for like."""
    import trio

    from dracpu import heap
    from dracpu.grpc import serve_unix

    async with trio.open_nursery() as nursery:
        await nursery.start(serve_unix, path, handlers)
        heap.settle()


def _serve_durable_grpclib(path: str, cdi_dir: str, state_dir: str) -> None:
    """The same handlers and file work on grpclib, the checkpoint written the plain way:
    each change waits for its own write (one at a time, in a thread)."""
    import asyncio

    from grpclib.server import Server

    from dracpu import heap
    from dracpu.allocation.store import AllocationStore
    from dracpu.cpuset import CPUSet
    from dracpu.state import CheckpointFile, NodeState
    from dracpu.topology import discover_from_root

    class FsyncEachChange(NodeState):
        checkpoint: Any = None
        lock: Any = None

        async def make_durable(self, reason: str) -> None:
            async with self.lock:
                await asyncio.to_thread(self.checkpoint.write)

    async def main() -> None:
        topo = discover_from_root(FIXTURE)
        state = FsyncEachChange(AllocationStore(topo.all_cpus, CPUSet()))
        state.lock = asyncio.Lock()
        state.checkpoint = CheckpointFile(state, state_dir, boot_id="b", config_fingerprint="f")
        server = Server([_GrpclibHandlers(_service(cdi_dir, _AsyncioSerial(), state))])
        await server.start(path=path)
        heap.settle()
        await server.wait_closed()

    asyncio.run(main())


class _GrpclibHandlers:
    """grpclib wants objects with ``__mapping__``; these are the same handlers."""

    def __init__(self, service: Any) -> None:
        self.service = service

    def __mapping__(self) -> Any:
        return self.service.grpc_handlers()


async def _serve_echo(path: str) -> None:
    """The floor of the drain: the same Trio + h2 server, handlers that answer at once."""
    from dracpu.proto.dra.v1 import api_grpc
    from dracpu.proto.dra.v1 import api_pb2 as pb

    class Echo(api_grpc.DRAPluginBase):
        async def NodePrepareResources(self, stream: Any) -> None:
            await stream.recv_message()
            await stream.send_message(pb.NodePrepareResourcesResponse())

        async def NodeUnprepareResources(self, stream: Any) -> None:
            await stream.recv_message()
            await stream.send_message(pb.NodeUnprepareResourcesResponse())

    await _serve_settled(path, Echo().__mapping__())


def _serve(kind: str, path: str, cdi_dir: str) -> None:
    from dracpu import heap

    if kind == "echo":
        import trio

        trio.run(_serve_echo, path)
    elif kind == "grpclib-durable":
        _serve_durable_grpclib(path, cdi_dir, os.path.dirname(path) + "/state")
    elif kind in ("durable", "real"):
        import trio

        work = os.path.dirname(path)
        kubeconfig = work + "/kubeconfig" if kind == "real" else None
        trio.run(_serve_durable, path, cdi_dir, work + "/state", kubeconfig)
    elif kind == "trio":
        import trio

        trio.run(_serve_settled, path, _service(cdi_dir).grpc_handlers())
    else:
        import asyncio

        from grpclib.server import Server

        async def main() -> None:
            server = Server([_GrpclibHandlers(_service(cdi_dir, _AsyncioSerial()))])
            await server.start(path=path)
            heap.settle()
            await server.wait_closed()

        asyncio.run(main())


def _cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and of its live child processes (the real path's device
    metadata writer is one: its CPU is the daemon's too)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(entry) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _stubs(channel: Any) -> tuple[Any, Any]:
    """NodePrepareResources and NodeUnprepareResources on ``channel`` (DRA v1)."""
    from dracpu.proto.dra.v1 import api_pb2 as pb

    service = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"
    prepare = channel.unary_unary(
        service + "NodePrepareResources",
        request_serializer=pb.NodePrepareResourcesRequest.SerializeToString,
        response_deserializer=pb.NodePrepareResourcesResponse.FromString,
    )
    unprepare = channel.unary_unary(
        service + "NodeUnprepareResources",
        request_serializer=pb.NodeUnprepareResourcesRequest.SerializeToString,
        response_deserializer=pb.NodeUnprepareResourcesResponse.FromString,
    )
    return prepare, unprepare


def _client(
    channel: Any,
    claims: list[Any],
    latencies: list[float],
    errors: list[str],
    rounds: int = ROUNDS,
) -> None:
    from dracpu.proto.dra.v1 import api_pb2 as pb

    prepare, unprepare = _stubs(channel)
    for _ in range(rounds):
        for c in claims:
            ref = pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name)
            t0 = time.perf_counter()
            reply = prepare(pb.NodePrepareResourcesRequest(claims=[ref]), timeout=30)
            latencies.append(time.perf_counter() - t0)
            if reply.claims[c.uid].error:
                errors.append(reply.claims[c.uid].error)
            unprepare(pb.NodeUnprepareResourcesRequest(claims=[ref]), timeout=30)


def _run_once(kind: str) -> tuple[float, float, list[float]]:
    import grpc

    work = tempfile.mkdtemp(dir="/tmp", prefix="bench.")
    # /var/run/cdi is a tmpfs on real nodes; a disk's fsync would measure the disk.
    cdi_parent = tempfile.mkdtemp(dir=SPEC_TMPFS if os.path.isdir(SPEC_TMPFS) else None)
    path, cdi_dir = work + "/s.sock", cdi_parent + "/cdi"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, path, cdi_dir])
    try:
        while not os.path.exists(path):
            time.sleep(0.01)
        channel = grpc.insecure_channel("unix:" + path)
        grpc.channel_ready_future(channel).result(timeout=10)
        claims = _claims()
        errors: list[str] = []
        _client(channel, claims[:1], [], errors, rounds=20)  # warm up both sides
        latencies: list[float] = []
        _client(channel, claims[:1], latencies, errors, rounds=LATENCY_CYCLES)
        calls: list[float] = []
        threads = [
            threading.Thread(
                target=_client,
                args=(channel, claims[i::IN_FLIGHT], calls, errors),
            )
            for i in range(IN_FLIGHT)
        ]
        cpu0, t0 = _cpu_seconds(proc.pid), time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        cpu = _cpu_seconds(proc.pid) - cpu0
        channel.close()
        if errors:
            raise SystemExit(f"{kind}: prepare failed: {errors[0]}")
        # Server CPU per prepare+unprepare pair.
        return len(calls) / elapsed, cpu / len(calls) * 1e6, latencies
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(cdi_parent, ignore_errors=True)


def _pairs(
    channel: Any, c: Any, unprepares: list[float], done: list[int], errors: list[str]
) -> None:
    from dracpu.proto.dra.v1 import api_pb2 as pb

    prepare, unprepare = _stubs(channel)
    ref = pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name)
    for _ in range(CONC_ROUNDS):
        reply = prepare(pb.NodePrepareResourcesRequest(claims=[ref]), timeout=60)
        if reply.claims[c.uid].error:
            errors.append(reply.claims[c.uid].error)
        t0 = time.perf_counter()
        unprepare(pb.NodeUnprepareResourcesRequest(claims=[ref]), timeout=60)
        unprepares.append(time.perf_counter() - t0)
        done.append(1)


def _run_concurrent(kind: str) -> tuple[float, float, float]:
    """64 claims prepared and unprepared at once, as in a node drain, with the daemon's
    file work (spec on tmpfs, checkpoint fsynced on disk; for "real" also the claim GET
    and the device metadata on disk): unprepare p50, pairs/s and server CPU ms per pair."""
    import json

    import grpc

    work = tempfile.mkdtemp(dir="/tmp", prefix="bench.")
    cdi_parent = tempfile.mkdtemp(dir=SPEC_TMPFS if os.path.isdir(SPEC_TMPFS) else None)
    path, cdi_dir = work + "/s.sock", cdi_parent + "/cdi"
    claims = _claims()[:CONCURRENCY]
    api = None
    proc = None
    profiler = None
    try:
        if kind == "real":
            api = subprocess.Popen(
                [sys.executable, __file__, "--serve-api", work + "/kubeconfig", str(CONCURRENCY)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert api.stdout is not None
            uids = json.loads(api.stdout.readline())
            claims = [c.__class__(**{**_fields(c), "uid": uids[c.name]}) for c in claims]
        proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, path, cdi_dir])
        while not os.path.exists(path):
            time.sleep(0.01)
        if kind == "real" and os.environ.get(PROFILE_ENV):
            profiler = subprocess.Popen(
                [*shlex.split(os.environ[PROFILE_ENV]), "--pid", str(proc.pid)]
            )
        channel = grpc.insecure_channel("unix:" + path)
        grpc.channel_ready_future(channel).result(timeout=10)
        unprepares: list[float] = []
        done: list[int] = []
        errors: list[str] = []
        threads = [
            threading.Thread(target=_pairs, args=(channel, c, unprepares, done, errors))
            for c in claims
        ]
        cpu0, t0 = _cpu_seconds(proc.pid), time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        cpu = _cpu_seconds(proc.pid) - cpu0
        channel.close()
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            profiler.wait()
        if errors:
            raise SystemExit(f"{kind}: prepare failed: {errors[0]}")
        return _quantile(unprepares, 0.50) * 1e3, len(done) / elapsed, cpu / len(done) * 1e3
    finally:
        for child in (proc, api):
            if child is not None:
                child.terminate()
                child.wait()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(cdi_parent, ignore_errors=True)


def _fields(struct: Any) -> dict[str, Any]:
    return {name: getattr(struct, name) for name in struct.__struct_fields__}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _alternated(kinds: tuple[str, ...], rounds: int, run: Callable[[str], R]) -> dict[str, list[R]]:
    """``rounds`` runs of each kind, A B, B A, ... so drift weighs on both alike."""
    results: dict[str, list[R]] = {k: [] for k in kinds}
    for i in range(rounds):
        for kind in kinds if i % 2 == 0 else kinds[::-1]:
            results[kind].append(run(kind))
    return results


def main_real(runs: int = DRAIN_RUNS) -> None:
    """Only the echo floor and the real path, alternated: the lines for work on the real
    path's CPU, in a fraction of the whole run's time. ``--runs N`` (3 by default) takes
    the medians over more alternated runs: the echo floor moves by a fifth from run to
    run, so three cannot show a change of a few percent."""
    drains = _alternated(("echo", "real"), runs, _run_concurrent)
    echo_rps = statistics.median(r for _, r, _ in drains["echo"])
    print(f"echo_pairs_rps_conc64: {echo_rps:.0f} pairs/s")
    _print_real(drains)


def _print_real(drains: dict[str, list[tuple[float, float, float]]]) -> None:
    real_rps = statistics.median(r for _, r, _ in drains["real"])
    real_cpu = statistics.median(c for _, _, c in drains["real"])
    real_ratio = statistics.median(
        r[1] / e[1] for r, e in zip(drains["real"], drains["echo"], strict=True)
    )
    print(f"real_pairs_rps_conc64: {real_rps:.0f} pairs/s")
    print(f"real_cpu_ms_per_pair: {real_cpu:.2f} ms")
    print(f"real_vs_echo_pairs: {real_ratio:.2f} x")


def main() -> None:
    runs = _alternated(SERVERS, PAIRS, _run_once)
    figures = {}
    for kind in SERVERS:
        pooled = [x for _, _, lat in runs[kind] for x in lat]
        figures[kind] = (
            _quantile(pooled, 0.50) * 1e3,
            _quantile(pooled, 0.99) * 1e3,
            statistics.median(r for r, _, _ in runs[kind]),
            statistics.median(c for _, c, _ in runs[kind]),
        )
    ratio = statistics.median(
        t[0] / g[0] for t, g in zip(runs["trio"], runs["grpclib"], strict=True)
    )
    p50, p99, rps, cpu = figures["trio"]
    print(f"prepare_p50_ms: {p50:.2f} ms")
    print(f"prepare_p99_ms: {p99:.2f} ms")
    print(f"prepare_rps: {rps:.0f} calls/s")
    print(f"prepare_server_cpu_per_cycle_us: {cpu:.0f} us")
    print(f"ratio_vs_grpclib: {ratio:.2f} x")
    p50, p99, rps, cpu = figures["grpclib"]
    print(f"grpclib_prepare_p50_ms: {p50:.2f} ms")
    print(f"grpclib_prepare_p99_ms: {p99:.2f} ms")
    print(f"grpclib_prepare_rps: {rps:.0f} calls/s")
    print(f"grpclib_prepare_server_cpu_per_cycle_us: {cpu:.0f} us")
    drains = _alternated(DRAIN_SERVERS, DRAIN_RUNS, _run_concurrent)
    for kind, prefix in zip(DRAIN_SERVERS, DRAIN_PREFIXES, strict=False):
        unprepare_p50 = statistics.median(u for u, _, _ in drains[kind])
        pairs_rps = statistics.median(r for _, r, _ in drains[kind])
        print(f"{prefix}unprepare_p50_ms_conc64: {unprepare_p50:.2f} ms")
        print(f"{prefix}pairs_rps_conc64: {pairs_rps:.0f} pairs/s")
    drain_ratio = statistics.median(
        t[1] / g[1] for t, g in zip(drains["durable"], drains["grpclib-durable"], strict=True)
    )
    print(f"pairs_rps_conc64_vs_grpclib: {drain_ratio:.2f} x")
    _print_real(drains)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        _serve(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 4 and sys.argv[1] == "--serve-api":
        _serve_api(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1:] == ["--real"]:
        main_real()
    elif sys.argv[1:3] == ["--real", "--runs"] and len(sys.argv) == 4:
        if not sys.argv[3].isdigit() or int(sys.argv[3]) < 1:
            raise SystemExit(f"--runs takes a whole number of at least 1, not {sys.argv[3]!r}")
        main_real(int(sys.argv[3]))
    elif len(sys.argv) == 1:
        main()
    else:
        raise SystemExit(f"usage: {sys.argv[0]} [--real [--runs N]]")
