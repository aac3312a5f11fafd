"""The simulated API server's fleet-scale faults: a rate limit answered 429 with
Retry-After, a request log that tells clients apart by User-Agent, and a restart (down,
connections closed, watch history forgotten, back on the same port)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from dracpu.k8s.client import ConnectionFailed, Gone, KubeClient, TooManyRequests
from dracpu.k8s.watch import watch_once
from dracpu_sim.apiserver import SimAPIServer
from dracpu_sim.apiserver.faults import RateLimit

SELECTOR = "spec.nodeName=node-a"


def a_slice(name: str, node: str = "node-a") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "dra.cpu",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "cpu0"}],
        },
    }


@pytest.fixture
async def served(
    nursery: trio.Nursery, tmp_path: Path
) -> AsyncIterator[tuple[SimAPIServer, KubeClient]]:
    server = SimAPIServer(seed=9)
    await nursery.start(server.serve)
    kube = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    kube.api_client.user_agent = "dracpu/test (node-a)"
    yield server, kube
    kube.close()


def test_rate_limit_is_a_token_bucket() -> None:
    limit = RateLimit(rate=2.0, burst=3.0)
    assert [limit.admit(0.0) for _ in range(4)] == [True, True, True, False]
    assert limit.admit(0.4) is False  # 0.8 of a token back
    assert limit.admit(0.5) is True  # one whole token
    assert [limit.admit(10.0) for _ in range(4)] == [True, True, True, False]  # capped at burst
    assert limit.rejected == 3
    with pytest.raises(ValueError, match="rate limit needs rate > 0 and burst >= 1"):
        SimAPIServer().faults.limit_rate(0, burst=1)


async def test_over_the_rate_limit_is_429_with_retry_after(
    served: tuple[SimAPIServer, KubeClient],
) -> None:
    server, kube = served
    now = [100.0]
    server.handler.clock = lambda: now[0]
    server.faults.limit_rate(1.0, burst=2.0, retry_after=3)
    for _ in range(2):
        await kube.call_raw(kube.resource.list_resource_slice)
    with pytest.raises(TooManyRequests) as info:
        await kube.call_raw(kube.resource.list_resource_slice)
    assert (info.value.status, info.value.retry_after) == (429, 3.0)
    assert str(info.value) == "Too many requests, please try again later."
    now[0] += 1.0
    await kube.call_raw(kube.resource.list_resource_slice)
    server.faults.clear()
    for _ in range(5):
        await kube.call_raw(kube.resource.list_resource_slice)


async def test_request_log_has_verb_agent_status_and_size(
    served: tuple[SimAPIServer, KubeClient],
) -> None:
    server, kube = served
    log = server.log_requests()
    assert server.log_requests() is log
    await kube.call_raw(kube.resource.create_resource_slice, a_slice("s1"))
    server.faults.inject("get", "resourceslices", 1, status=503)
    with pytest.raises(Exception, match="unable to handle"):
        await kube.call_raw(kube.resource.read_resource_slice, "s1")
    listed = await kube.call_raw(kube.resource.list_resource_slice, field_selector=SELECTOR)
    assert [(r.verb, r.resource, r.user_agent, r.status) for r in log.records] == [
        ("create", "resourceslices", "dracpu/test (node-a)", 201),
        ("get", "resourceslices", "dracpu/test (node-a)", 503),
        ("list", "resourceslices", "dracpu/test (node-a)", 200),
    ]
    assert log.records[2].size == len(listed)
    assert log.since(log.records[1].time) == log.records[1:]
    assert len(log) == 3


async def test_restart_closes_everything_and_forgets_watch_history(
    nursery: trio.Nursery, served: tuple[SimAPIServer, KubeClient]
) -> None:
    server, kube = served
    await kube.call_raw(kube.resource.create_resource_slice, a_slice("s1"))
    await kube.call_raw(kube.resource.create_resource_slice, a_slice("s2"))
    seen: list[str] = []
    done = trio.Event()

    async def watch() -> None:
        try:
            await watch_once(
                kube,
                kube.resource.list_resource_slice,
                on_event=lambda e: seen.append(e.type),
                resource_version="1",
                timeout_seconds=None,
                field_selector=SELECTOR,
            )
        except ConnectionFailed:
            seen.append("broken")
        done.set()

    nursery.start_soon(watch)
    while not server.connections.watches:
        await trio.sleep(0.01)
    watch_agents = {w.start.user_agent for w in server.connections.watches}
    assert watch_agents == {"dracpu/test (node-a)"}
    rv = server.store.rv
    port = server.port
    server.stop()
    with trio.fail_after(10):
        await done.wait()
    assert seen == ["ADDED", "broken"]  # s2, then the connection closed
    assert (server.restarts, server.store.compacted_rv) == (1, rv)
    with pytest.raises(ConnectionFailed):
        await kube.call_raw(kube.resource.list_resource_slice)
    await nursery.start(lambda task_status: server.serve(port=port or 0, task_status=task_status))
    assert server.port == port
    # the objects survived (etcd did); a watch from before the restart is too old
    assert [s["metadata"]["name"] for s in server.list("resourceslices")] == ["s1", "s2"]
    with pytest.raises(Gone):
        await watch_once(
            kube,
            kube.resource.list_resource_slice,
            on_event=lambda e: None,
            resource_version="1",
            timeout_seconds=1,
            field_selector=SELECTOR,
        )
