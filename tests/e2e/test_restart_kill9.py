"""Crash safety: `dracpu run` killed with SIGKILL at each step of a claim's life.

The real daemon runs as a child process on the simulated node. It is killed after the claim
was allocated but before its pod ran, while the pod runs, right after the pod was deleted
(unprepare pending), and after the unprepare; it is started again each time. After every
restart the node must hold exactly the right claims: no CPU in two claims, no CPU leaked,
every running container's cgroup cpuset equal to what dracpu intends, and the checkpoint
and CDI specs in agreement with the daemon's state.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import trio

from dracpu import cdi
from dracpu.allocation.checkpoint import decode_checkpoint
from dracpu.allocation.env import parse_dra_env
from dracpu.cpuset import CPUSet
from dracpu.sim.node import SimNode

XEON = str(Path(__file__).parents[1] / "fake_sysfs" / "xeon-2s-ht")
ALL = CPUSet.parse("0-79")


def claim(name: str, cpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "cpus",
                        "exactly": {
                            "deviceClassName": "dra.cpu",
                            "capacity": {"requests": {"dra.cpu/cpu": str(cpus)}},
                        },
                    }
                ]
            }
        },
    }


def pod(name: str, claim_name: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app"}
    spec: dict[str, Any] = {"containers": [container]}
    if claim_name:
        spec["resourceClaims"] = [{"name": "c", "resourceClaimName": claim_name}]
        container["resources"] = {"claims": [{"name": "c"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


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


async def check_invariants(node: SimNode) -> dict[str, CPUSet]:
    """The node's claims by UID, after checking every cross-store invariant."""
    state = await node.debug_state()
    claims = {c["uid"]: CPUSet.parse(c["cpus"]) for c in state["claims"]}
    union = CPUSet()
    for uid, cpus in claims.items():
        assert cpus, f"claim {uid} holds no CPUs"
        assert union.isdisjoint(cpus), f"claim {uid} shares CPUs with another claim"
        union |= cpus
    shared = CPUSet.parse(state["sharedPool"])
    assert shared == ALL - union, "a CPU is neither in a claim nor in the shared pool"
    # Checkpoint and CDI specs say the same as the daemon.
    checkpoint = decode_checkpoint(Path(node.state_dir, "checkpoint.json").read_bytes())
    assert {r.uid: r.cpus for r in checkpoint.claims} == claims
    assert cdi.read_claim_specs(node.cdi_dir).claims == claims
    # Every running container is enforced where dracpu intends.
    for ref, st in node.pod_states().items():
        if st["phase"] != "Running":
            continue
        for name, ctr in st["containers"].items():
            env = parse_dra_env(ctr["env"])
            want = CPUSet()
            for uid, cpus in env.items():
                assert claims.get(uid) == cpus, f"{ref}/{name} runs on a claim not prepared"
                want |= cpus
            got = CPUSet.parse(node.cpuset_of(ctr["id"]))
            assert got == (want or shared), f"{ref}/{name}: cgroup {got}, want {want or shared}"
    return claims


async def restart(node: SimNode) -> None:
    assert node.daemon is not None
    node.daemon.kill()
    assert await node.daemon.process.wait() == -9
    await node.start_daemon(sysfs_root=XEON)


async def test_kill9_at_each_step_loses_no_claim_and_doubles_no_cpu() -> None:
    workdir = tempfile.mkdtemp(prefix="drk", dir="/tmp")
    node = SimNode(workdir=workdir, node_cpus="0-79", node_mems="0-1")
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        await node.start_daemon(sysfs_root=XEON)
        await node.create(pod("plain", None))
        await wait_for(lambda: running(node, "default/plain"), "the plain pod")

        # 1. Claim allocated and prepared, its pod running; killed, restarted.
        await node.create(claim("a", 4))
        await node.create(pod("pa", "a"))
        await wait_for(lambda: running(node, "default/pa"), "pod pa")
        before = await check_invariants(node)
        assert len(before) == 1
        await restart(node)
        assert await check_invariants(node) == before

        # 2. Killed while the kubelet prepares a second claim: the kubelet retries.
        await node.create(claim("b", 6))
        await node.create(pod("pb", "b"))
        await trio.sleep(0.05)
        await restart(node)
        await wait_for(lambda: running(node, "default/pb"), "pod pb after a restart")
        claims = await check_invariants(node)
        assert len(claims) == 2
        assert sorted(len(c) for c in claims.values()) == [4, 6]

        # 3. Killed right after pod pa was deleted: unprepare happens after the restart.
        await node.delete_pod("default", "pa")
        await trio.sleep(0.05)
        await restart(node)

        async def a_released() -> bool:
            state = await node.debug_state()
            return len(state["claims"]) == 1 and "default/pa" not in {
                r for r, st in node.pod_states().items() if st["phase"] == "Running"
            }

        await wait_for(a_released, "claim a to be unprepared")
        claims = await check_invariants(node)
        assert [len(c) for c in claims.values()] == [6]

        # 4. After the unprepare: a restart brings back exactly the one remaining claim.
        await restart(node)
        assert await check_invariants(node) == claims
        # The plain pod follows the shared pool through all of it.
        state = await node.debug_state()
        ctr = node.pod_states()["default/plain"]["containers"]["app"]
        assert node.cpuset_of(ctr["id"]) == state["sharedPool"]
        log = Path(workdir, "dracpu.log").read_text()
        assert log.count('"driver started"') == 5, json.dumps(node.pod_states())[:2000]
        nursery.cancel_scope.cancel()
