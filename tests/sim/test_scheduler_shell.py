"""The scheduler's Trio shell against the loopback API server through the real
``kubernetes`` client."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import builders
import pytest
import trio
from builders import NODE, claim_request, device_class, machine, resource_claim

from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.k8s.client import KubeClient
from dracpu_sim.apiserver import SimAPIServer
from dracpu_sim.scheduler import ScheduleOutcome, Scheduler


class Cluster:
    def __init__(self, server: SimAPIServer, api: KubeClient) -> None:
        self.server = server
        self.api = api
        ids = itertools.count(1)
        self.scheduler = Scheduler(api, NODE, new_share_id=lambda: f"share-{next(ids)}")

    def claim(self, name: str, cpus: int | None = None, **exactly: Any) -> dict[str, Any]:
        request = claim_request(cpus=cpus, **exactly)
        return self.server.create("resourceclaims", resource_claim(name, requests=[request]))

    def pod(self, name: str, *claims: str, template: str | None = None) -> dict[str, Any]:
        container = {"name": "main", "image": "busybox"}
        body = builders.pod(name, *claims, container=container, template=template)
        return self.server.create("pods", body)

    def get(self, plural: str, name: str) -> dict[str, Any]:
        return self.server.get(plural, name, "default")


@pytest.fixture
async def cluster(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Cluster]:
    server = SimAPIServer(seed=1)
    await nursery.start(server.serve)
    api = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    server.create("deviceclasses", device_class())
    topo = machine("xeon-2s-ht")  # two NUMA devices of 40 CPUs
    for obj in build_slices(
        build_inventory(topo, DeviceSettings()),
        node_name=NODE,
        node_uid="uid-1",
        expose_pcie_roots=False,
    ):
        server.create("resourceslices", obj)
    yield Cluster(server, api)
    api.close()


def kinds(outcomes: list[ScheduleOutcome]) -> list[tuple[str, str]]:
    return [(o.kind, o.pod) for o in outcomes]


async def test_pods_are_bound_and_claims_allocated_and_reserved(cluster: Cluster) -> None:
    cluster.claim("small", cpus=4)
    p1 = cluster.pod("p1", "small")
    cluster.pod("plain")
    outcomes = await cluster.scheduler.schedule_once()
    assert kinds(outcomes) == [("Scheduled", "default/p1"), ("Scheduled", "default/plain")]
    assert outcomes[0].claims == ("default/small",)
    assert outcomes[0].message == "Successfully assigned default/p1 to node-a"

    status = cluster.get("resourceclaims", "small")["status"]
    assert status == {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "cpus",
                        "driver": "dra.cpu",
                        "pool": NODE,
                        "device": "cpudevnuma000",
                        "shareID": "share-1",
                        "consumedCapacity": {"dra.cpu/cpu": "4"},
                    }
                ],
                "config": [],
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": "p1", "uid": p1["metadata"]["uid"]}],
    }
    assert cluster.get("pods", "p1")["spec"]["nodeName"] == NODE
    assert cluster.get("pods", "plain")["spec"]["nodeName"] == NODE
    # Nothing pending any more: a second round does nothing.
    assert await cluster.scheduler.schedule_once() == []


async def test_capacity_is_tracked_across_rounds(cluster: Cluster) -> None:
    for name in ("a", "b", "c"):
        cluster.claim(name, cpus=30)
        cluster.pod(f"pod-{name}", name)
    outcomes = await cluster.scheduler.schedule_once()
    assert kinds(outcomes) == [
        ("Scheduled", "default/pod-a"),
        ("Scheduled", "default/pod-b"),
        ("FailedScheduling", "default/pod-c"),
    ]
    devices = [
        cluster.get("resourceclaims", n)["status"]["allocation"]["devices"]["results"][0]["device"]
        for n in ("a", "b")
    ]
    assert devices == ["cpudevnuma000", "cpudevnuma001"]
    # A later round sees the capacity held in the API objects, not in memory.
    cluster.claim("d", cpus=10)
    cluster.pod("pod-d", "d")
    fresh = Scheduler(cluster.api, NODE)
    assert kinds(await fresh.schedule_once()) == [
        ("FailedScheduling", "default/pod-c"),
        ("Scheduled", "default/pod-d"),
    ]


async def test_unsatisfiable_claim_leaves_the_pod_pending_with_the_reason(
    cluster: Cluster,
) -> None:
    cluster.claim("big", cpus=64)
    cluster.pod("hungry", "big")
    outcomes = await cluster.scheduler.schedule_once()
    message = (
        'claim default/big: request "cpus": no device in class dra.cpu on node-a has '
        "64 dra.cpu/cpu capacity left (largest: 40)"
    )
    assert outcomes == [
        ScheduleOutcome("FailedScheduling", "default/hungry", message, ("default/big",))
    ]
    pod = cluster.get("pods", "hungry")
    assert not pod["spec"].get("nodeName")
    assert pod["status"]["conditions"] == [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    ]
    assert "allocation" not in (cluster.get("resourceclaims", "big").get("status") or {})
    rv = pod["metadata"]["resourceVersion"]
    # Retried every round; the same reason is one event and no new pod write.
    assert (await cluster.scheduler.schedule_once())[0].message == message
    assert cluster.get("pods", "hungry")["metadata"]["resourceVersion"] == rv
    assert [e.kind for e in cluster.scheduler.events] == ["FailedScheduling"]


async def test_all_claims_of_a_pod_or_none(cluster: Cluster) -> None:
    cluster.claim("fits", cpus=8)
    cluster.claim("too-big", cpus=41)
    cluster.pod("two", "fits", "too-big")
    outcomes = await cluster.scheduler.schedule_once()
    assert outcomes[0].kind == "FailedScheduling"
    assert outcomes[0].claims == ("default/too-big",)
    # The claim that would have fitted was not written either.
    assert "status" not in cluster.get("resourceclaims", "fits")


async def test_a_claim_shared_by_two_pods_is_allocated_once(cluster: Cluster) -> None:
    cluster.claim("shared", cpus=2)
    p1 = cluster.pod("p1", "shared")
    p2 = cluster.pod("p2", "shared")
    assert kinds(await cluster.scheduler.schedule_once()) == [
        ("Scheduled", "default/p1"),
        ("Scheduled", "default/p2"),
    ]
    status = cluster.get("resourceclaims", "shared")["status"]
    assert len(status["allocation"]["devices"]["results"]) == 1
    assert [r["uid"] for r in status["reservedFor"]] == [
        p1["metadata"]["uid"],
        p2["metadata"]["uid"],
    ]
    # One pod goes: its reservation goes, the allocation stays for the other.
    cluster.server.delete("pods", "p1", "default")
    assert await cluster.scheduler.schedule_once() == []
    status = cluster.get("resourceclaims", "shared")["status"]
    assert [r["name"] for r in status["reservedFor"]] == ["p2"]
    assert status["allocation"]["devices"]["results"][0]["shareID"] == "share-1"
    # The last one goes: the claim is deallocated and its capacity is free again.
    cluster.server.delete("pods", "p2", "default")
    outcomes = await cluster.scheduler.schedule_once()
    assert outcomes == [
        ScheduleOutcome(
            "Deallocated",
            "",
            "claim default/shared is reserved for no pod: allocation released",
            ("default/shared",),
        )
    ]
    assert cluster.get("resourceclaims", "shared").get("status", {}) == {}


async def test_reservations_of_other_consumers_are_kept(cluster: Cluster) -> None:
    claim = cluster.claim("job-owned", cpus=1)
    claim["status"] = {
        "allocation": {
            "devices": {"results": [], "config": []},
            "nodeSelector": {"nodeSelectorTerms": []},
        },
        "reservedFor": [
            {"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "u-job"},
            {"resource": "pods", "name": "gone", "uid": "u-gone"},
        ],
    }
    cluster.server.update("resourceclaims", claim, subresource="status")
    assert await cluster.scheduler.schedule_once() == []
    status = cluster.get("resourceclaims", "job-owned")["status"]
    assert status["reservedFor"] == [
        {"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "u-job"}
    ]
    assert "allocation" in status


async def test_missing_claim_and_template_claims_are_reported(cluster: Cluster) -> None:
    cluster.pod("lost", "nope")
    cluster.pod("templated", template="cpu-template")
    outcomes = await cluster.scheduler.schedule_once()
    assert [(o.pod, o.message) for o in outcomes] == [
        (
            "default/lost",
            'pod default/lost: waiting for resourceclaim "default/nope" to be created',
        ),
        (
            "default/templated",
            "pod default/templated: pod claim 'tpl': resourceclaimtemplate "
            '"default/cpu-template" not found',
        ),
    ]
    # Created later: the next round schedules the pod.
    cluster.claim("nope", cpus=1)
    assert kinds(await cluster.scheduler.schedule_once())[0] == ("Scheduled", "default/lost")


async def test_template_claim_recorded_in_pod_status_is_used(cluster: Cluster) -> None:
    cluster.claim("generated-abc", cpus=3)
    pod = cluster.pod("templated", template="cpu-template")
    cluster.server.patch(
        "pods",
        "templated",
        {
            "status": {
                "resourceClaimStatuses": [{"name": "tpl", "resourceClaimName": "generated-abc"}]
            }
        },
        "default",
        subresource="status",
    )
    assert kinds(await cluster.scheduler.schedule_once()) == [("Scheduled", "default/templated")]
    reserved = cluster.get("resourceclaims", "generated-abc")["status"]["reservedFor"]
    assert reserved == [{"resource": "pods", "name": "templated", "uid": pod["metadata"]["uid"]}]


async def test_claim_allocated_to_another_node(cluster: Cluster) -> None:
    claim = cluster.claim("elsewhere", cpus=1)
    x = cluster.pod("x", "elsewhere")
    claim["status"] = {
        "allocation": {
            "devices": {"results": [], "config": []},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["node-b"]}
                        ]
                    }
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": "x", "uid": x["metadata"]["uid"]}],
    }
    cluster.server.update("resourceclaims", claim, subresource="status")
    cluster.pod("y", "elsewhere")
    outcomes = await cluster.scheduler.schedule_once()
    assert [(o.kind, o.pod, o.message) for o in outcomes] == [
        (
            "FailedScheduling",
            f"default/{name}",
            f"pod default/{name}: resourceclaim default/elsewhere is allocated to another node",
        )
        for name in ("x", "y")
    ]


async def test_stale_reservations_are_dropped_before_scheduling(cluster: Cluster) -> None:
    claim = cluster.claim("stale", cpus=1)
    claim["status"] = {
        "allocation": {
            "devices": {"results": [], "config": []},
            "nodeSelector": {"nodeSelectorTerms": []},
        },
        "reservedFor": [{"resource": "pods", "name": "old", "uid": "u-old"}],
    }
    cluster.server.update("resourceclaims", claim, subresource="status")
    new = cluster.pod("new", "stale")
    outcomes = await cluster.scheduler.schedule_once()
    # The pod that held it is gone: deallocated first, then allocated again for the new one.
    assert kinds(outcomes) == [("Deallocated", ""), ("Scheduled", "default/new")]
    status = cluster.get("resourceclaims", "stale")["status"]
    assert status["reservedFor"] == [
        {"resource": "pods", "name": "new", "uid": new["metadata"]["uid"]}
    ]
    assert status["allocation"]["devices"]["results"][0]["device"] == "cpudevnuma000"


async def test_run_schedules_on_poke(cluster: Cluster, nursery: trio.Nursery) -> None:
    scheduler = Scheduler(cluster.api, NODE, poll_interval=3600)
    await nursery.start(scheduler.run)
    cluster.claim("later", cpus=2)
    cluster.pod("later", "later")
    scheduler.poke()
    # The round records its events after its last write: wait for them, not the binding.
    with trio.fail_after(10):
        while not scheduler.events:
            await trio.sleep(0.02)
    assert cluster.get("pods", "later")["spec"]["nodeName"] == NODE
    assert [e.kind for e in scheduler.events] == ["Scheduled"]
    assert scheduler.last_error is None


async def test_run_survives_an_api_outage(cluster: Cluster, nursery: trio.Nursery) -> None:
    scheduler = Scheduler(cluster.api, NODE, poll_interval=0.05)
    cluster.server.faults.inject("list", "pods", count=1000, status=503, message="down for now")
    await nursery.start(scheduler.run)
    with trio.fail_after(10):
        while scheduler.failed_rounds < 2:
            await trio.sleep(0.01)
    assert scheduler.last_error == "down for now"
    cluster.server.faults.clear()
    cluster.pod("after")
    with trio.fail_after(10):
        while not scheduler.events or scheduler.last_error is not None:
            await trio.sleep(0.02)
    assert cluster.get("pods", "after")["spec"]["nodeName"] == NODE
