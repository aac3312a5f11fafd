"""The fleet run: N nodes against one loopback API server, through one script of phases.

1. **start-up**: every node starts at once (a fresh DaemonSet); done when each has
   published its pool and has a watch open.
2. **idle**: nothing happens for ``max(1.1 x resync interval, 0.3 x duration)``; every
   request the server receives is counted, by verb, per node and hour. Watch renewals are
   rarer than any window this short, so they are added from the ``timeoutSeconds`` the
   open watches asked for (each watch is renewed once per timeout).
3. **topology**: ``topology_changes`` nodes, at random moments of ``0.2 x duration``, lose
   one CPU (reserved, as if offlined); the time from ``set_desired`` to the sync that
   wrote it, per change.
4. **watch drop**: the server drops every watch connection at once.
5. **restart**: the server goes down (connections closed, listener gone), a few slices
   vanish meanwhile (deleted through another replica), its watch history is forgotten (a
   new watch cache), and it comes back after ``restart_downtime``. A node has converged
   when its pool on the server is right again and it watches again.
6. **roll-out**: every node restarts (new process: new client, new reconciler), one after
   the other over ``0.2 x duration``.

``max_rps`` stands for the server's capacity: past it, requests are answered 429 with
``Retry-After`` (as API Priority and Fairness does), all phases long. All times are on
Trio's clock, which the server's request log shares.
"""

from __future__ import annotations

import math
import random
import tempfile
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import trio

from dracpu.cpuset import CPUSet
from dracpu.k8s.slices import SliceDigest, cache_in_sync, content_digest, slice_digest
from dracpu_sim.apiserver import SimAPIServer
from dracpu_sim.apiserver.faults import RequestLog
from dracpu_sim.apiserver.resources import RESOURCE_SLICES
from dracpu_sim.fleet.node import FleetNode
from dracpu_sim.fleet.report import IDLE_VERBS, FleetResult, phase_counts
from dracpu_sim.fleet.shapes import FIXTURES, Shape, SliceFactory, load_shapes

__all__ = ["FleetOptions", "run_fleet"]

MODES = ("grouped", "individual")
# How long a phase may wait for the fleet to settle before it reports what did not.
SETTLE_TIMEOUT = 120.0


@dataclass
class FleetOptions:
    nodes: int = 50
    cpus_per_node: int | None = 768  # None: every machine shape under fixtures
    mode: str = "grouped"
    duration: float = 60.0
    seed: int = 1
    fixtures: Path = FIXTURES
    resync_interval: float = 30.0  # the daemon's default
    reconnect_spread: float | None = None  # None: the reconciler's default
    restart_downtime: float = 5.0
    max_rps: float | None = 300.0  # None: no server-side limit
    topology_changes: int | None = None  # None: min(nodes, max(20, nodes // 10))
    # The simulated server is one Python thread validating every slice: far slower than
    # a real one once hundreds of nodes write 768-device pools at once. The daemon's 30 s
    # client timeout (there to notice dead connections) would then fire on a server that
    # is merely slow, and urllib3 would resend the GET: requests no real fleet makes.
    request_timeout: float = 300.0

    def validate(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"--nodes must be at least 1, got {self.nodes}")
        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not self.duration > 0:
            raise ValueError(f"--duration must be > 0 seconds, got {self.duration}")
        if not self.restart_downtime >= 0:
            raise ValueError(f"--restart-downtime must be >= 0, got {self.restart_downtime}")
        if self.max_rps is not None and not self.max_rps >= 1:
            raise ValueError(f"--max-rps must be at least 1, got {self.max_rps}")

    def reconciler_options(self) -> dict[str, Any]:
        out: dict[str, Any] = {"resync_interval": self.resync_interval}
        if self.reconnect_spread is not None:
            out["reconnect_spread"] = self.reconnect_spread
        return out


@dataclass
class _Member:
    node: FleetNode
    shape: Shape
    uid: str
    digests: list[bytes] = field(default_factory=list)  # content_digest of node.desired

    def want(self, desired: list[dict[str, Any]]) -> None:
        self.digests = [content_digest(d) for d in desired]


class _Pools:
    """The pools on the server, node by node, with each slice's digest computed once
    per version (a 768-device pool is some 280 kB of JSON)."""

    def __init__(self, server: SimAPIServer) -> None:
        self.server = server
        self._digests: dict[tuple[str, str], SliceDigest] = {}

    def by_node(self) -> dict[str, list[SliceDigest]]:
        out: dict[str, list[SliceDigest]] = defaultdict(list)
        seen: dict[tuple[str, str], SliceDigest] = {}
        for obj in self.server.store.objects(RESOURCE_SLICES):
            meta = obj["metadata"]
            key = (meta["name"], meta["resourceVersion"])
            digest = self._digests.get(key) or slice_digest(obj)
            if digest is None:
                continue
            seen[key] = digest
            out[str(obj["spec"].get("nodeName", ""))].append(digest)
        self._digests = seen
        return out

    def in_sync(self, member: _Member, pools: dict[str, list[SliceDigest]]) -> bool:
        return cache_in_sync(
            member.node.desired,
            pools.get(member.node.name, []),
            current_generation=None,
            desired_digests=member.digests,
        )


async def _until(condition: Callable[[], bool], timeout: float, step: float = 0.1) -> bool:
    with trio.move_on_after(timeout):
        while not condition():
            await trio.sleep(step)
        return True
    return False


def _objects(server: SimAPIServer) -> tuple[int, int]:
    count = size = 0
    for obj in server.store.objects(RESOURCE_SLICES):
        count += 1
        size += len(msgspec.json.encode(obj))
    return count, size


class _Fleet:
    def __init__(self, opts: FleetOptions, server: SimAPIServer, log: RequestLog) -> None:
        self.opts = opts
        self.server = server
        self.log = log
        self.rng = random.Random(opts.seed)
        self.factory = SliceFactory(opts.mode)
        self.pools = _Pools(server)
        self.members: list[_Member] = []
        # After a phase converged, how long its stragglers (429 retries) are still
        # counted as its requests.
        self.settle = min(1.0, 0.1 * opts.duration)

    def build(self, shapes: Sequence[Shape], kubeconfig: str) -> None:
        options = self.opts.reconciler_options()
        for index in range(self.opts.nodes):
            shape = self.rng.choice(shapes)
            name = f"node-{index:05d}"
            uid = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
            desired = self.factory.slices(shape, name, uid)
            node = FleetNode(
                name,
                desired,
                kubeconfig=kubeconfig,
                rng=random.Random(self.rng.getrandbits(64)),
                reconciler_options=options,
                request_timeout=self.opts.request_timeout,
            )
            member = _Member(node, shape, uid)
            member.want(node.desired)
            self.members.append(member)

    @property
    def nodes(self) -> list[FleetNode]:
        return [m.node for m in self.members]

    def all_watching(self) -> bool:
        return all(n.watching for n in self.nodes)

    # ---- phases ---------------------------------------------------------------------

    async def start(self, nursery: trio.Nursery, result: FleetResult) -> None:
        begin = trio.current_time()
        for node in self.nodes:
            nursery.start_soon(node.run)
        await _until(lambda: all(n.published.is_set() for n in self.nodes), math.inf)
        await _until(self.all_watching, SETTLE_TIMEOUT)
        result.startup_s = trio.current_time() - begin
        result.startup_requests = len(self.log)
        result.objects_total, result.objects_bytes = _objects(self.server)
        result.slices_per_node = result.objects_total / self.opts.nodes

    async def idle(self, result: FleetResult) -> None:
        window = max(1.1 * self.opts.resync_interval, 0.3 * self.opts.duration)
        resyncs = self._cache_resyncs()
        begin = trio.current_time()
        await trio.sleep(window)
        end = trio.current_time()
        records = self.log.since(begin, end)
        scale = 3600.0 / (self.opts.nodes * (end - begin))
        rates = dict.fromkeys(IDLE_VERBS, 0.0)
        for record in records:
            rates[record.verb] = rates.get(record.verb, 0.0) + scale
        # Renewals: each open watch is asked for again once per timeoutSeconds (the
        # server's own limit applies first), far less often than this window is long.
        sessions = list(self.server.connections.watches)
        cap = self.server.connections.max_watch_seconds
        timeouts = [min(s.start.timeout_seconds or cap, cap) for s in sessions]
        finite = [t for t in timeouts if math.isfinite(t) and t > 0]
        rates["watch"] += sum(3600.0 / t for t in finite) / self.opts.nodes
        result.idle_window_s = end - begin
        result.idle_per_node_hour = rates
        result.idle_resyncs_from_cache = self._cache_resyncs() - resyncs
        result.watches_open = len(sessions)
        result.watch_timeout_mean_s = sum(finite) / len(finite) if finite else math.inf

    def _cache_resyncs(self) -> int:
        return sum(n.reconciler.cache_resyncs for n in self.nodes if n.reconciler is not None)

    async def topology(self, result: FleetResult) -> None:
        count = self.opts.topology_changes
        if count is None:
            count = min(self.opts.nodes, max(20, self.opts.nodes // 10))
        chosen = self.rng.sample(self.members, min(count, len(self.members)))
        window = 0.2 * self.opts.duration
        begin = trio.current_time()

        async def change(member: _Member, delay: float, cpu: int) -> None:
            await trio.sleep(delay)
            desired = self.factory.slices(member.shape, member.node.name, member.uid, CPUSet([cpu]))
            member.want(desired)
            start = trio.current_time()
            reconciler = member.node.set_desired(desired)
            await reconciler.wait_next_sync()
            result.topology_change_s.append(trio.current_time() - start)

        with trio.move_on_after(window + SETTLE_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for member in chosen:
                    cpu = self.rng.choice(sorted(member.shape.topology.cpus))
                    nursery.start_soon(change, member, self.rng.uniform(0, window), cpu)
        await _until(self.all_watching, SETTLE_TIMEOUT)
        pools = self.pools.by_node()
        result.topology_changes = len(chosen)
        result.topology = phase_counts(self.log.since(begin))
        result.topology_changes_unapplied = sum(
            1 for m in chosen if not self.pools.in_sync(m, pools)
        )

    async def watch_drop(self, result: FleetResult) -> None:
        before = {n.name: self._watch_requests(n) for n in self.nodes}
        begin = trio.current_time()
        self.server.end_watches(drop=True)

        def recovered() -> bool:
            return all(n.watching and self._watch_requests(n) > before[n.name] for n in self.nodes)

        await _until(recovered, SETTLE_TIMEOUT)
        result.watch_drop_recovered_s = trio.current_time() - begin
        await trio.sleep(self.settle)
        result.watch_drop = phase_counts(self.log.since(begin))

    @staticmethod
    def _watch_requests(node: FleetNode) -> int:
        return node.reconciler.watch_requests if node.reconciler is not None else 0

    async def restart(self, nursery: trio.Nursery, result: FleetResult) -> None:
        attempts = {n.name: n.attempts for n in self.nodes}
        before = {n.name: self._watch_requests(n) for n in self.nodes}
        begin = trio.current_time()
        self.server.stop(forget_watch_history=False)
        await trio.sleep(0.05)  # the connection tasks see their cancellation
        # Meanwhile, through another replica, some slices are deleted: after the
        # restart these nodes must notice (their relist) and publish them again.
        victims = self.rng.sample(self.members, max(1, self.opts.nodes // 20))
        deleted = 0
        for member in victims:
            names = sorted(
                obj["metadata"]["name"]
                for obj in self.server.store.objects(RESOURCE_SLICES)
                if obj["spec"].get("nodeName") == member.node.name
            )
            if names:
                self.server.delete("resourceslices", self.rng.choice(names))
                deleted += 1
        self.server.store.compact()  # the new watch cache starts at the current version
        await trio.sleep(self.opts.restart_downtime)
        await nursery.start(partial(self.server.serve, port=self.server.port or 0))
        up = trio.current_time()
        waiting = {m.node.name: m for m in self.members}

        def converged() -> bool:
            pools = self.pools.by_node()
            for name, member in list(waiting.items()):
                node = member.node
                if (
                    node.watching
                    and self._watch_requests(node) > before[name]
                    and self.pools.in_sync(member, pools)
                ):
                    del waiting[name]
            return not waiting

        await _until(converged, SETTLE_TIMEOUT, step=0.25)
        result.restart_converged_s = trio.current_time() - up
        result.restart_unconverged_nodes = len(waiting)
        await trio.sleep(self.settle)
        result.restart_downtime_s = up - begin
        result.restart_deleted_slices = deleted
        result.restart = phase_counts(self.log.since(begin))
        result.restart_max_node_attempts = max(n.attempts - attempts[n.name] for n in self.nodes)

    async def rollout(self, result: FleetResult) -> None:
        window = 0.2 * self.opts.duration
        order = list(self.nodes)
        self.rng.shuffle(order)
        incarnation = {n.name: n.incarnation for n in order}
        begin = trio.current_time()
        for index, node in enumerate(order):
            await trio.sleep_until(begin + index * window / len(order))
            node.restart()

        def done(node: FleetNode) -> bool:
            return (
                node.incarnation > incarnation[node.name]
                and node.published.is_set()
                and node.watching
            )

        await _until(lambda: all(done(n) for n in order), SETTLE_TIMEOUT)
        result.rollout_converged_s = trio.current_time() - begin
        result.rollout_unconverged_nodes = sum(1 for n in order if not done(n))
        await trio.sleep(self.settle)
        result.rollout_window_s = window
        result.rollout = phase_counts(self.log.since(begin))


async def run_fleet(opts: FleetOptions) -> FleetResult:
    """Run the whole script once and return what was measured."""
    opts.validate()
    wall = trio.current_time()
    shapes = load_shapes(opts.fixtures, opts.cpus_per_node)
    server = SimAPIServer(
        seed=opts.seed,
        # The real watch cache keeps minutes of events; the start-up alone writes
        # one event per slice, and a watch resuming inside it must not get 410.
        history_limit=max(10_000, 64 * opts.nodes),
        # The real API server grants whatever timeoutSeconds a watch asks for.
        max_watch_seconds=math.inf,
    )
    server.handler.clock = trio.current_time
    log = server.log_requests()
    if opts.max_rps is not None:
        server.faults.limit_rate(opts.max_rps, burst=opts.max_rps)
    fleet = _Fleet(opts, server, log)
    with tempfile.TemporaryDirectory(prefix="dracpu-fleet-") as tmp:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            kubeconfig = str(server.write_kubeconfig(Path(tmp) / "kubeconfig"))
            fleet.build(shapes, kubeconfig)
            result = FleetResult(
                nodes=opts.nodes,
                mode=opts.mode,
                cpus_per_node=opts.cpus_per_node or 0,
                shapes=dict(sorted(Counter(m.shape.name for m in fleet.members).items())),
            )
            async with trio.open_nursery() as nodes:
                await fleet.start(nodes, result)
                await fleet.idle(result)
                await fleet.topology(result)
                await fleet.watch_drop(result)
                await fleet.restart(nursery, result)
                await fleet.rollout(result)
                nodes.cancel_scope.cancel()
            nursery.cancel_scope.cancel()
    result.throttled_total = sum(1 for r in log.records if r.status == 429)
    result.wall_s = trio.current_time() - wall
    return result
