"""The state owner's claim events reach the claim status writer (dracpu.k8s.claim_status).

A prepare through the DRA service publishes ``ClaimPrepared`` once it committed, naming
each device as the allocation does (share IDs included); an unprepare publishes
``ClaimUnprepared`` under the kubelet's names; what did not commit publishes nothing; a
repeated prepare reaches only the subscribers that asked. The writer, subscribed as the
daemon subscribes it, turns them into applies of the claim's entries and their removal.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import msgspec
import trio
import trio.testing
from builders import claim, result
from kubelet_harness import make_node

from dracpu.allocation.opaque import DeviceConfig
from dracpu.allocation.store import ClaimTracker
from dracpu.cpuset import CPUSet
from dracpu.k8s.claim_status import ClaimStatusWriter
from dracpu.k8s.claim_status_body import apply_body, removal_body
from dracpu.kubelet import ClaimRef
from dracpu.messages import ClaimDevice, ClaimEvent, ClaimPrepared, ClaimUnprepared

SHARE = "6a1b0f0e-8d39-4f6e-9c38-2f4a0a1b2c3d"
SINCE = datetime(2026, 12, 3, 15, 0, 0, tzinfo=UTC)
SHARED_POOL = DeviceConfig(
    source="FromClaim",
    driver="dra.cpu",
    parameters=json.dumps(
        {"apiVersion": "dra.cpu/v1alpha1", "kind": "AllocationOptions", "sharedPoolAccess": True}
    ).encode(),
)


def drain(inbox: trio.MemoryReceiveChannel[ClaimEvent]) -> list[ClaimEvent]:
    out = []
    while True:
        try:
            out.append(inbox.receive_nowait())
        except trio.WouldBlock:
            return out


async def test_committed_prepares_and_unprepares_are_told(cdi_dir: str) -> None:
    node = make_node(cdi_dir)
    service = node.restart()
    events = node.state.claim_events(repeated_prepares=True)
    node.claims.put(claim("o1", result("cpudevnuma000", 2, share_id=SHARE), name="web"))
    ref = ClaimRef(namespace="default", name="web", uid="o1")
    assert (await service.prepare([ref]))["o1"].error == ""
    record = node.view.claim("o1")
    assert record is not None
    assert drain(events) == [
        ClaimPrepared(
            uid="o1",
            namespace="default",
            name="web",
            cpus=record.cpus.format(),
            devices=(ClaimDevice(pool="node-a", device="cpudevnuma000", share_id=SHARE),),
            shared_pool_access=False,
        )
    ]
    assert (await service.unprepare([ref]))["o1"].error == ""
    assert drain(events) == [
        ClaimUnprepared(uid="o1", namespace="default", name="web", cpus=record.cpus.format())
    ]


async def test_nothing_is_told_of_what_did_not_commit(cdi_dir: str) -> None:
    node = make_node(cdi_dir)
    service = node.restart()
    events = node.state.claim_events(repeated_prepares=True)
    # A device this node does not publish: the prepare fails.
    node.claims.put(claim("o2", result("cpudevnuma999", 1), name="bad"))
    bad = ClaimRef(namespace="default", name="bad", uid="o2")
    assert (await service.prepare([bad]))["o2"].error
    # An unprepare of a claim never prepared here releases nothing.
    assert (await service.unprepare([bad]))["o2"].error == ""
    assert drain(events) == []


async def test_every_device_in_order_with_its_share_and_the_shared_pool(cdi_dir: str) -> None:
    node = make_node(cdi_dir)
    service = node.restart()
    events = node.state.claim_events()
    results = (result("cpudevnuma000", 2), result("cpudevnuma001", 2, share_id=SHARE))
    node.claims.put(claim("o3", *results, name="two", configs=(SHARED_POOL,)))
    ref = ClaimRef(namespace="default", name="two", uid="o3")
    assert (await service.prepare([ref]))["o3"].error == ""
    (event,) = drain(events)
    assert isinstance(event, ClaimPrepared)
    assert event.devices == (
        ClaimDevice(pool="node-a", device="cpudevnuma000"),
        ClaimDevice(pool="node-a", device="cpudevnuma001", share_id=SHARE),
    )
    assert event.shared_pool_access is True
    assert len(CPUSet.parse(event.cpus)) == 4


async def test_a_repeated_prepare_is_heard_only_by_who_asked(cdi_dir: str) -> None:
    node = make_node(cdi_dir)
    service = node.restart()
    plain = node.state.claim_events()
    repeats = node.state.claim_events(repeated_prepares=True)
    node.claims.put(claim("o4", result("cpudevnuma000", 2, share_id=SHARE), name="web"))
    ref = ClaimRef(namespace="default", name="web", uid="o4")
    assert (await service.prepare([ref]))["o4"].error == ""
    assert (await service.prepare([ref]))["o4"].error == ""  # the kubelet asks again
    (first,) = drain(plain)
    assert isinstance(first, ClaimPrepared) and not first.repeated
    assert drain(repeats) == [first, msgspec.structs.replace(first, repeated=True)]


async def test_an_adopted_claim_is_unprepared_under_the_kubelets_names(cdi_dir: str) -> None:
    # Synchronize learns a claim from a container's env: UID and CPUs, no names.
    node = make_node(cdi_dir)
    service = node.restart()
    cpus = CPUSet(list(node.view.free)[:2])
    node.state.synchronized({"o5": cpus}, ClaimTracker(), [])
    events = node.state.claim_events()
    ref = ClaimRef(namespace="team", name="adopted", uid="o5")
    assert (await service.unprepare([ref]))["o5"].error == ""
    assert drain(events) == [
        ClaimUnprepared(uid="o5", namespace="team", name="adopted", cpus=cpus.format())
    ]


class EchoKube:
    """An API server that stores what it is given; every status apply is recorded."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.resource = self

    def patch_namespaced_resource_claim_status(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("called through KubeClient.call_raw only")

    async def call_raw(self, fn: Any, /, *args: Any, **kwargs: Any) -> bytes:
        body = args[2]
        self.bodies.append(body)
        return json.dumps({"metadata": {"uid": "o6"}, "status": body.get("status", {})}).encode()

    async def get_raw(self, path: str, **params: str) -> bytes:
        # The claim read by a writer after a restart: stored, no status written yet.
        return json.dumps({"metadata": {"uid": "o6", **params}}).encode()


async def test_the_writer_subscribed_as_the_daemon_does_writes_and_removes(
    cdi_dir: str, autojump_clock: trio.testing.MockClock
) -> None:
    node = make_node(cdi_dir)
    service = node.restart()
    kube = EchoKube()
    counted: list[tuple[str, str]] = []
    writer = ClaimStatusWriter(
        kube,  # type: ignore[arg-type]
        node_name="node-a",
        topology=lambda: node.topology,
        count=lambda operation, result: counted.append((operation, result)),
        now=lambda: SINCE,
    )
    node.claims.put(claim("o6", result("cpudevnuma000", 2, share_id=SHARE), name="web"))
    ref = ClaimRef(namespace="default", name="web", uid="o6")
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run, node.state.claim_events(repeated_prepares=True))
        assert (await service.prepare([ref]))["o6"].error == ""
        await trio.testing.wait_all_tasks_blocked()
        record = node.view.claim("o6")
        assert record is not None
        expected = ClaimPrepared(
            uid="o6",
            namespace="default",
            name="web",
            cpus=record.cpus.format(),
            devices=(ClaimDevice(pool="node-a", device="cpudevnuma000", share_id=SHARE),),
        )
        assert kube.bodies == [
            apply_body(expected, topology=node.topology, node_name="node-a", since=SINCE)
        ]
        assert kube.bodies[0]["status"]["devices"][0]["shareID"] == SHARE
        # The kubelet asks again (its reply was lost): the same status is not written twice.
        assert (await service.prepare([ref]))["o6"].error == ""
        await trio.testing.wait_all_tasks_blocked()
        assert len(kube.bodies) == 1
        assert (await service.unprepare([ref]))["o6"].error == ""
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert kube.bodies[1:] == [removal_body("default", "web", "o6")]
    assert counted == [("apply", "success"), ("remove", "success")]


async def test_a_restarted_writer_writes_on_the_kubelets_repeated_prepare(
    cdi_dir: str, autojump_clock: trio.testing.MockClock
) -> None:
    # The prepare committed, then dracpu stopped before the status was written (no writer
    # heard it); the kubelet, which got no reply, prepares again and the new writer writes.
    node = make_node(cdi_dir)
    service = node.restart()
    node.claims.put(claim("o6", result("cpudevnuma000", 2), name="web"))
    ref = ClaimRef(namespace="default", name="web", uid="o6")
    assert (await service.prepare([ref]))["o6"].error == ""
    kube = EchoKube()
    writer = ClaimStatusWriter(
        kube,  # type: ignore[arg-type]
        node_name="node-a",
        topology=lambda: node.topology,
        now=lambda: SINCE,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run, node.state.claim_events(repeated_prepares=True))
        assert (await service.prepare([ref]))["o6"].error == ""
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    (body,) = kube.bodies
    assert [e["device"] for e in body["status"]["devices"]] == ["cpudevnuma000"]
    assert writer.describe()["claims"] == {"o6": "written"}
