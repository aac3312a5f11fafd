"""What the simulated scheduler and kubelet use, through the official ``kubernetes`` client:
pods and ResourceClaims listed and watched (all namespaces and one), created, updated,
bound (``pods/binding``), their status written, deleted; DeviceClasses created, read and
listed. Also ``dracpu.k8s.watch.watch_once`` on pods, the helper they can reuse."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import builders
import pytest
import trio
import trio.testing
import urllib3
from builders import allocation, device_result, resource_claim
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from dracpu.k8s.client import Gone, K8sError, KubeClient, load_api_client
from dracpu.k8s.watch import WatchEvent, WatchStream, _decode, watch_once
from dracpu_sim.apiserver import SimAPIServer

T = TypeVar("T")


async def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await trio.to_thread.run_sync(partial(fn, *args, **kwargs))


class Sim:
    def __init__(self, server: SimAPIServer, kubeconfig: Path) -> None:
        self.server = server
        self.kubeconfig = kubeconfig
        self.api_client = load_api_client(str(kubeconfig))
        self.resource = k8s.ResourceV1Api(self.api_client)
        self.core = k8s.CoreV1Api(self.api_client)
        self.kube = KubeClient(self.api_client)


@pytest.fixture
async def sim(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Sim]:
    server = SimAPIServer(seed=4, bookmark_interval=math.inf, max_watch_seconds=math.inf)
    await nursery.start(server.serve)
    sim = Sim(server, server.write_kubeconfig(tmp_path / "kubeconfig"))
    yield sim
    sim.api_client.close()


def pod(name: str, node: str | None = None) -> dict[str, Any]:
    """A pod whose namespace the create call names."""
    return builders.pod(name, namespace=None, node=node, container={"name": "c", "image": "pause"})


def claim(name: str) -> dict[str, Any]:
    """A claim whose namespace the create call names."""
    return resource_claim(name, namespace=None)


def status_of(exc: ApiException) -> dict[str, Any]:
    return json.loads(exc.body)  # type: ignore[no-any-return]


class Watching:
    """A ``kubernetes.watch.Watch`` stream in a worker thread, collecting
    ``(type, namespace/name)`` until it has ``count`` events."""

    def __init__(
        self,
        list_fn: Callable[..., Any],
        *args: Any,
        return_type: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.events: list[tuple[str, str]] = []
        self.list_fn, self.args, self.kwargs = list_fn, args, kwargs
        self.watch = k8s_watch.Watch(return_type=return_type)

    async def collect(self, count: int, act: Callable[[], None]) -> list[tuple[str, str]]:
        ready = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def consume() -> None:
            stream = self.watch.stream(self.list_fn, *self.args, timeout_seconds=30, **self.kwargs)
            for event in stream:
                if event["type"] == "BOOKMARK":
                    trio.from_thread.run_sync(ready.set, trio_token=token)
                    continue
                meta = event["object"].metadata
                self.events.append((event["type"], f"{meta.namespace}/{meta.name}"))
                if len(self.events) == count:
                    self.watch.stop()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(trio.to_thread.run_sync, consume, abandon_on_cancel=True))
            # sendInitialEvents ends its replay with a bookmark: the watch is registered
            await ready.wait()
            act()
        return self.events


CLAIM_MODEL = "ResourceV1ResourceClaim"

WATCH_FROM_NOW = {
    "send_initial_events": True,
    "allow_watch_bookmarks": True,
    "resource_version_match": "NotOlderThan",
}


# -- pods --------------------------------------------------------------------------------------


async def test_pods_list_and_watch_all_namespaces_and_one(sim: Sim) -> None:
    await run(sim.core.create_namespaced_pod, "ns1", pod("a"))
    await run(sim.core.create_namespaced_pod, "ns2", pod("b"))
    in_ns1 = await run(sim.core.list_namespaced_pod, "ns1")
    assert [p.metadata.name for p in in_ns1.items] == ["a"]
    everywhere = await run(sim.core.list_pod_for_all_namespaces)
    assert [(p.metadata.namespace, p.metadata.name) for p in everywhere.items] == [
        ("ns1", "a"),
        ("ns2", "b"),
    ]

    def changes() -> None:
        sim.server.create("pods", pod("c"), "ns2")
        sim.server.patch("pods", "a", {"metadata": {"labels": {"x": "y"}}}, "ns1")
        sim.server.delete("pods", "b", "ns2")

    # initial ADDED events for what exists, then the changes
    all_ns = Watching(sim.core.list_pod_for_all_namespaces, **WATCH_FROM_NOW)
    assert await all_ns.collect(5, changes) == [
        ("ADDED", "ns1/a"),
        ("ADDED", "ns2/b"),
        ("ADDED", "ns2/c"),
        ("MODIFIED", "ns1/a"),
        ("DELETED", "ns2/b"),
    ]

    def more() -> None:
        sim.server.create("pods", pod("d"), "ns2")
        sim.server.create("pods", pod("e"), "ns1")
        sim.server.delete("pods", "a", "ns1")

    one_ns = Watching(sim.core.list_namespaced_pod, "ns1", **WATCH_FROM_NOW)
    assert await one_ns.collect(3, more) == [
        ("ADDED", "ns1/a"),
        ("ADDED", "ns1/e"),
        ("DELETED", "ns1/a"),
    ]


async def test_kubelet_style_watch_sees_a_pod_when_it_is_bound(sim: Sim) -> None:
    await run(sim.core.create_namespaced_pod, "ns1", pod("p1"))

    def bind() -> None:
        sim.server.store.bind("ns1", "p1", {"target": {"kind": "Node", "name": "node-a"}})
        sim.server.create("pods", pod("elsewhere", node="node-b"), "ns1")
        sim.server.patch(
            "pods", "p1", {"status": {"phase": "Running"}}, "ns1", subresource="status"
        )

    on_node = Watching(
        sim.core.list_pod_for_all_namespaces,
        field_selector="spec.nodeName=node-a",
        **WATCH_FROM_NOW,
    )
    # unbound at first: not selected; the binding makes it ADDED for this watcher
    assert await on_node.collect(2, bind) == [("ADDED", "ns1/p1"), ("MODIFIED", "ns1/p1")]


async def test_pod_binding(sim: Sim) -> None:
    created = await run(sim.core.create_namespaced_pod, "ns1", pod("p1"))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p1", "uid": created.metadata.uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"},
    }
    # (the generated client would parse the Status answer as a Binding; read it raw)
    answer = await sim.kube.call_raw(sim.core.create_namespaced_pod_binding, "p1", "ns1", binding)
    assert json.loads(answer) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    bound = await run(sim.core.read_namespaced_pod, "p1", "ns1")
    assert bound.spec.node_name == "node-a"
    assert [(c.type, c.status) for c in bound.status.conditions] == [("PodScheduled", "True")]
    assert bound.status.phase == "Pending"

    async def bind_error(name: str, body: dict[str, Any]) -> tuple[int, str]:
        with pytest.raises(ApiException) as info:
            await run(
                sim.core.create_namespaced_pod_binding, name, "ns1", body, _preload_content=False
            )
        return info.value.status, status_of(info.value)["message"]

    assert await bind_error("p1", binding) == (
        409,
        'Operation cannot be fulfilled on pods/binding "p1": pod p1 is already assigned to '
        'node "node-a"',
    )
    await run(sim.core.create_namespaced_pod, "ns1", pod("p2"))
    wrong_kind = {"metadata": {"name": "p2"}, "target": {"kind": "Pod", "name": "x"}}
    assert await bind_error("p2", wrong_kind) == (
        422,
        'Binding "p2" is invalid: target.kind: Unsupported value: "Pod": supported values: '
        '"Node", "<empty>"',
    )
    no_target = {"metadata": {"name": "p2"}, "target": {"kind": "Node"}}
    assert await bind_error("p2", no_target) == (
        422,
        'Binding "p2" is invalid: target.name: Required value',
    )
    other_name = {"metadata": {"name": "p3"}, "target": {"name": "node-a"}}
    assert await bind_error("p2", other_name) == (
        400,
        "name in URL does not match name in Binding object",
    )
    stale_uid = {"metadata": {"name": "p2", "uid": "nope"}, "target": {"name": "node-a"}}
    status, message = await bind_error("p2", stale_uid)
    assert status == 409
    assert message.startswith(
        'Operation cannot be fulfilled on pods "p2": Precondition failed: UID in precondition: '
        "nope, UID in object meta: "
    )
    assert await bind_error("ghost", {"target": {"name": "node-a"}}) == (
        404,
        'pods "ghost" not found',
    )
    # binding is POST only
    answer = await run(
        urllib3.request, "GET", f"{sim.server.url}/api/v1/namespaces/ns1/pods/p2/binding"
    )
    assert answer.status == 405
    assert sim.server.calls.get("create", "pods/binding") == 7


async def test_pod_updates_and_status(sim: Sim) -> None:
    await run(sim.core.create_namespaced_pod, "ns1", pod("p1"))
    # spec.nodeName is set through pods/binding only, as on a real server
    with pytest.raises(ApiException) as refused:
        await run(sim.core.patch_namespaced_pod, "p1", "ns1", {"spec": {"nodeName": "n1"}})
    assert refused.value.status == 422
    assert status_of(refused.value)["message"].startswith(
        'Pod "p1" is invalid: spec: Forbidden: pod updates may not change fields other than '
    )
    current = await run(sim.core.read_namespaced_pod, "p1", "ns1")
    current.metadata.labels = {"app": "demo"}
    replaced = await run(sim.core.replace_namespaced_pod, "p1", "ns1", current)
    assert replaced.metadata.labels == {"app": "demo"}
    # a stale resourceVersion is a conflict
    with pytest.raises(ApiException) as info:
        await run(sim.core.replace_namespaced_pod, "p1", "ns1", current)
    assert info.value.status == 409
    # status through /status only: the main resource keeps the stored status
    replaced.status.phase = "Running"
    running = await run(sim.core.replace_namespaced_pod_status, "p1", "ns1", replaced)
    assert running.status.phase == "Running"
    running.status.phase = "Failed"
    running.metadata.labels = {"app": "changed"}
    again = await run(sim.core.replace_namespaced_pod, "p1", "ns1", running)
    assert (again.status.phase, again.metadata.labels) == ("Running", {"app": "changed"})
    succeeded = await run(
        sim.core.patch_namespaced_pod_status, "p1", "ns1", {"status": {"phase": "Succeeded"}}
    )
    assert succeeded.status.phase == "Succeeded"
    on_n1 = await run(sim.core.list_namespaced_pod, "ns1", field_selector="status.phase=Succeeded")
    assert [p.metadata.name for p in on_n1.items] == ["p1"]
    await run(sim.core.delete_namespaced_pod, "p1", "ns1")
    assert (await run(sim.core.list_namespaced_pod, "ns1")).items == []


# -- resource claims ---------------------------------------------------------------------------


async def test_claims_list_and_watch_all_namespaces_and_one(sim: Sim) -> None:
    await run(sim.resource.create_namespaced_resource_claim, "ns1", claim("c1"))
    await run(sim.resource.create_namespaced_resource_claim, "ns2", claim("c2"))
    one = await run(sim.resource.list_namespaced_resource_claim, "ns2")
    assert [c.metadata.name for c in one.items] == ["c2"]
    every = await run(sim.resource.list_resource_claim_for_all_namespaces)
    assert [c.metadata.name for c in every.items] == ["c1", "c2"]

    def changes() -> None:
        sim.server.patch(
            "resourceclaims",
            "c1",
            {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}},
            "ns1",
            subresource="status",
        )
        sim.server.create("resourceclaims", claim("c3"), "ns2")
        sim.server.delete("resourceclaims", "c1", "ns1")

    # kubernetes 37's Watch guesses the item model "V1ResourceClaim", which that client
    # calls ResourceV1ResourceClaim: name it, or use dracpu.k8s.watch.watch_once.
    all_ns = Watching(
        sim.resource.list_resource_claim_for_all_namespaces,
        return_type=CLAIM_MODEL,
        **WATCH_FROM_NOW,
    )
    assert await all_ns.collect(5, changes) == [
        ("ADDED", "ns1/c1"),
        ("ADDED", "ns2/c2"),
        ("MODIFIED", "ns1/c1"),
        ("ADDED", "ns2/c3"),
        ("DELETED", "ns1/c1"),
    ]

    def more() -> None:
        sim.server.create("resourceclaims", claim("c4"), "ns1")
        sim.server.delete("resourceclaims", "c2", "ns2")

    in_ns2 = Watching(
        sim.resource.list_namespaced_resource_claim,
        "ns2",
        return_type=CLAIM_MODEL,
        **WATCH_FROM_NOW,
    )
    assert await in_ns2.collect(3, more) == [
        ("ADDED", "ns2/c2"),
        ("ADDED", "ns2/c3"),
        ("DELETED", "ns2/c2"),
    ]


ALLOCATION = allocation(device_result("cpudev000"), node="node-a")


async def test_claim_status_update_and_patch_by_a_scheduler(sim: Sim) -> None:
    created = await sim.kube.call_raw(
        sim.resource.create_namespaced_resource_claim, "ns1", claim("c1")
    )
    body = json.loads(created)
    # status on create is dropped; it is written through /status only
    body["status"] = {
        "allocation": ALLOCATION,
        "reservedFor": [{"resource": "pods", "name": "p1", "uid": "uid-p1"}],
    }
    written = json.loads(
        await sim.kube.call_raw(
            sim.resource.replace_namespaced_resource_claim_status, "c1", "ns1", body
        )
    )
    assert written["status"] == body["status"]
    assert written["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]
    # the same update again, at the old version: conflict
    with pytest.raises(ApiException) as info:
        await run(
            sim.resource.replace_namespaced_resource_claim_status,
            "c1",
            "ns1",
            body,
            _preload_content=False,
        )
    assert info.value.status == 409
    # the main resource cannot change the status
    written["status"] = {}
    written["metadata"]["labels"] = {"a": "b"}
    main = json.loads(
        await sim.kube.call_raw(
            sim.resource.replace_namespaced_resource_claim, "c1", "ns1", written
        )
    )
    assert main["status"]["allocation"] == ALLOCATION
    # the pod is gone: the scheduler empties reservedFor, then deallocates
    unreserved = await run(
        sim.resource.patch_namespaced_resource_claim_status,
        "c1",
        "ns1",
        {"status": {"reservedFor": None}},
    )
    assert unreserved.status.reserved_for is None
    assert unreserved.status.allocation.devices.results[0].device == "cpudev000"
    freed = await run(
        sim.resource.patch_namespaced_resource_claim_status,
        "c1",
        "ns1",
        [{"op": "remove", "path": "/status/allocation"}],
    )
    assert freed.status is None or freed.status.allocation is None
    with pytest.raises(ApiException) as missing:
        await run(
            sim.resource.patch_namespaced_resource_claim_status, "nope", "ns1", {"status": {}}
        )
    assert missing.value.status == 404


async def test_claim_delete_with_finalizer(sim: Sim) -> None:
    body = claim("c1")
    body["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    await run(sim.resource.create_namespaced_resource_claim, "ns1", body)
    pending = await run(sim.resource.delete_namespaced_resource_claim, "c1", "ns1")
    assert pending.metadata.deletion_timestamp is not None
    still = await run(sim.resource.read_namespaced_resource_claim, "c1", "ns1")
    assert still.metadata.finalizers == ["resource.kubernetes.io/delete-protection"]
    await run(
        sim.resource.patch_namespaced_resource_claim,
        "c1",
        "ns1",
        [{"op": "remove", "path": "/metadata/finalizers"}],
    )
    with pytest.raises(ApiException) as info:
        await run(sim.resource.read_namespaced_resource_claim, "c1", "ns1")
    assert info.value.status == 404


# -- device classes ----------------------------------------------------------------------------


async def test_device_classes_create_get_list_delete(sim: Sim) -> None:
    for name, label in (("dra.cpu", "cpu"), ("gpu.example.com", "gpu")):
        await run(
            sim.resource.create_device_class,
            {
                "metadata": {"name": name, "labels": {"kind": label}},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{name}"'}}]},
            },
        )
    got = await run(sim.resource.read_device_class, "dra.cpu")
    assert got.spec.selectors[0].cel.expression == 'device.driver == "dra.cpu"'
    listed = await run(sim.resource.list_device_class)
    assert [c.metadata.name for c in listed.items] == ["dra.cpu", "gpu.example.com"]
    cpus = await run(sim.resource.list_device_class, label_selector="kind=cpu")
    assert [c.metadata.name for c in cpus.items] == ["dra.cpu"]
    with pytest.raises(ApiException) as dup:
        await run(sim.resource.create_device_class, {"metadata": {"name": "dra.cpu"}, "spec": {}})
    assert dup.value.status == 409
    assert status_of(dup.value)["message"] == (
        'deviceclasses.resource.k8s.io "dra.cpu" already exists'
    )
    await run(sim.resource.delete_device_class, "gpu.example.com")
    left = await run(sim.resource.list_device_class)
    assert [c.metadata.name for c in left.items] == ["dra.cpu"]


# -- dracpu.k8s.watch on pods ------------------------------------------------------------------


async def test_watch_once_delivers_pod_events_in_order(sim: Sim) -> None:
    first = await run(sim.core.create_namespaced_pod, "ns1", pod("a"))
    seen: list[WatchEvent] = []
    got_two = trio.Event()

    def on_event(event: WatchEvent) -> None:
        seen.append(event)
        if len(seen) == 2:
            got_two.set()

    stream = WatchStream()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            partial(
                watch_once,
                sim.kube,
                sim.core.list_namespaced_pod,
                "ns1",
                on_event=on_event,
                resource_version=first.metadata.resource_version,
                timeout_seconds=None,
                stream=stream,
            )
        )
        while sim.server.store.watcher_count == 0:
            await trio.testing.wait_all_tasks_blocked()
            await trio.to_thread.run_sync(lambda: None)
        sim.server.create("pods", pod("b"), "ns1")
        sim.server.delete("pods", "a", "ns1")
        await got_two.wait()
        nursery.cancel_scope.cancel()
    assert [(e.type, e.namespace, e.name) for e in seen] == [
        ("ADDED", "ns1", "b"),
        ("DELETED", "ns1", "a"),
    ]
    assert json.loads(seen[0].object)["spec"]["containers"][0]["image"] == "pause"
    # cancelled from Trio: the thread leaves its blocking read at once
    assert await trio.to_thread.run_sync(stream.exited.wait, 10)


async def test_watch_once_ends_with_the_server_timeout(
    autojump_clock: trio.testing.MockClock, sim: Sim
) -> None:
    sim.server.connections.max_watch_seconds = 30
    count = await watch_once(
        sim.kube,
        sim.core.list_pod_for_all_namespaces,
        on_event=lambda e: None,
        resource_version=None,
        timeout_seconds=1,
    )
    assert count == 0


async def test_watch_once_errors(sim: Sim) -> None:
    sim.server.create("pods", pod("a"), "ns1")
    sim.server.create("pods", pod("b"), "ns1")
    sim.server.store.compact()
    with pytest.raises(Gone) as gone:
        await watch_once(
            sim.kube,
            sim.core.list_namespaced_pod,
            "ns1",
            on_event=lambda e: None,
            resource_version="1",
            timeout_seconds=5,
        )
    assert str(gone.value) == "too old resource version: 1 (3)"
    sim.server.faults.inject("watch", "pods", 1, status=500)
    with pytest.raises(K8sError) as failed:
        await watch_once(
            sim.kube,
            sim.core.list_namespaced_pod,
            "ns1",
            on_event=lambda e: None,
            resource_version=None,
            timeout_seconds=5,
        )
    assert (failed.value.status, str(failed.value)) == (
        500,
        "Internal error occurred: injected fault",
    )


def test_decode_watch_lines() -> None:
    line = b'{"type":"ADDED","object":{"metadata":{"name":"s","resourceVersion":"7"}}}'
    assert _decode(line, "pods") == WatchEvent("ADDED", "s", "", "7", line[25:-1])
    with pytest.raises(Gone, match=r"^too old$"):
        _decode(b'{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}', "x")
    with pytest.raises(K8sError, match=r"^watch pods: boom$") as other:
        _decode(b'{"type":"ERROR","object":{"kind":"Status","code":500,"message":"boom"}}', "pods")
    assert other.value.status == 500
    with pytest.raises(K8sError, match=r"^watch pods: unknown event type 'NOPE'$"):
        _decode(b'{"type":"NOPE","object":{}}', "pods")
    with pytest.raises(K8sError, match=r"^watch pods: bad event: "):
        _decode(b"not json", "pods")


def test_stream_cancel_before_attach_closes_the_late_response() -> None:
    closed = threading.Event()

    class Response:
        def close(self) -> None:
            closed.set()

    stream = WatchStream()
    stream.cancel()
    assert stream.attach(Response()) is False
    assert closed.is_set()
