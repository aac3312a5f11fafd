"""The loopback API server as the official ``kubernetes`` client and kubectl see it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
import trio.testing
from builders import allocation, device_class, device_result, resource_claim
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from dracpu.k8s.client import (
    Conflict,
    ConnectionFailed,
    Gone,
    Invalid,
    KubeClient,
    NotFound,
    ServerError,
    TooManyRequests,
    load_api_client,
)
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


@pytest.fixture
async def sim(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Sim]:
    server = SimAPIServer(seed=3)
    await nursery.start(server.serve)
    sim = Sim(server, server.write_kubeconfig(tmp_path / "kubeconfig"))
    yield sim
    sim.api_client.close()


def slice_body(name: str | None = None, node: str = "node-a", devices: int = 2) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name} if name else {"generateName": f"{node}-dra.cpu-"}
    meta["labels"] = {"node": node}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": "dra.cpu",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"cpudev{i:03d}",
                    "attributes": {"numaNode": {"int": 0}},
                    "capacity": {"dra.cpu/cpu": {"value": "1"}},
                }
                for i in range(devices)
            ],
        },
    }


def status_of(exc: ApiException) -> dict[str, Any]:
    import json

    return json.loads(exc.body)  # type: ignore[no-any-return]


async def test_kubeconfig_and_discovery(sim: Sim) -> None:
    text = sim.kubeconfig.read_text()
    assert f"server: {sim.server.url}" in text
    assert sim.kubeconfig.stat().st_mode & 0o777 == 0o600
    version = await run(k8s.VersionApi(sim.api_client).get_code)
    assert (version.major, version.minor) == ("1", "34")
    resources = await run(sim.resource.get_api_resources)
    assert [r.name for r in resources.resources] == [
        "resourceslices",
        "resourceclaims",
        "resourceclaims/status",
        "resourceclaimtemplates",
        "deviceclasses",
    ]


async def test_resource_slice_crud(sim: Sim) -> None:
    created = await run(sim.resource.create_resource_slice, slice_body())
    name = created.metadata.name
    assert re.fullmatch(r"node-a-dra\.cpu-[bcdfghjklmnpqrstvwxz2456789]{5}", name)
    assert created.metadata.resource_version == "1"
    assert created.metadata.generation == 1
    assert created.spec.devices[1].name == "cpudev001"
    got = await run(sim.resource.read_resource_slice, name)
    assert got.metadata.uid == created.metadata.uid
    got.spec.pool.generation = 2
    replaced = await run(sim.resource.replace_resource_slice, name, got)
    assert (replaced.metadata.generation, replaced.metadata.resource_version) == (2, "2")
    patched = await run(
        sim.resource.patch_resource_slice, name, {"metadata": {"labels": {"extra": "yes"}}}
    )
    assert patched.metadata.labels == {"node": "node-a", "extra": "yes"}
    deleted = await run(sim.resource.delete_resource_slice, name)
    assert deleted.metadata.name == name
    with pytest.raises(ApiException) as info:
        await run(sim.resource.read_resource_slice, name)
    assert info.value.status == 404
    assert status_of(info.value)["message"] == (
        f'resourceslices.resource.k8s.io "{name}" not found'
    )


async def test_field_and_label_selectors(sim: Sim) -> None:
    for node in ("node-a", "node-b", "node-a"):
        await run(sim.resource.create_resource_slice, slice_body(node=node))
    on_a = await run(sim.resource.list_resource_slice, field_selector="spec.nodeName=node-a")
    assert [s.spec.node_name for s in on_a.items] == ["node-a", "node-a"]
    both = await run(
        sim.resource.list_resource_slice,
        field_selector="spec.driver=dra.cpu,spec.pool.name!=node-a",
    )
    assert [s.spec.node_name for s in both.items] == ["node-b"]
    labelled = await run(sim.resource.list_resource_slice, label_selector="node in (node-b)")
    assert [s.metadata.labels["node"] for s in labelled.items] == ["node-b"]
    assert on_a.metadata.resource_version == "3"
    with pytest.raises(ApiException) as info:
        await run(sim.resource.list_resource_slice, field_selector="spec.bogus=x")
    assert info.value.status == 400
    assert status_of(info.value)["message"] == "field label not supported: spec.bogus"


async def test_conflict_on_stale_resource_version(sim: Sim) -> None:
    first = await run(sim.resource.create_resource_slice, slice_body("s1"))
    await run(sim.resource.patch_resource_slice, "s1", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(ApiException) as info:
        await run(sim.resource.replace_resource_slice, "s1", first)
    assert info.value.status == 409
    assert status_of(info.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Operation cannot be fulfilled on resourceslices.resource.k8s.io "s1": '
        "the object has been modified; please apply your changes to the latest version and "
        "try again",
        "reason": "Conflict",
        "details": {"name": "s1", "group": "resource.k8s.io", "kind": "resourceslices"},
        "code": 409,
    }


async def test_invalid_slice_is_422(sim: Sim) -> None:
    with pytest.raises(ApiException) as info:
        await run(sim.resource.create_resource_slice, slice_body("s1", devices=129))
    assert info.value.status == 422
    body = status_of(info.value)
    assert body["message"] == (
        'ResourceSlice.resource.k8s.io "s1" is invalid: spec.devices: Too many: 129: must '
        "have at most 128 items"
    )
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueTooMany",
            "message": "Too many: 129: must have at most 128 items",
            "field": "spec.devices",
        }
    ]


async def test_claims_pods_nodes_deviceclasses(sim: Sim) -> None:
    claim = await run(
        sim.resource.create_namespaced_resource_claim,
        "ns1",
        resource_claim("c1", namespace=None),
    )
    assert claim.metadata.namespace == "ns1"
    status = {"status": {"allocation": allocation(device_result("cpudev000"))}}
    patched = await run(sim.resource.patch_namespaced_resource_claim_status, "c1", "ns1", status)
    assert patched.status.allocation.devices.results[0].device == "cpudev000"
    listed = await run(sim.resource.list_resource_claim_for_all_namespaces)
    assert [c.metadata.name for c in listed.items] == ["c1"]
    await run(sim.resource.create_device_class, device_class())
    dc = await run(sim.resource.read_device_class, "dra.cpu")
    assert dc.spec.selectors[0].cel.expression == 'device.driver == "dra.cpu"'
    node = await run(sim.core.create_node, {"metadata": {"name": "node-a"}})
    assert (await run(sim.core.read_node, "node-a")).metadata.uid == node.metadata.uid
    await run(
        sim.core.create_namespaced_pod,
        "ns1",
        {
            "metadata": {"name": "p1"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "i"}]},
        },
    )
    pods = await run(sim.core.list_pod_for_all_namespaces, field_selector="spec.nodeName=node-a")
    assert [(p.metadata.name, p.status.phase) for p in pods.items] == [("p1", "Pending")]
    await run(sim.core.patch_namespaced_pod_status, "p1", "ns1", {"status": {"phase": "Running"}})
    assert (await run(sim.core.read_namespaced_pod, "p1", "ns1")).status.phase == "Running"
    deleted = await run(sim.core.delete_namespaced_pod, "p1", "ns1")
    assert deleted.metadata.name == "p1"
    gone = await run(sim.core.delete_node, "node-a")
    assert gone["status"] == "Success"


async def test_watch_stream_events(sim: Sim) -> None:
    await run(sim.resource.create_resource_slice, slice_body("s1"))
    events: list[tuple[str, str, str]] = []
    watcher = k8s_watch.Watch()
    started = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def consume() -> None:
        for event in watcher.stream(
            sim.resource.list_resource_slice, resource_version="0", timeout_seconds=30
        ):
            obj = event["object"]
            events.append((event["type"], obj.metadata.name, obj.metadata.resource_version))
            if len(events) == 1:
                trio.from_thread.run_sync(started.set, trio_token=token)
            if event["type"] == "DELETED":
                watcher.stop()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(trio.to_thread.run_sync, consume, abandon_on_cancel=True))
        await started.wait()
        sim.server.patch("resourceslices", "s1", {"metadata": {"labels": {"a": "b"}}})
        sim.server.create("resourceslices", slice_body("s2"))
        sim.server.delete("resourceslices", "s1")
    assert events == [
        ("ADDED", "s1", "1"),
        ("MODIFIED", "s1", "2"),
        ("ADDED", "s2", "3"),
        ("DELETED", "s1", "4"),
    ]
    # The server notices the client closing the stream and drops its watcher.
    await trio.testing.wait_all_tasks_blocked()
    assert sim.server.store.watcher_count == 0


async def test_watch_bookmarks_and_timeout(
    autojump_clock: trio.testing.MockClock, sim: Sim
) -> None:
    def consume() -> list[str]:
        seen = []
        for event in k8s_watch.Watch().stream(
            sim.resource.list_resource_slice,
            allow_watch_bookmarks=True,
            timeout_seconds=1,
            send_initial_events=True,
            resource_version_match="NotOlderThan",
        ):
            seen.append(event["type"])
        return seen

    sim.server.create("resourceslices", slice_body("s1"))
    # The stream ends by itself when the server's timeoutSeconds is up.
    assert await trio.to_thread.run_sync(consume) == ["ADDED", "BOOKMARK"]


async def test_watch_too_old_version_is_410(sim: Sim) -> None:
    for i in range(3):
        sim.server.create("resourceslices", slice_body(f"s{i}"))
    sim.server.store.compact()

    def consume() -> None:
        for _ in k8s_watch.Watch().stream(
            sim.resource.list_resource_slice, resource_version="1", timeout_seconds=5
        ):
            pass

    with pytest.raises(ApiException) as info:
        await trio.to_thread.run_sync(consume)
    assert info.value.status == 410
    assert info.value.reason == "Expired: too old resource version: 1 (4)"
    with pytest.raises(ApiException) as listed:
        await run(
            sim.resource.list_resource_slice, resource_version="1", resource_version_match="Exact"
        )
    assert listed.value.status == 410
    assert status_of(listed.value)["message"] == (
        "The resourceVersion for the provided list is too old."
    )


async def test_fault_500_and_counters(sim: Sim) -> None:
    sim.server.faults.inject("list", "resourceslices", 1, status=500)
    with pytest.raises(ApiException) as info:
        await run(sim.resource.list_resource_slice)
    assert info.value.status == 500
    assert status_of(info.value)["message"] == "Internal error occurred: injected fault"
    assert (await run(sim.resource.list_resource_slice)).items == []
    assert sim.server.calls.get("list", "resourceslices") == 2


async def test_dropped_connection_seen_by_client(sim: Sim) -> None:
    # urllib3 retries an idempotent GET three times after a dropped connection, so it
    # takes four drops before the caller sees the failure.
    kube = KubeClient(sim.api_client)
    sim.server.faults.inject("get", "nodes", 4, drop_connection=True)
    with pytest.raises(ConnectionFailed) as info:
        await kube.call(kube.core.read_node, "node-a")
    assert str(info.value).startswith("connection to the API server failed: ")
    assert sim.server.calls.get("get", "nodes") == 4
    sim.server.faults.inject("get", "nodes", 1, drop_connection=True)
    with pytest.raises(NotFound):
        await kube.call(kube.core.read_node, "node-a")
    assert sim.server.calls.get("get", "nodes") == 6


async def test_kube_client_error_classes(sim: Sim) -> None:
    kube = KubeClient(sim.api_client)
    with pytest.raises(NotFound) as not_found:
        await kube.call(kube.resource.read_resource_slice, "nope")
    assert (str(not_found.value), not_found.value.status, not_found.value.reason) == (
        'resourceslices.resource.k8s.io "nope" not found',
        404,
        "NotFound",
    )
    await kube.call(kube.resource.create_resource_slice, slice_body("s1"))
    with pytest.raises(Conflict) as exists:
        await kube.call(kube.resource.create_resource_slice, slice_body("s1"))
    assert exists.value.reason == "AlreadyExists"
    with pytest.raises(Invalid):
        await kube.call(kube.resource.create_resource_slice, slice_body("s2", devices=200))
    # urllib3 itself retries a 429 that carries Retry-After; without retries the
    # caller sees it.
    no_retries = KubeClient(load_api_client(str(sim.kubeconfig), retries=0))
    sim.server.faults.inject("list", "resourceslices", 1, status=429)
    with pytest.raises(TooManyRequests) as throttled:
        await no_retries.call(no_retries.resource.list_resource_slice)
    assert throttled.value.retry_after == 1.0
    no_retries.close()
    sim.server.faults.inject("delete", "resourceslices", 1, status=503)
    with pytest.raises(ServerError) as unavailable:
        await kube.call(kube.resource.delete_resource_slice, "s1")
    assert str(unavailable.value) == "the server is currently unable to handle the request"
    sim.server.create("resourceslices", slice_body("s3"))
    sim.server.store.compact()
    with pytest.raises(Gone):
        await kube.call(
            kube.resource.list_resource_slice, resource_version="1", resource_version_match="Exact"
        )
    raw = await kube.call_raw(kube.resource.read_resource_slice, "s1")
    assert b'"name":"s1"' in raw


async def test_connection_refused_is_connection_failed(tmp_path: Path) -> None:
    from dracpu_sim.apiserver import write_kubeconfig

    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{port}")
    kube = KubeClient(load_api_client(str(kubeconfig), retries=0))
    with pytest.raises(ConnectionFailed):
        await kube.call(kube.core.read_node, "x")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
async def test_kubectl_get_resourceslices(sim: Sim, tmp_path: Path) -> None:
    sim.server.create("resourceslices", slice_body("node-a-dra.cpu-abcde"))
    env = {**os.environ, "HOME": str(tmp_path), "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    result = await trio.to_thread.run_sync(
        partial(
            subprocess.run,
            [
                "kubectl",
                "--kubeconfig",
                str(sim.kubeconfig),
                "--cache-dir",
                str(tmp_path / "cache"),
                "get",
                "resourceslices",
                "-o",
                "name",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
    )
    assert (result.returncode, result.stdout) == (
        0,
        "resourceslice.resource.k8s.io/node-a-dra.cpu-abcde\n",
    ), result.stderr
    table = await trio.to_thread.run_sync(
        partial(
            subprocess.run,
            [
                "kubectl",
                "--kubeconfig",
                str(sim.kubeconfig),
                "--cache-dir",
                str(tmp_path / "cache"),
                "get",
                "resourceslices",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
    )
    assert table.stdout.splitlines()[0].split() == ["NAME", "AGE"]
    assert table.stdout.splitlines()[1].split()[0] == "node-a-dra.cpu-abcde"


async def test_main_apiserver_writes_kubeconfig_and_prints_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dracpu_sim.apiserver import main_apiserver

    kubeconfig = tmp_path / "kc"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(main_apiserver, 0, str(kubeconfig))
        await trio.testing.wait_all_tasks_blocked()
        url = capsys.readouterr().out.strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
        assert f"server: {url}" in kubeconfig.read_text()
        api_client = load_api_client(str(kubeconfig))
        assert (await run(k8s.VersionApi(api_client).get_code)).git_version == "v1.34.0+dracpu-sim"
        api_client.close()
        nursery.cancel_scope.cancel()
