"""Each fault of the chaos engine does what it says, on a simulated node without the daemon
(the daemon kill is covered by the seeded runs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from dracpu import cdi
from dracpu.cpuset import CPUSet
from dracpu_sim.chaos import (
    API_409_TARGETS,
    API_500_TARGETS,
    Action,
    ChaosOptions,
    ChaosRun,
    PodPlan,
    _desired_slices,
    check_invariants,
    make_plan,
)
from dracpu_sim.node import SimNode

XEON = str(Path(__file__).parents[1] / "fake_sysfs" / "xeon-2s-ht")


def a_slice(name: str) -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "dra.cpu",
            "nodeName": "demo-node",
            "pool": {"name": "demo-node", "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


@pytest.fixture
def workdir(short_tmp: str) -> str:
    """The simulated node's work directory: short, for its unix sockets."""
    return short_tmp


async def test_each_fault_hits_its_target(workdir: str) -> None:
    node = SimNode(workdir=workdir, node_cpus="0-79", node_mems="0-1")
    opts = ChaosOptions(seed=1, duration=5.0, sysfs_root=XEON)
    chaos = ChaosRun(opts, make_plan(1, 5.0), node)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        assert node.runtime is not None
        runtime = node.runtime

        # Nothing runs yet: a tamper finds no target; a slice delete finds no slice.
        assert await chaos._inject(Action(0, "cpuset-tamper", value=3)) is None
        assert await chaos._inject(Action(0, "slice-delete", value=3)) is None

        # A plain pod runs on every CPU (no NRI plugin): the tamper rewrites its cgroup file.
        chaos._create_pod(PodPlan("p0000"))
        with trio.fail_after(20):
            while node.pod_states().get("default/p0000", {}).get("phase") != "Running":
                await trio.sleep(0.05)
        cid = node.pod_states()["default/p0000"]["containers"]["app"]["id"]
        assert node.cpuset_of(cid) == "0-79"
        what = await chaos._inject(Action(0, "cpuset-tamper", value=12345))
        assert what is not None and what.startswith("default/p0000/app cpuset 0-79 -> ")
        tampered = CPUSet.parse(node.cpuset_of(cid))
        assert tampered != CPUSet.parse("0-79") and tampered <= CPUSet.parse("0-79")
        assert what.endswith(tampered.format())

        node.api.create("resourceslices", a_slice("00000-dra.cpu-demo-node-abcde"))
        assert await chaos._inject(Action(0, "slice-delete", value=7)) == (
            "slice 00000-dra.cpu-demo-node-abcde deleted"
        )
        assert node.api.list("resourceslices") == []

        # API faults are queued on the server for the named verb and resource.
        value = 2 + (1 << 8)  # target index 2, count 2
        assert await chaos._inject(Action(0, "api-409", value=value)) == (
            f"api-409 on {API_409_TARGETS[2][0]} {API_409_TARGETS[2][1]} x2"
        )
        assert await chaos._inject(Action(0, "api-drop", value=0)) == (
            f"api-drop on {API_500_TARGETS[0][0]} {API_500_TARGETS[0][1]} x1"
        )
        assert node.api.faults.pending() == 3
        fault = node.api.faults.take(*API_409_TARGETS[2])
        assert fault is not None and fault.status == 409
        dropped = node.api.faults.take(*API_500_TARGETS[0])
        assert dropped is not None and dropped.drop_connection
        what = await chaos._inject(Action(0, "api-500", value=len(API_500_TARGETS) - 1))
        assert what == "api-500 on * * x1"

        # UpdateContainers knobs: fail, list as failed, or never answer.
        assert await chaos._inject(Action(0, "update-fail", value=1)) == (
            "next 2 UpdateContainers fail"
        )
        assert runtime._fail_updates == 2
        assert await chaos._inject(Action(0, "update-fail", value=18)) == (
            "next 1 UpdateContainers list every update failed"
        )
        assert runtime._mark_failed_updates == 1
        assert await chaos._inject(Action(0, "update-fail", value=32)) == (
            "next 3 UpdateContainers unanswered"
        )
        assert runtime._drop_updates == 3
        # ... or say yes and not apply them (containerd), or record them while the cgroups
        # keep their cpusets.
        assert await chaos._inject(Action(0, "update-fail", value=48)) == (
            "next 1 update batches silently not applied"
        )
        assert runtime.update_mode == "containerd-drop"
        assert await chaos._inject(Action(0, "update-fail", value=65)) == (
            "next 3 update batches recorded but the cgroups keep their cpusets"
        )
        assert runtime.update_mode == "cgroup-differs"
        chaos._quiesce()
        assert runtime.update_mode == "apply"
        assert node.api.faults.pending() == 0
        assert (runtime._fail_updates, runtime._mark_failed_updates, runtime._drop_updates) == (
            0,
            0,
            0,
        )

        # The runtime goes away and comes back on the same socket; the pod keeps running.
        assert await chaos._inject(Action(0, "runtime-restart", value=100)) == (
            "runtime restarted (0.10s down)"
        )
        assert Path(node.nri_socket).exists()
        assert await chaos._inject(Action(0, "nri-drop")) == "NRI connection dropped"
        assert await chaos._inject(Action(0, "watch-drop")) == "0 watches dropped"
        assert node.pod_states()["default/p0000"]["phase"] == "Running"

        # Deleting the pod queues its claim (none here) and the pod goes away gracefully.
        chaos._delete_pod(PodPlan("p0000"))
        with trio.fail_after(20):
            while node.api.list("pods"):
                await trio.sleep(0.05)
        assert chaos.result.pods_created == 1 and chaos.result.pods_deleted == 1
        nursery.cancel_scope.cancel()


async def test_observation_reads_the_real_stores(workdir: str) -> None:
    """A negative control: damage the daemon's files behind its back and the checker,
    reading the real node, says so (the seeded runs show it quiet on a healthy node)."""
    node = SimNode(workdir=workdir, node_cpus="0-79", node_mems="0-1")
    opts = ChaosOptions(seed=1, duration=5.0, sysfs_root=XEON)
    chaos = ChaosRun(opts, make_plan(1, 5.0), node)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        node_uid = node.api.get("nodes", node.node_name)["metadata"]["uid"]
        chaos.desired = _desired_slices(opts, node_uid, node.node_name)
        await node.start_daemon(sysfs_root=XEON, extra_args=chaos.extra_args)
        chaos._create_pod(PodPlan("p0000", claim_cpus=4, sidecar=True))
        chaos._create_pod(PodPlan("p0001"))
        with trio.fail_after(30):
            while await chaos._settle_reasons((-1, 0)) or check_invariants(await chaos.observe()):
                await trio.sleep(0.1)
        obs = await chaos.observe()
        assert len(obs.daemon_claims) == 1 and len(obs.containers) == 3
        (uid,) = obs.daemon_claims

        Path(cdi.claim_spec_path(node.cdi_dir, uid)).unlink()
        Path(node.state_dir, "checkpoint.json").unlink()
        violations = check_invariants(await chaos.observe())
        assert [v.kind for v in violations] == ["checkpoint-unreadable", "cdi-mismatch"]
        assert violations[1].detail == (
            f"CDI specs vs daemon: {uid}: absent vs {obs.daemon_claims[uid]}"
        )
        nursery.cancel_scope.cancel()
