"""Issue 24 on the simulated runtime, the daemon in-process: pod sandboxes stay on the shared
pool (written at most once per pool change, never counted as drift), on cgroup v1 and v2 with
both cgroup drivers; and under the default config a claim for every published CPU never
leaves a shared container or a sandbox on a claimed CPU."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from builders import no_signals
from test_daemon_inprocess import Node, dra_call

import dracpu.cgroupfs.blocking_writer as blocking_writer
from dracpu import cdi
from dracpu.cpuset import CPUSet
from dracpu.daemon.app import Daemon
from dracpu.nursery import Supervisor
from dracpu.proto.dra.v1 import api_pb2 as dra_pb
from dracpu_sim.runtime.simulator import RuntimeSimulator

PODS = 20
FLAVORS = [(1, "cgroupfs"), (1, "systemd"), (2, "cgroupfs"), (2, "systemd")]


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every cgroup file write of the daemon's cgroupfs writers, by path."""
    counted: Counter[str] = Counter()
    real_write = blocking_writer.write_cgroup_file

    def counting_write(path: str, value: str) -> None:
        counted[path] += 1
        real_write(path, value)

    monkeypatch.setattr(blocking_writer, "write_cgroup_file", counting_write)
    return counted


def node_with(short_tmp: str, version: int, driver: str, **config: Any) -> Node:
    node = Node(short_tmp, **config)
    node.runtime = RuntimeSimulator(
        node.path("nri.sock"),
        node.path("cg"),
        node_cpus="0-79",
        cgroup_version=version,
        cgroup_driver=driver,
    )
    return node


async def run_daemon(node: Node, drive: Callable[[Daemon, str], Awaitable[None]]) -> None:
    """Start the daemon, register it as the kubelet would, wait for the runtime's
    Synchronize, run ``drive(daemon, endpoint)`` and stop."""
    async with trio.open_nursery() as nursery:
        await node.start(nursery)
        daemon = node.daemon()
        sup = Supervisor()

        async def steps(s: Supervisor) -> None:
            await daemon.startup(s)
            info = await node.register_until_ready(daemon)
            await drive(daemon, info.endpoint)
            s.request_stop("test done")

        code = await sup.run_until_signal(steps, signal_receiver=no_signals)
        assert code == 0, sup.fatal_error
        nursery.cancel_scope.cancel()


def claim_request(node: Node, name: str, uid: str) -> dra_pb.Claim:
    return dra_pb.Claim(namespace="default", uid=uid, name=name)


async def prepare(endpoint: str, claim: dra_pb.Claim) -> str:
    request = dra_pb.NodePrepareResourcesRequest(claims=[claim])
    reply = await trio.to_thread.run_sync(
        dra_call, endpoint, "NodePrepareResources", request, dra_pb.NodePrepareResourcesResponse
    )
    return str(reply.claims[claim.uid].error)


async def unprepare(endpoint: str, claim: dra_pb.Claim) -> str:
    request = dra_pb.NodeUnprepareResourcesRequest(claims=[claim])
    reply = await trio.to_thread.run_sync(
        dra_call,
        endpoint,
        "NodeUnprepareResources",
        request,
        dra_pb.NodeUnprepareResourcesResponse,
    )
    return str(reply.claims[claim.uid].error)


async def shared_pods(runtime: RuntimeSimulator) -> list[str]:
    """PODS pods, each with one container without a claim; the containers' ids."""
    containers = []
    for i in range(PODS):
        await runtime.create_pod(f"p{i}", f"pod-{i}")
        containers.append(await runtime.create_container(f"p{i}", "app"))
    return containers


async def settled(daemon: Daemon, runtime: RuntimeSimulator, containers: list[str]) -> str:
    """Wait until every shared container and sandbox holds the pool, then a little more
    (whatever the verifier's writes wake in the drift watcher has run); returns the pool."""
    assert daemon.state is not None
    with trio.fail_after(10):
        while True:
            pool = daemon.state.shared_pool.format()
            held = {runtime.cpuset_of(c) for c in containers}
            held |= {runtime.sandbox_cpuset_of(p.uid) for p in runtime.pods}
            if held == {pool}:
                break
            await trio.sleep(0.02)
    await trio.sleep(0.5)
    return pool


@pytest.mark.parametrize(("version", "driver"), FLAVORS)
async def test_sandboxes_written_once_per_pool_change_never_as_drift(
    short_tmp: str, writes: Counter[str], version: int, driver: str
) -> None:
    node = node_with(short_tmp, version, driver)
    runtime = node.runtime
    seen: dict[str, Any] = {}

    async def drive(daemon: Daemon, endpoint: str) -> None:
        containers = await shared_pods(runtime)
        seen["start"] = await settled(daemon, runtime, containers)
        seen["sandbox_writes_at_start"] = sandbox_writes(daemon)
        uid = node.allocated_claim("c1", "cpudevnuma001", 4)
        claim = claim_request(node, "c1", uid)
        for step, call in (("prepare", prepare), ("unprepare", unprepare)):
            writes.clear()
            assert await call(endpoint, claim) == ""
            seen[step] = await settled(daemon, runtime, containers)
            seen[f"{step}_writes"] = dict(writes)
        seen["sandbox_files"] = {
            f"{daemon.writer.directory_of(p.cgroups_path)}/cpuset.cpus"  # type: ignore[union-attr]
            for p in runtime.pods
        }
        seen["drift"] = daemon.registry.get_sample_value(
            "dracpu_cgroup_drift_repairs_total", {"result": "success"}
        )
        seen["sandbox_writes"] = sandbox_writes(daemon)

    await run_daemon(node, drive)
    assert len(CPUSet.parse(seen["prepare"])) == len(CPUSet.parse(seen["start"])) - 4
    assert seen["unprepare"] == seen["start"]
    for step in ("prepare", "unprepare"):
        per_sandbox = {
            path: n for path, n in seen[f"{step}_writes"].items() if path in seen["sandbox_files"]
        }
        # Every sandbox follows the pool, each written exactly once for the change.
        assert sorted(per_sandbox.values()) == [1] * PODS, step
        # No container cgroup is written twice for one change either.
        assert max(seen[f"{step}_writes"].values()) == 1, step
    assert seen["drift"] == 0
    # Counted under their own cause: once per sandbox and change.
    assert seen["sandbox_writes"] - seen["sandbox_writes_at_start"] == 2 * PODS


def sandbox_writes(daemon: Daemon) -> float:
    value = daemon.registry.get_sample_value(
        "dracpu_cgroup_fallback_writes_total", {"result": "success", "cause": "sandbox"}
    )
    return value or 0.0


async def test_a_claim_for_every_published_cpu_leaves_the_kept_core_shared(
    short_tmp: str,
) -> None:
    """Default config (reservedCPUs empty): the core of CPU 0 (CPUs 0 and 40 on this
    machine) is kept shared and unpublished, so claims for every published CPU prepare and
    no shared container or sandbox ever runs on a claimed CPU."""
    node = node_with(short_tmp, 2, "systemd")
    runtime = node.runtime
    seen: dict[str, Any] = {}

    async def drive(daemon: Daemon, endpoint: str) -> None:
        # The claim reader's API module was built at start-up, not by the first prepare.
        seen["api_built"] = daemon.kube._resource is not None
        await runtime.create_pod("p-shared", "shared")
        shared = await runtime.create_container("p-shared", "app")
        claims = [
            claim_request(node, name, node.allocated_claim(name, device, cpus))
            for name, device, cpus in (("all0", "cpudevnuma000", 38), ("all1", "cpudevnuma001", 40))
        ]
        seen["errors"] = [await prepare(endpoint, c) for c in claims]
        seen["pool"] = await settled(daemon, runtime, [shared])
        assert daemon.state is not None
        seen["claimed"] = daemon.state.view.prepared
        seen["shared"] = CPUSet.parse(runtime.cpuset_of(shared))
        seen["sandbox"] = CPUSet.parse(runtime.sandbox_cpuset_of("p-shared"))
        # A new container without a claim still starts, on the kept core.
        await runtime.create_pod("p-late", "late")
        late = await runtime.create_container("p-late", "app")
        seen["late"] = CPUSet.parse(runtime.cpuset_of(late))
        seen["late_sandbox"] = await wait_for_sandbox(runtime, "p-late", seen["pool"])

    await run_daemon(node, drive)
    assert seen["api_built"]
    assert seen["errors"] == ["", ""]
    kept = CPUSet.parse("0,40")
    assert seen["pool"] == kept.format()
    assert len(seen["claimed"]) == 78 and not seen["claimed"] & kept
    for key in ("shared", "sandbox", "late", "late_sandbox"):
        assert seen[key] == kept, key


async def wait_for_sandbox(runtime: RuntimeSimulator, pod_uid: str, pool: str) -> CPUSet:
    with trio.fail_after(5):
        while runtime.sandbox_cpuset_of(pod_uid) != pool:
            await trio.sleep(0.02)
    return CPUSet.parse(runtime.sandbox_cpuset_of(pod_uid))


async def test_a_slow_runtime_applying_the_pool_is_not_overtaken_by_the_watcher(
    short_tmp: str, writes: Counter[str]
) -> None:
    """containerd applies a pool update one `runc update` at a time; the cgroups it has not
    reached yet are not drift: dracpu writes none of them, and the drift watcher (woken by
    the runtime's writes) waits for the pass instead of writing them first."""
    node = node_with(short_tmp, 2, "systemd")
    runtime = node.runtime
    seen: dict[str, Any] = {}

    async def drive(daemon: Daemon, endpoint: str) -> None:
        containers = await shared_pods(runtime)
        # A first change at full speed: after it the watcher watches every container.
        first = claim_request(node, "c0", node.allocated_claim("c0", "cpudevnuma000", 4))
        assert await prepare(endpoint, first) == ""
        await settled(daemon, runtime, containers)
        assert daemon.watcher is not None and daemon.watcher.state().watched_dirs > PODS
        runtime.update_delay = 0.03  # 0.6 s for the 20 containers, well past the settle time
        writes.clear()
        claim = claim_request(node, "c1", node.allocated_claim("c1", "cpudevnuma001", 4))
        assert await prepare(endpoint, claim) == ""
        await settled(daemon, runtime, containers)
        seen["files"] = {
            f"{daemon.writer.directory_of(runtime.container(c).cgroups_path)}/cpuset.cpus"  # type: ignore[union-attr]
            for c in containers
        }
        seen["writes"] = dict(writes)
        seen["drift"] = daemon.registry.get_sample_value(
            "dracpu_cgroup_drift_repairs_total", {"result": "success"}
        )

    await run_daemon(node, drive)
    assert not seen["files"] & set(seen["writes"]), "dracpu wrote what the runtime applied"
    assert seen["drift"] == 0


async def test_the_kept_core_leaves_claims_an_earlier_dracpu_prepared(short_tmp: str) -> None:
    """Upgrading to a dracpu that keeps a core: a claim already prepared on CPU 0's core
    (here from its CDI spec, trusted without a checkpoint) keeps its CPUs, and the next
    free core is kept shared instead."""
    node = node_with(short_tmp, 2, "systemd")
    os.makedirs(node.config.cdiDir, exist_ok=True)
    cdi.write_claim_spec(node.config.cdiDir, "old-claim", CPUSet.parse("0,40"))
    seen: dict[str, Any] = {}

    async def drive(daemon: Daemon, endpoint: str) -> None:
        assert daemon.state is not None
        seen["claims"] = {r.uid: r.cpus.format() for r in daemon.state.view.claims()}
        seen["floor"] = daemon.floor
        seen["pool"] = daemon.state.shared_pool

    await run_daemon(node, drive)
    assert seen["claims"] == {"old-claim": "0,40"}
    assert seen["floor"].kept and seen["floor"].cpus == CPUSet.parse("1,41")
    assert not seen["pool"] & CPUSet.parse("0,40")
