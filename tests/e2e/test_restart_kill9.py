"""Crash safety: `dracpu run` killed with SIGKILL at each step of a claim's life.

The real daemon runs as a child process on the simulated node. It is killed after the claim
was allocated but before its pod ran, while the pod runs, right after the pod was deleted
(unprepare pending), and after the unprepare; it is started again each time. After every
restart the node must hold exactly the right claims: no CPU in two claims, no CPU leaked,
every running container's cgroup cpuset equal to what dracpu intends, and the checkpoint,
CDI specs and kubelet in agreement with the daemon's state: the invariants of the chaos runs
(:func:`dracpu_sim.chaos.check_invariants`), read from the node the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from builders import pod, resource_claim

from dracpu.cpuset import CPUSet
from dracpu_sim.chaos import check_invariants, desired_slices, observe_node
from dracpu_sim.node import SimNode

XEON = str(Path(__file__).parents[1] / "fake_sysfs" / "xeon-2s-ht")
ALL = CPUSet.parse("0-79")


async def wait_for(predicate: Any, what: str, timeout: float = 30.0) -> None:
    with trio.move_on_after(timeout):
        while True:
            if await predicate():
                return
            await trio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def running(node: SimNode, ref: str) -> bool:
    st = node.pod_states().get(ref)
    return st is not None and st["phase"] == "Running"


async def checked_claims(node: SimNode) -> dict[str, CPUSet]:
    """The node's claims by UID, after checking every invariant of the chaos runs.

    No CPU in two claims, the shared pool everything else; the checkpoint, the CDI specs
    and the kubelet's prepared claims agree with the daemon; every running container's
    cgroup cpuset (and the daemon's intent for it) is its claims' CPUs or the shared pool;
    every bound pod runs, deleted pods are gone; the slices are those of the topology.
    """
    node_uid = node.api.get("nodes", node.node_name)["metadata"]["uid"]
    desired = desired_slices(
        XEON, mode="grouped", reserved_cpus="", node_name=node.node_name, node_uid=node_uid
    )
    observation = await observe_node(node, online=ALL, reserved=CPUSet(), desired=desired)
    violations = check_invariants(observation)
    assert violations == [], "\n".join(str(v) for v in violations)
    return observation.daemon_claims


async def restart(node: SimNode) -> None:
    assert node.daemon is not None
    node.daemon.kill()
    assert await node.daemon.process.wait() == -9
    await node.start_daemon(sysfs_root=XEON)


async def test_kill9_at_each_step_loses_no_claim_and_doubles_no_cpu(short_tmp: str) -> None:
    workdir = short_tmp
    node = SimNode(workdir=workdir, node_cpus="0-79", node_mems="0-1")
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        await node.start_daemon(sysfs_root=XEON)
        await node.create(pod("plain"))
        await wait_for(lambda: running(node, "default/plain"), "the plain pod")

        # 1. Claim allocated and prepared, its pod running; killed, restarted.
        await node.create(resource_claim("a", 4))
        await node.create(pod("pa", "a"))
        await wait_for(lambda: running(node, "default/pa"), "pod pa")
        before = await checked_claims(node)
        assert len(before) == 1
        await restart(node)
        assert await checked_claims(node) == before

        # 2. Killed while the kubelet prepares a second claim: the kubelet retries.
        await node.create(resource_claim("b", 6))
        await node.create(pod("pb", "b"))
        await trio.sleep(0.05)
        await restart(node)
        await wait_for(lambda: running(node, "default/pb"), "pod pb after a restart")
        claims = await checked_claims(node)
        assert len(claims) == 2
        assert sorted(len(c) for c in claims.values()) == [4, 6]

        # 3. Killed right after pod pa was deleted: unprepare happens after the restart.
        await node.delete_pod("default", "pa")
        await trio.sleep(0.05)
        await restart(node)

        async def a_released() -> bool:
            # Unprepared, and the pod object gone (the kubelet removes it after unpreparing).
            state = await node.debug_state()
            pa_runs = node.pod_states().get("default/pa", {}).get("phase") == "Running"
            pa_exists = any(p["metadata"]["name"] == "pa" for p in node.api.list("pods", "default"))
            return len(state["claims"]) == 1 and not pa_runs and not pa_exists

        await wait_for(a_released, "claim a to be unprepared and pod pa gone")
        claims = await checked_claims(node)
        assert [len(c) for c in claims.values()] == [6]

        # 4. After the unprepare: a restart brings back exactly the one remaining claim.
        await restart(node)
        assert await checked_claims(node) == claims
        # The plain pod follows the shared pool through all of it.
        state = await node.debug_state()
        ctr = node.pod_states()["default/plain"]["containers"]["app"]
        assert node.cpuset_of(ctr["id"]) == state["sharedPool"]
        log = Path(workdir, "dracpu.log").read_text()
        assert log.count('"driver started"') == 5, json.dumps(node.pod_states())[:2000]
        nursery.cancel_scope.cancel()
