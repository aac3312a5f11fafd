"""NRI: CreateContainer round trips and a 1,000-container shared-pool update.

dracpu's `NRISession` and the `RuntimeSimulator` run in one Trio process and talk over a
real unix socket with the real wire format. `create_container_*` times the simulator's
whole container creation: the CreateContainer call to the plugin, its decision, the reply,
and the cgroup writes of the adjustment. `pool_update_1000_ms` times computing the updates
for 1,000 running shared containers and sending them with UpdateContainers until the
runtime has applied them (1,000 cpuset.cpus writes) and answered; median of 7 runs.

`pool_convergence_1000_ms` is the same pool change with the simulator in containerd-drop
mode (the runtime says yes and applies nothing): from the state owner's SharedPoolChanged
through the pool pusher and the cgroupfs writer's pass to the last of the 1,000 cgroups written by
dracpu itself; median of 5 runs. `pool_convergence_applied_1000_ms` is the same change with
the runtime applying it: from SharedPoolChanged until its UpdateContainers reply, when every
cgroup holds the pool; median of 5 runs alternated with the dropped ones.
`pool_convergence_dropped_vs_applied_1000` is their ratio (target 1.5 at most), and
`writes_per_container_per_change` counts every write of a shared container's cpuset.cpus,
the runtime's and dracpu's (the one writer task, drift watcher running with inotify), over
those 10 changes (target 1.0: no cgroup written twice for one change).
`reconnect_after_socket_ms` is a runtime
restart: from the runtime binding its socket again to the session synchronized; median of
5 restarts.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from owner import NoIOSteps

from dracpu.allocation.prepare import AllocationResult, ClaimAllocation
from dracpu.allocation.store import AllocationStore, ClaimRecord
from dracpu.cgroupfs import blocking_writer
from dracpu.cgroupfs.intent_view import IntentView
from dracpu.cgroupfs.watcher import DriftWatcher
from dracpu.cgroupfs.writer import CgroupWriter
from dracpu.cpuset import CPUSet
from dracpu.devices import DeviceInventory, DeviceSettings, build_inventory
from dracpu.messages import VerifyCpusets
from dracpu.nri.handlers import EVENT_MASK
from dracpu.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN
from dracpu.nri.peer import RUNTIME_SERVICE, MuxPeer
from dracpu.nri.plugin import NRIPlugin
from dracpu.nri.pusher import PoolPusher
from dracpu.nri.session import NRISession
from dracpu.nri.ttrpc import RequestReceived
from dracpu.proto.nri import api_pb2
from dracpu.state import NodeState
from dracpu.topology import discover_from_root
from dracpu_sim.runtime import RuntimeSimulator

WARMUP = 200
CREATES = 1000
ROUNDS = 5
SHARED = 1000
POOL_RUNS = 7
CONVERGE_RUNS = 5
RECONNECT_RUNS = 5
# 64 CPUs (0-63, no SMT), the simulated runtime's node_cpus.
MACHINE = Path(__file__).resolve().parent.parent / "tests" / "fake_sysfs" / "arm-server"


class ExactClaims:
    """A memory-only owner of MACHINE's CPUs planning with one device per CPU, so a claim
    takes exactly the CPUs its devices name; prepared and unprepared through the owner's
    transactions (its steps and stores are private), with no file I/O."""

    def __init__(self) -> None:
        topo = discover_from_root(MACHINE)
        self.inventory: DeviceInventory = build_inventory(topo, DeviceSettings(mode="individual"))
        self.state = NodeState(AllocationStore(topo.all_cpus, CPUSet()))
        self.state.use_topology(topo, self.inventory, topo.online)
        self._steps = NoIOSteps()

    async def prepare(self, uid: str, cpus: CPUSet) -> None:
        names = [n for n, cpu in self.inventory.cpu_of_device.items() if cpu in cpus]
        results = tuple(
            AllocationResult(request="cpus", driver="dra.cpu", pool="bench", device=name)
            for name in names
        )
        claim = ClaimAllocation(uid=uid, namespace="bench", name=uid, results=results)
        outcome = await self.state.prepare(claim, self._steps)
        assert not outcome.error and self.state.view.cpus_of(uid) == cpus, outcome

    async def unprepare(self, uid: str) -> None:
        outcome = await self.state.unprepare("bench", uid, uid, self._steps)
        assert not outcome.error and outcome.released is not None, outcome


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _main(sock_dir: str, cgroup_root: str) -> None:
    cpus = CPUSet.parse("0-63")
    await _create_round_trips(sock_dir, cgroup_root, cpus)
    claims = ExactClaims()
    state = claims.state
    assert state.view.allocatable == cpus
    plugin = NRIPlugin(state)
    socket_path = os.path.join(sock_dir, "nri.sock")
    sim = RuntimeSimulator(socket_path, cgroup_root, node_cpus="0-63")
    session = NRISession(socket_path, plugin)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run)
        await nursery.start(session.run)
        await sim.wait_plugin_ready()
        await sim.create_pod("shared", "shared")
        for i in range(SHARED):
            await sim.create_container("shared", f"s{i}")
        runs: list[float] = []
        for run in range(POOL_RUNS):
            if run % 2 == 0:
                await claims.prepare("B", CPUSet.parse("0-7"))
            else:
                await claims.unprepare("B")
            start = time.perf_counter()
            failed = await session.update_containers(plugin.shared_pool_updates())
            runs.append(time.perf_counter() - start)
            assert not failed, failed
        print(f"pool_update_1000_ms: {statistics.median(runs) * 1000:.3f}")
        converge = await _pool_convergence(nursery, sim, claims, plugin, session, cgroup_root)
        print(f"pool_convergence_1000_ms: {converge['dropped'] * 1000:.3f}")
        print(f"pool_convergence_applied_1000_ms: {converge['applied'] * 1000:.3f}")
        ratio = converge["dropped"] / converge["applied"]
        print(f"pool_convergence_dropped_vs_applied_1000: {ratio:.2f}")
        print(f"writes_per_container_per_change: {converge['writes']:.3f}")
        reconnect = await _reconnect(sim, session)
        print(f"reconnect_after_socket_ms: {reconnect * 1000:.3f}")
        nursery.cancel_scope.cancel()


class _TimedSession:
    """The NRI session as the pool pusher sees it, noting when UpdateContainers returned
    (with the runtime applying, that is when every cgroup holds the new pool)."""

    def __init__(self, session: NRISession) -> None:
        self._session = session
        self.returned = 0.0

    async def update_containers(self, updates: Any) -> list[Any]:
        failed = await self._session.update_containers(updates)
        self.returned = time.perf_counter()
        return failed


class _WriteCounter:
    """dracpu's own cgroupfs writes, by file (the bench patches the writer's file write)."""

    def __init__(self) -> None:
        self.writes: collections.Counter[str] = collections.Counter()
        self._real = blocking_writer.write_cgroup_file

    def __enter__(self) -> _WriteCounter:
        def counting(path: str, value: str) -> None:
            self.writes[path] += 1
            self._real(path, value)

        blocking_writer.write_cgroup_file = counting  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        blocking_writer.write_cgroup_file = self._real  # type: ignore[assignment]


async def _pool_convergence(
    nursery: trio.Nursery,
    sim: RuntimeSimulator,
    claims: ExactClaims,
    plugin: NRIPlugin,
    session: NRISession,
    cgroup_root: str,
) -> dict[str, float]:
    """One pool change at a time, alternately applied by the runtime and dropped by it
    (containerd-drop: it says yes and writes nothing), with the cgroupfs writer, the pusher and
    the drift watcher (inotify on) running as in the daemon. Returns the median time until
    every cgroup holds the new pool per mode, and the writes per container and change of
    every writer (the runtime's and dracpu's)."""
    state = claims.state
    writer = _SignallingWriter(cgroup_root)
    timed = _TimedSession(session)
    watcher = DriftWatcher(writer, state.view, interval=10.0)
    pusher = PoolPusher(
        state.pool_changes(),
        plugin,
        timed,  # type: ignore[arg-type]
        verify=writer.inbox(),
        writer=writer,
        watcher=watcher,
    )
    await nursery.start(writer.run, state.view)
    await nursery.start(pusher.run)
    await nursery.start(watcher.run)
    shared = [c for c in sim.containers if c.pod_uid == "shared"]
    leaf_files = {f"{writer.directory_of(c.cgroups_path)}/cpuset.cpus" for c in shared}
    runs: dict[str, list[float]] = {"apply": [], "containerd-drop": []}
    changes = 0
    runtime_writes = 0
    with _WriteCounter() as counter:
        for run in range(2 * CONVERGE_RUNS):
            # Prepare and unprepare alternate; each mode sees both (apply, drop, drop,
            # apply, ...), so neither times only the pool growing or only it shrinking.
            mode = "apply" if run % 4 in (0, 3) else "containerd-drop"
            sim.set_update_mode(mode)
            before = sum(sim.tree.write_count(c.cgroups_path) for c in shared)
            if run % 2 == 0:
                await claims.prepare(f"C{run}", CPUSet.parse("8-15"))
            else:
                await claims.unprepare(f"C{run - 1}")
            want = state.shared_pool.format()
            start = time.perf_counter()
            # Woken by the writer's pass itself: a polling loop here would take the GIL
            # from the writer's worker thread a thousand times a second.
            await writer.wait_pass()
            held = timed.returned if mode == "apply" else time.perf_counter()
            runs[mode].append(held - start)
            assert all(sim.cpuset_of(c.id) == want for c in shared), "a cgroup did not converge"
            # Let whatever the writes woke in the drift watcher run before counting.
            await trio.sleep(0.3)
            runtime_writes += sum(sim.tree.write_count(c.cgroups_path) for c in shared) - before
            changes += 1
        dracpu_writes = sum(n for path, n in counter.writes.items() if path in leaf_files)
    sim.set_update_mode("apply")
    applied = statistics.median(runs["apply"])
    dropped = statistics.median(runs["containerd-drop"])
    return {
        "applied": applied,
        "dropped": dropped,
        "writes": (runtime_writes + dracpu_writes) / (len(shared) * changes),
    }


async def _create_round_trips(sock_dir: str, cgroup_root: str, cpus: CPUSet) -> None:
    """CreateContainer as the runtime sees it: the simulated runtime runs in a child process
    (as a real one does) and times each call, first against the echo plugin (the floor: the
    same socket, mux and ttrpc code, no decision), then against dracpu's session."""
    socket_path = os.path.join(sock_dir, "create.sock")
    tree = os.path.join(cgroup_root, "create")
    child = await trio.lowlevel.open_process(
        [sys.executable, __file__, "--runtime", socket_path, tree], stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    lines = _Lines(child.stdout)
    try:
        await lines.next()  # the runtime's socket is bound
        state = NodeState(AllocationStore(cpus, CPUSet()))
        state.restore([ClaimRecord(uid="A", cpus=CPUSet.parse("0-3"))])  # as after a restart
        plugin = NRIPlugin(state)
        echo: list[list[float]] = []
        dracpu: list[list[float]] = []
        # Rounds alternate (echo, dracpu, echo, ...) so a machine that gets busier or
        # quieter meanwhile weighs on both alike.
        for _ in range(ROUNDS):
            for serve, samples in (
                (functools.partial(_echo_plugin, socket_path), echo),
                (NRISession(socket_path, plugin).run, dracpu),
            ):
                async with trio.open_nursery() as nursery:
                    await nursery.start(serve)
                    samples.append(json.loads(await lines.next()))
                    nursery.cancel_scope.cancel()
    finally:
        child.kill()
        await child.wait()
    # The ratio is the median of each round's ratio to the echo round just before it.
    ratio = statistics.median(
        _percentile(d, 0.50) / _percentile(e, 0.50) for e, d in zip(echo, dracpu, strict=True)
    )
    p50 = _percentile([t for r in dracpu for t in r], 0.50)
    floor = _percentile([t for r in echo for t in r], 0.50)
    print(f"create_container_p50_us: {p50 * 1e6:.1f}")
    print(f"create_container_p99_us: {_percentile([t for r in dracpu for t in r], 0.99) * 1e6:.1f}")
    print(f"create_container_echo_p50_us: {floor * 1e6:.1f}")
    print(f"create_container_vs_echo: {ratio:.2f}")


class _Lines:
    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def next(self) -> str:
        while b"\n" not in self._buffer:
            data = await self._stream.receive_some(65536)
            if not data:
                raise RuntimeError("the runtime child ended early")
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()


async def _runtime_child(socket_path: str, cgroup_root: str) -> None:
    """The child: a simulated runtime timing CreateContainer; one JSON line per round."""
    sim = _TimedRuntime(socket_path, cgroup_root, node_cpus="0-63")
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run)
        await sim.create_pod("bench", "bench")
        print("ready", flush=True)
        for _ in range(2 * ROUNDS):  # a plugin per round: echo and dracpu in turn
            await sim.wait_plugin_ready()
            print(json.dumps(await _creates(sim)), flush=True)
            await sim.wait_plugin_gone()
        await trio.sleep_forever()


async def _creates(sim: _TimedRuntime) -> list[float]:
    """Create and remove containers, half of them claim holders; the CreateContainer round
    trips (runtime's request out -> plugin's reply decoded), warm-up left out."""
    sim.create_calls.clear()
    for i in range(WARMUP + CREATES):
        env = ["DRA_CPUSET_A=0-3"] if i % 2 else []
        cid = await sim.create_container("bench", f"c{i % 2}", env)
        await sim.remove_container(cid)
    return sim.create_calls[WARMUP:]


class _TimedRuntime(RuntimeSimulator):
    """The simulator, timing each CreateContainer call to the plugin."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.create_calls: list[float] = []

    async def _call(self, plugin: Any, method: str, request: Any, reply_type: Any) -> Any:
        if method != "CreateContainer":
            return await super()._call(plugin, method, request, reply_type)
        start = time.perf_counter()
        reply = await super()._call(plugin, method, request, reply_type)
        self.create_calls.append(time.perf_counter() - start)
        return reply


async def _echo_plugin(
    socket_path: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """The floor: registers, subscribes to what dracpu does, answers everything empty."""
    stream = await trio.open_unix_socket(socket_path)
    configured = api_pb2.ConfigureResponse(events=EVENT_MASK).SerializeToString()

    async def answer(request: RequestReceived) -> None:
        await peer.respond(request.stream_id, configured if request.method == "Configure" else b"")

    peer = MuxPeer(
        stream, serve_conn=PLUGIN_SERVICE_CONN, call_conn=RUNTIME_SERVICE_CONN, on_request=answer
    )
    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(peer.run)
        register = api_pb2.RegisterPluginRequest(plugin_name="echo", plugin_idx="00")
        await peer.call(RUNTIME_SERVICE, "RegisterPlugin", register.SerializeToString(), timeout=5)
        task_status.started()
        await trio.sleep_forever()


class _SignallingWriter(CgroupWriter):
    """The cgroupfs writer, telling the bench when each pass is over."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._passed = trio.Event()

    async def verify(self, message: VerifyCpusets, view: IntentView) -> list[str]:
        written = await super().verify(message, view)
        self._passed.set()
        return written

    async def wait_pass(self) -> None:
        await self._passed.wait()
        self._passed = trio.Event()


async def _reconnect(sim: RuntimeSimulator, session: NRISession) -> float:
    runs: list[float] = []
    for _ in range(RECONNECT_RUNS):
        await sim.restart(downtime=0.05)  # returns once the socket is bound again
        start = time.perf_counter()
        await sim.wait_plugin_ready()
        await session.wait_synchronized()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    # The restarts log a warning each; the figures are the output.
    logging.basicConfig(level=logging.ERROR)
    if len(sys.argv) == 4 and sys.argv[1] == "--runtime":
        trio.run(_runtime_child, sys.argv[2], sys.argv[3])
        return
    sock_dir = tempfile.mkdtemp(dir="/tmp", prefix="nri-bench-")
    # cgroupfs lives in memory: keep the simulated tree on tmpfs when there is one.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    cgroup_root = tempfile.mkdtemp(prefix="nri-bench-cg-", dir=shm)
    try:
        trio.run(_main, sock_dir, cgroup_root)
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
        shutil.rmtree(cgroup_root, ignore_errors=True)


if __name__ == "__main__":
    main()
