"""The simulated kubelet: real gRPC (grpcio) against a fake plugin on unix sockets, the
loopback API server through the real ``kubernetes`` client, and an in-memory runtime."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import builders
import pytest
import trio
import trio.testing
from builders import DRIVER, NODE, allocation, device_result, resource_claim
from test_kubelet_harness import FakePlugin

from dracpu.k8s.client import KubeClient
from dracpu_sim.apiserver import SimAPIServer, tables
from dracpu_sim.kubelet import Backoff, MemoryRuntime, SimKubelet
from dracpu_sim.kubelet.runtime import ContainerRuntimeError

# The container of the pods that name none: ``main``, with one environment variable.
MAIN = {"name": "main", "image": "busybox", "env": [{"name": "GREETING", "value": "hi"}]}


@pytest.fixture
def root(short_tmp: str) -> str:
    """The kubelet root: the test's short temp dir (the plugins' sockets go below it)."""
    return short_tmp


class Node:
    """API server + kubelet + runtime + plugin, sharing one timeline of calls."""

    def __init__(self, server: SimAPIServer, api: KubeClient, root: str, cdi_dir: str) -> None:
        self.server = server
        self.api = api
        self.root = root
        self.cdi_dir = cdi_dir
        self.timeline: list[tuple[str, ...]] = []
        self.runtime = TimelineRuntime(self.timeline)
        self.kubelet = SimKubelet(root, api, self.runtime, NODE, cdi_dir=cdi_dir)
        self.plugins: list[FakePlugin] = []

    def plugin(self, *, dra: bool = True, **kwargs: Any) -> FakePlugin:
        plugin = FakePlugin(self.root, self.cdi_dir, timeline=self.timeline, **kwargs)
        self.plugins.append(plugin)
        return plugin.start(dra=dra)

    def claim(self, name: str) -> dict[str, Any]:
        return self.server.create("resourceclaims", resource_claim(name))

    def allocate(self, claim: dict[str, Any], *pods: dict[str, Any]) -> dict[str, Any]:
        """What the scheduler would write: one result on this node, reserved for ``pods``."""
        claim = self.server.get("resourceclaims", claim["metadata"]["name"], "default")
        claim["status"] = {
            "allocation": allocation(device_result("cpudevnuma000", 4, share_id="s-1"), node=NODE),
            "reservedFor": [
                {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
                for p in pods
            ],
        }
        return self.server.update("resourceclaims", claim, subresource="status")

    def pod(
        self, name: str, *claims: str, containers: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """A pod bound to this node; its one container ``main`` uses every claim, unless
        ``containers`` replaces it."""
        body = builders.pod(name, *claims, node=NODE, container=MAIN)
        if containers is not None:
            body["spec"]["containers"] = containers
        return self.server.create("pods", body)

    def pod_with_claim(self, pod: str, claim: str) -> tuple[dict[str, Any], dict[str, Any]]:
        c = self.claim(claim)
        p = self.pod(pod, claim)
        return p, self.allocate(c, p)

    def state(self, pod: dict[str, Any]) -> Any:
        return self.kubelet.pods[pod["metadata"]["uid"]]

    def stop(self) -> None:
        for plugin in self.plugins:
            plugin.stop()


class TimelineRuntime(MemoryRuntime):
    def __init__(self, timeline: list[tuple[str, ...]]) -> None:
        super().__init__()
        self.timeline = timeline
        self.fail_create = 0

    async def run_pod_sandbox(
        self, pod_uid: str, namespace: str, name: str, qos: str = "burstable"
    ) -> None:
        self.timeline.append(("run_pod_sandbox", name))
        await super().run_pod_sandbox(pod_uid, namespace, name, qos)

    async def create_container(self, pod_uid: str, name: str, env: list[str]) -> str:
        if self.fail_create:
            self.fail_create -= 1
            raise ContainerRuntimeError("image pull failed")
        cid = await super().create_container(pod_uid, name, env)
        self.timeline.append(("create_container", name, cid))
        return cid

    async def stop_container(self, container_id: str) -> None:
        self.timeline.append(("stop_container", container_id))
        await super().stop_container(container_id)

    async def remove_container(self, container_id: str) -> None:
        self.timeline.append(("remove_container", container_id))
        await super().remove_container(container_id)

    async def remove_pod_sandbox(self, pod_uid: str) -> None:
        self.timeline.append(("remove_pod_sandbox", pod_uid))
        await super().remove_pod_sandbox(pod_uid)


async def make_node(nursery: trio.Nursery, tmp_path: Path, root: str, **server_kwargs: Any) -> Node:
    server = SimAPIServer(seed=2, **server_kwargs)
    await nursery.start(server.serve)
    api = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    return Node(server, api, root, str(tmp_path / "cdi"))


@pytest.fixture
async def node(nursery: trio.Nursery, tmp_path: Path, root: str) -> AsyncIterator[Node]:
    n = await make_node(nursery, tmp_path, root)
    yield n
    n.stop()
    n.api.close()


# -- registration ------------------------------------------------------------------------------


async def test_registration_accepted(node: Node) -> None:
    plugin = node.plugin()
    await node.kubelet.sync_plugins()
    registered = node.kubelet.plugins[DRIVER]
    assert (registered.endpoint, registered.service, registered.socket) == (
        plugin.dra_socket,
        "v1.DRAPlugin",
        plugin.registration_socket,
    )
    assert plugin.notifications == [(True, "")]
    [event] = node.kubelet.registrations
    assert (event.accepted, event.plugin, event.message) == (
        True,
        DRIVER,
        f"registered, using v1.DRAPlugin at {plugin.dra_socket}",
    )
    # Nothing new on the next pass: no second registration.
    await node.kubelet.sync_plugins()
    assert plugin.get_info_calls == 1


async def test_the_plugins_order_picks_the_service(node: Node) -> None:
    node.plugin(versions=("v1alpha1.DRAResourceHealth", "v1beta1.DRAPlugin", "v1.DRAPlugin"))
    await node.kubelet.sync_plugins()
    assert node.kubelet.plugins[DRIVER].service == "v1beta1.DRAPlugin"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"plugin_type": "CSIPlugin"},
            "no handler registered for plugin type: CSIPlugin at socket {reg}",
        ),
        (
            {"versions": ()},
            "invalid versions of plugin dra.cpu: empty list of supported gRPC services "
            "(aka supported versions)",
        ),
        (
            {"versions": ("v1alpha3.Node", "v1alpha1.DRAResourceHealth")},
            "invalid versions of plugin dra.cpu: none of the supported gRPC services "
            "['v1alpha3.Node', 'v1alpha1.DRAResourceHealth'] is supported by the kubelet "
            "(['v1.DRAPlugin', 'v1beta1.DRAPlugin'])",
        ),
        (
            {"endpoint": "/tmp/elsewhere.sock"},
            "invalid endpoint '/tmp/elsewhere.sock' of plugin dra.cpu: not inside the kubelet "
            "root directory {root}",
        ),
        (
            {"endpoint": "plugins/dra.cpu/dra.sock"},
            "invalid endpoint 'plugins/dra.cpu/dra.sock' of plugin dra.cpu: not absolute",
        ),
        (
            {"endpoint": "{root}/plugins/dra.cpu/missing.sock"},
            "invalid endpoint '{root}/plugins/dra.cpu/missing.sock' of plugin dra.cpu: "
            "No such file or directory",
        ),
        (
            {"endpoint": "{root}/plugins_registry"},
            "invalid endpoint '{root}/plugins_registry' of plugin dra.cpu: not a socket",
        ),
        (
            {"name": "DRA_CPU"},
            "invalid DRA driver name 'DRA_CPU': must be a lower case DNS subdomain of at most "
            "63 characters",
        ),
    ],
)
async def test_registration_rejected(node: Node, kwargs: dict[str, Any], message: str) -> None:
    if isinstance(kwargs.get("endpoint"), str):
        kwargs = kwargs | {"endpoint": kwargs["endpoint"].format(root=node.root)}
    plugin = node.plugin(**kwargs)
    await node.kubelet.sync_plugins()
    expected = message.format(root=node.root, reg=plugin.registration_socket)
    assert plugin.notifications == [(False, expected)]
    assert node.kubelet.plugins == {}
    [event] = node.kubelet.registrations
    assert (event.accepted, event.message) == (False, expected)


async def test_a_second_socket_for_the_same_endpoint_is_rejected(node: Node) -> None:
    first = node.plugin()
    await node.kubelet.sync_plugins()
    twin = node.plugin(registration_name="twin-reg.sock", endpoint=first.dra_socket, dra=False)
    await node.kubelet.sync_plugins()
    assert twin.notifications == [
        (False, f"endpoint {first.dra_socket} of plugin dra.cpu is already registered")
    ]
    assert node.kubelet.plugins[DRIVER].socket == first.registration_socket


async def test_dot_files_and_non_sockets_are_ignored(node: Node) -> None:
    registry = Path(node.root, "plugins_registry")
    registry.mkdir(parents=True, exist_ok=True)
    (registry / "notes.sock").write_text("not a socket")
    plugin = node.plugin()
    os.rename(plugin.registration_socket, registry / ".hidden-reg.sock")
    await node.kubelet.sync_plugins()
    assert node.kubelet.registrations == []
    assert plugin.get_info_calls == 0


async def test_rejected_plugin_is_retried_with_backoff(
    node: Node, autojump_clock: trio.testing.MockClock
) -> None:
    plugin = node.plugin(plugin_type="CSIPlugin")
    times: list[float] = []
    for _ in range(12):
        before = plugin.get_info_calls
        await node.kubelet.sync_plugins()
        if plugin.get_info_calls > before:
            times.append(trio.current_time())
        await trio.sleep(0.5)
    # Rejected at once, then again 1 s later, then 2 s after that (Backoff defaults).
    start = times[0]
    assert [t - start for t in times] == [0.0, 1.0, 3.0]
    assert all(not accepted for accepted, _ in plugin.notifications)


async def test_a_dead_registration_socket_is_a_clear_error(node: Node) -> None:
    registry = Path(node.root, "plugins_registry")
    registry.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(registry / "stale-reg.sock"))  # the file exists, nobody listens
    stale.close()
    kubelet = SimKubelet(node.root, node.api, node.runtime, NODE, dial_timeout=0.3)
    await kubelet.sync_plugins()
    [event] = kubelet.registrations
    assert not event.accepted
    assert event.message == (
        f"failed to dial socket {registry / 'stale-reg.sock'}: no connection within 0.3s"
    )


async def test_connection_monitor_drops_a_plugin_after_two_failed_checks(node: Node) -> None:
    plugin = node.plugin()
    await node.kubelet.sync_plugins()
    await node.kubelet.monitor_plugins()
    assert DRIVER in node.kubelet.plugins
    plugin.fail_get_info = True
    await node.kubelet.monitor_plugins()
    assert node.kubelet.plugins[DRIVER].monitor_failures == 1  # one miss is forgiven
    await node.kubelet.monitor_plugins()
    assert DRIVER not in node.kubelet.plugins
    assert node.kubelet.registrations[-1].message == (
        "deregistered: connection monitor: failed to get plugin info using RPC GetInfo at "
        f"socket {plugin.registration_socket}: UNAVAILABLE: wedged"
    )


async def test_run_checks_registered_plugins_periodically(
    node: Node, nursery: trio.Nursery
) -> None:
    # Real time: the checks are gRPC calls in threads, and an autojumping clock races far
    # ahead while they run.
    kubelet = SimKubelet(
        node.root,
        node.api,
        node.runtime,
        NODE,
        cdi_dir=node.cdi_dir,
        plugin_poll_interval=0.01,
        monitor_interval=0.2,
    )
    plugin = node.plugin()
    await nursery.start(kubelet.run)
    with trio.fail_after(10):
        while DRIVER not in kubelet.plugins:
            await trio.sleep(0.01)
    registered_at = trio.current_time()
    plugin.fail_get_info = True
    with trio.fail_after(10):
        while DRIVER in kubelet.plugins:
            await trio.sleep(0.01)
    assert trio.current_time() - registered_at >= 0.2  # two checks, one interval apart
    assert kubelet.registrations[-1].message.startswith("deregistered: connection monitor")


async def test_connection_monitor_drops_a_plugin_whose_answer_changed(node: Node) -> None:
    plugin = node.plugin()
    await node.kubelet.sync_plugins()
    plugin.endpoint = os.path.join(node.root, "plugins", "other.sock")
    await node.kubelet.monitor_plugins()
    assert DRIVER not in node.kubelet.plugins
    assert node.kubelet.registrations[-1].message == (
        f"deregistered: connection monitor: GetInfo now answers dra.cpu at {plugin.endpoint}"
    )


def add_slice(node: Node, node_name: str = NODE, driver: str = DRIVER) -> None:
    node.server.create(
        "resourceslices",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"generateName": f"{node_name}-{driver}-"},
            "spec": {
                "driver": driver,
                "nodeName": node_name,
                "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
                "devices": [],
            },
        },
    )


def slice_owners(node: Node) -> list[tuple[str, str]]:
    return sorted(
        (s["spec"]["nodeName"], s["spec"]["driver"]) for s in node.server.list("resourceslices")
    )


async def test_start_wipes_this_nodes_slices(node: Node, nursery: trio.Nursery) -> None:
    add_slice(node)
    add_slice(node, driver="gpu.example.com")
    add_slice(node, node_name="node-b")
    kubelet = SimKubelet(node.root, node.api, node.runtime, NODE, wipe_slices=True)
    await nursery.start(kubelet.run)
    assert slice_owners(node) == [("node-b", DRIVER)]


async def test_slices_go_after_the_grace_period_unless_the_driver_returns(
    node: Node, autojump_clock: trio.testing.MockClock
) -> None:
    kubelet = SimKubelet(
        node.root, node.api, node.runtime, NODE, cdi_dir=node.cdi_dir, wipe_slices=True
    )
    plugin = node.plugin()
    await kubelet.sync_plugins()
    add_slice(node)
    add_slice(node, driver="gpu.example.com")
    # The driver restarts within the grace period: nothing is deleted.
    plugin.stop()
    await kubelet.sync_plugins()
    await trio.sleep(10)
    plugin = node.plugin()
    await kubelet.sync_plugins()
    await trio.sleep(30)
    await kubelet.sync_plugins()
    assert slice_owners(node) == [(NODE, DRIVER), (NODE, "gpu.example.com")]
    # The driver stays away: its slices (only its own) go 30 s later.
    plugin.stop()
    await kubelet.sync_plugins()
    await trio.sleep(29)
    await kubelet.sync_plugins()
    assert len(slice_owners(node)) == 2
    await trio.sleep(1)
    await kubelet.sync_plugins()
    assert slice_owners(node) == [(NODE, "gpu.example.com")]


# -- pods --------------------------------------------------------------------------------------


async def test_prepare_then_containers_get_the_cdi_env(node: Node) -> None:
    plugin = node.plugin()
    await node.kubelet.sync_plugins()
    pod, claim = node.pod_with_claim("web", "c1")
    uid = claim["metadata"]["uid"]
    await node.kubelet.sync_pods()

    assert plugin.prepare_calls == [[("default", "c1", uid)]]
    assert plugin.packages_called == ["v1"]
    st = node.state(pod)
    assert st.phase == "Running"
    assert st.errors == []
    [container] = st.containers.values()
    assert container.env == ["GREETING=hi", f"DRA_CPUSET_{uid}=0-3"]
    assert node.runtime.containers[container.id].env == container.env
    assert node.timeline == [
        ("prepare", uid),
        ("run_pod_sandbox", "web"),
        ("create_container", "main", container.id),
    ]
    status = node.server.get("pods", "web", "default")["status"]
    assert status["phase"] == "Running"
    assert status["containerStatuses"][0]["containerID"] == f"sim://{container.id}"
    # Running pods are left alone.
    await node.kubelet.sync_pods()
    assert len(plugin.prepare_calls) == 1
    snap = node.kubelet.snapshot()
    assert snap["pods"]["default/web"] == {
        "uid": pod["metadata"]["uid"],
        "phase": "Running",
        "claims": ["default/c1"],
        "containers": {"main": {"id": container.id, "env": container.env, "running": True}},
        "errors": [],
    }
    assert snap["prepared_claims"] == {"default/c1": {"uid": uid, "pods": [pod["metadata"]["uid"]]}}
    assert snap["plugins"] == {
        DRIVER: {
            "endpoint": plugin.dra_socket,
            "service": "v1.DRAPlugin",
            "socket": plugin.registration_socket,
        }
    }
    assert node.kubelet.pod("default", "web") is st
    assert node.kubelet.pod("default", "nope") is None


async def test_a_v1beta1_only_plugin_is_called_on_v1beta1(node: Node) -> None:
    plugin = node.plugin(versions=("v1beta1.DRAPlugin",))
    await node.kubelet.sync_plugins()
    pod, claim = node.pod_with_claim("web", "c1")
    await node.kubelet.sync_pods()
    assert node.state(pod).phase == "Running"
    node.server.delete("pods", "web", "default")
    await node.kubelet.sync_pods()
    assert plugin.packages_called == ["v1beta1", "v1beta1"]
    assert plugin.unprepare_calls == [[("default", "c1", claim["metadata"]["uid"])]]


async def test_only_containers_that_list_the_claim_get_its_env(node: Node) -> None:
    node.plugin()
    await node.kubelet.sync_plugins()
    claim = node.claim("c1")
    pod = node.pod(
        "two",
        "c1",
        containers=[
            {"name": "app", "resources": {"claims": [{"name": "rc0", "request": "cpus"}]}},
            {"name": "sidecar", "env": [{"name": "X", "valueFrom": {"fieldRef": {}}}]},
        ],
    )
    uid = node.allocate(claim, pod)["metadata"]["uid"]
    await node.kubelet.sync_pods()
    st = node.state(pod)
    assert {n: c.env for n, c in st.containers.items()} == {
        "app": [f"DRA_CPUSET_{uid}=0-3"],
        "sidecar": [],
    }


async def test_pod_without_claims_runs_without_any_plugin(node: Node) -> None:
    pod = node.pod("plain")
    await node.kubelet.sync_pods()
    assert node.state(pod).phase == "Running"
    assert node.state(pod).containers["main"].env == ["GREETING=hi"]


async def test_pod_deletion_stops_and_removes_then_unprepares(node: Node) -> None:
    plugin = node.plugin()
    await node.kubelet.sync_plugins()
    pod, claim = node.pod_with_claim("web", "c1")
    uid = claim["metadata"]["uid"]
    await node.kubelet.sync_pods()
    cid = node.state(pod).containers["main"].id
    assert Path(node.cdi_dir, f"dra.k8s.io-cpu_claim-{uid}.json").exists()

    node.server.delete("pods", "web", "default")
    await node.kubelet.sync_pods()
    assert node.timeline[3:] == [
        ("stop_container", cid),
        ("remove_container", cid),
        ("remove_pod_sandbox", pod["metadata"]["uid"]),
        ("unprepare", uid),
    ]
    assert plugin.unprepare_calls == [[("default", "c1", uid)]]
    assert node.state(pod).phase == "Terminated"
    assert node.kubelet.prepared == {}
    assert node.runtime.containers == {} and node.runtime.sandboxes == {}


async def test_graceful_deletion_is_finished_by_the_kubelet(
    nursery: trio.Nursery, tmp_path: Path, root: str
) -> None:
    node = await make_node(nursery, tmp_path, root, graceful_pod_deletion=True)
    try:
        plugin = node.plugin()
        await node.kubelet.sync_plugins()
        pod, claim = node.pod_with_claim("web", "c1")
        await node.kubelet.sync_pods()
        node.server.delete("pods", "web", "default")
        assert node.server.get("pods", "web", "default")["metadata"]["deletionTimestamp"]
        await node.kubelet.sync_pods()
        assert plugin.unprepare_calls == [[("default", "c1", claim["metadata"]["uid"])]]
        assert node.server.list("pods", "default") == []
        assert node.state(pod).phase == "Terminated"
    finally:
        node.stop()
        node.api.close()


async def test_a_claim_shared_by_two_pods_is_unprepared_after_the_last(node: Node) -> None:
    plugin = node.plugin()
    await node.kubelet.sync_plugins()
    claim = node.claim("shared")
    a, b = node.pod("a", "shared"), node.pod("b", "shared")
    node.allocate(claim, a, b)
    await node.kubelet.sync_pods()
    assert len(plugin.prepare_calls) == 1  # prepared once, used twice
    assert node.state(a).phase == node.state(b).phase == "Running"
    node.server.delete("pods", "a", "default")
    await node.kubelet.sync_pods()
    assert plugin.unprepare_calls == []
    node.server.delete("pods", "b", "default")
    await node.kubelet.sync_pods()
    assert plugin.unprepare_calls == [[("default", "shared", claim["metadata"]["uid"])]]


async def test_prepare_error_is_recorded_and_retried_with_backoff(
    node: Node, autojump_clock: trio.testing.MockClock
) -> None:
    failures = iter(["no CPUs left", "no CPUs left"])
    plugin = node.plugin(prepare_error=lambda uid: next(failures, ""))
    await node.kubelet.sync_plugins()
    pod, _ = node.pod_with_claim("web", "c1")
    attempts: list[float] = []
    for _ in range(40):
        before = len(plugin.prepare_calls)
        await node.kubelet.sync_pods()
        if len(plugin.prepare_calls) > before:
            attempts.append(trio.current_time())
        if node.state(pod).phase == "Running":
            break
        assert node.server.get("pods", "web", "default").get("status", {}).get("phase") != "Running"
        await trio.sleep(0.25)
    st = node.state(pod)
    assert st.phase == "Running"
    assert [m for _, m in st.errors] == [
        "prepare dynamic resources: NodePrepareResources failed for claim default/c1: no CPUs left"
    ] * 2
    # Backoff(initial=1): retried 1 s after the first failure, 2 s after the second.
    assert [t - attempts[0] for t in attempts] == [0.0, 1.0, 3.0]
    assert node.runtime.containers[st.containers["main"].id].env[-1].startswith("DRA_CPUSET_")


async def test_unregistered_driver_waits_and_starts_after_registration(node: Node) -> None:
    pod, _ = node.pod_with_claim("web", "c1")
    await node.kubelet.sync_pods()
    st = node.state(pod)
    assert st.phase == "Pending"
    assert st.last_error == "prepare dynamic resources: DRA driver dra.cpu is not registered"
    node.plugin()
    await node.kubelet.sync_plugins()  # registration clears the pod's backoff
    await node.kubelet.sync_pods()
    assert st.phase == "Running"


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"abort_prepare": "driver exploded"},
            "prepare dynamic resources: driver dra.cpu: NodePrepareResources failed: "
            "rpc error: code = INTERNAL desc = driver exploded",
        ),
        (
            {"omit_claims": True},
            "prepare dynamic resources: driver dra.cpu: NodePrepareResources: left out 1 claims",
        ),
        (
            {"write_specs": False},
            "container 'main': CDI: failed to find CDI device \"claim-{uid}\"",
        ),
    ],
)
async def test_bad_prepare_answers_leave_the_pod_pending(
    node: Node, kwargs: dict[str, Any], expected: str
) -> None:
    node.plugin(**kwargs)
    await node.kubelet.sync_plugins()
    pod, claim = node.pod_with_claim("web", "c1")
    await node.kubelet.sync_pods()
    st = node.state(pod)
    message = expected.format(uid=claim["metadata"]["uid"])
    assert st.phase == "Pending"
    assert st.last_error == message
    assert node.runtime.sandboxes == {}
    status = node.server.get("pods", "web", "default")["status"]
    assert status == {
        "phase": "Pending",
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "FailedPrepareDynamicResources",
                "message": message,
            }
        ],
        # As `kubectl get pods` shows it on a cluster: STATUS ContainerCreating.
        "containerStatuses": [
            {
                "name": "main",
                "image": status["containerStatuses"][0]["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"waiting": {"reason": "ContainerCreating"}},
            }
        ],
    }
    assert tables.pod_cells(node.server.get("pods", "web", "default"), 0)[1:3] == [
        "0/1",
        "ContainerCreating",
    ]


async def test_claims_not_allocated_or_not_reserved(node: Node) -> None:
    node.plugin()
    await node.kubelet.sync_plugins()
    node.claim("raw")
    lonely = node.pod("lonely", "raw")
    other = node.pod("other")
    claim = node.claim("theirs")
    stranger = node.pod("stranger", "theirs")
    node.allocate(claim, other)
    ghost = node.pod("ghost", "missing")
    await node.kubelet.sync_pods()
    assert node.state(lonely).last_error == "resourceclaim default/raw is not allocated"
    assert node.state(stranger).last_error == (
        "resourceclaim default/theirs is not reserved for the pod"
    )
    assert node.state(ghost).last_error == "resourceclaim default/missing not found"


async def test_runtime_failure_is_retried(
    node: Node, autojump_clock: trio.testing.MockClock
) -> None:
    node.plugin()
    await node.kubelet.sync_plugins()
    pod, _ = node.pod_with_claim("web", "c1")
    node.runtime.fail_create = 1
    await node.kubelet.sync_pods()
    st = node.state(pod)
    assert (st.phase, st.last_error) == ("Pending", "runtime: image pull failed")
    assert node.runtime.sandboxes == {}  # the half-started pod was cleaned up
    await trio.sleep(1.0)
    await node.kubelet.sync_pods()
    assert st.phase == "Running"
    # The claim was prepared once; the retry only started containers.
    assert len(node.plugins[0].prepare_calls) == 1


async def test_unprepare_failure_is_retried(
    node: Node, autojump_clock: trio.testing.MockClock
) -> None:
    failures = iter(["busy"])
    plugin = node.plugin(unprepare_error=lambda uid: next(failures, ""))
    await node.kubelet.sync_plugins()
    pod, claim = node.pod_with_claim("web", "c1")
    await node.kubelet.sync_pods()
    node.server.delete("pods", "web", "default")
    await node.kubelet.sync_pods()
    st = node.state(pod)
    assert st.phase == "Terminating"
    assert st.last_error == (
        "unprepare dynamic resources: NodeUnprepareResources failed for claim default/c1: busy"
    )
    await node.kubelet.sync_pods()  # within the backoff: no new call
    assert len(plugin.unprepare_calls) == 1
    await trio.sleep(1.0)
    await node.kubelet.sync_pods()
    assert st.phase == "Terminated"
    assert len(plugin.unprepare_calls) == 2
    assert claim["metadata"]["uid"] not in node.kubelet.prepared


# -- plugin restarts ---------------------------------------------------------------------------


async def test_plugin_restart_reregisters_without_preparing_again(node: Node) -> None:
    first = node.plugin()
    await node.kubelet.sync_plugins()
    pod, claim = node.pod_with_claim("web", "c1")
    await node.kubelet.sync_pods()
    first.stop()  # the driver restarts: both sockets go away ...
    await node.kubelet.sync_plugins()
    assert DRIVER not in node.kubelet.plugins
    second = node.plugin()  # ... and come back
    await node.kubelet.sync_plugins()
    assert [(e.accepted, e.message.split(",")[0]) for e in node.kubelet.registrations] == [
        (True, "registered"),
        (True, "deregistered: registration socket removed"),
        (True, "registered"),
    ]
    await node.kubelet.sync_pods()
    assert second.prepare_calls == []  # the kubelet remembers the claim is prepared
    node.server.delete("pods", "web", "default")
    await node.kubelet.sync_pods()
    assert second.unprepare_calls == [[("default", "c1", claim["metadata"]["uid"])]]
    assert node.state(pod).phase == "Terminated"


async def test_unprepare_waits_for_the_driver_to_come_back(
    node: Node, autojump_clock: trio.testing.MockClock
) -> None:
    first = node.plugin()
    await node.kubelet.sync_plugins()
    pod, claim = node.pod_with_claim("web", "c1")
    await node.kubelet.sync_pods()
    first.stop()  # the driver is down while the pod goes
    await node.kubelet.sync_plugins()
    node.server.delete("pods", "web", "default")
    for _ in range(4):  # failures push the retry out to 1, 2, 4, 8 s
        await node.kubelet.sync_pods()
        await trio.sleep(1)
    st = node.state(pod)
    assert st.phase == "Terminating"
    assert st.last_error == "unprepare dynamic resources: DRA driver dra.cpu is not registered"
    assert node.runtime.containers == {}  # the containers went at once
    second = node.plugin()
    await node.kubelet.sync_plugins()  # registration cuts the backoff short
    await node.kubelet.sync_pods()
    assert st.phase == "Terminated"
    assert second.unprepare_calls == [[("default", "c1", claim["metadata"]["uid"])]]


async def test_socket_recreated_in_place_is_registered_again(node: Node) -> None:
    plugin = node.plugin()
    await node.kubelet.sync_plugins()
    plugin.stop()
    node.plugin()
    # Both changes land between two passes: deregister + register in one pass.
    await node.kubelet.sync_plugins()
    assert [e.message.split(",")[0] for e in node.kubelet.registrations] == [
        "registered",
        "deregistered: registration socket removed",
        "registered",
    ]
    assert DRIVER in node.kubelet.plugins


async def test_run_registers_and_starts_pods(node: Node, nursery: trio.Nursery) -> None:
    kubelet = SimKubelet(
        node.root,
        node.api,
        node.runtime,
        NODE,
        cdi_dir=node.cdi_dir,
        plugin_poll_interval=0.02,
        pod_poll_interval=0.02,
        backoff=Backoff(initial=0.05, maximum=0.1),
    )
    await nursery.start(kubelet.run)
    pod, claim = node.pod_with_claim("web", "c1")
    node.plugin()
    with trio.fail_after(10):
        while (
            kubelet.pods.get(pod["metadata"]["uid"]) is None
            or kubelet.pods[pod["metadata"]["uid"]].phase != "Running"
        ):
            await trio.sleep(0.02)
    env = kubelet.pods[pod["metadata"]["uid"]].containers["main"].env
    assert env[-1] == f"DRA_CPUSET_{claim['metadata']['uid']}=0-3"


async def test_the_runtime_simulator_behind_the_adapter(
    nursery: trio.Nursery, tmp_path: Path, root: str
) -> None:
    from dracpu_sim.kubelet import PodRuntimeAdapter
    from dracpu_sim.runtime import RuntimeSimulator

    node = await make_node(nursery, tmp_path, root)
    try:
        simulator = RuntimeSimulator(str(tmp_path / "nri.sock"), str(tmp_path / "cgroup"))
        node.kubelet.runtime = PodRuntimeAdapter(simulator)
        node.plugin()
        await node.kubelet.sync_plugins()
        pod, claim = node.pod_with_claim("web", "c1")
        await node.kubelet.sync_pods()
        [container] = simulator.containers
        assert container.env == ["GREETING=hi", f"DRA_CPUSET_{claim['metadata']['uid']}=0-3"]
        assert container.pod_uid == pod["metadata"]["uid"]
        node.server.delete("pods", "web", "default")
        await node.kubelet.sync_pods()
        assert simulator.containers == []
        assert node.state(pod).phase == "Terminated"
    finally:
        node.stop()
        node.api.close()


def test_call_on_a_channel_closed_by_a_new_registration_is_a_call_error() -> None:
    """A daemon restart closes the old channel while a prepare may wait for its thread:
    that is a failed call (retried with backoff), not a crash of the kubelet."""
    import grpc

    from dracpu_sim.kubelet import dra as sim_dra

    channel = grpc.insecure_channel("unix:/tmp/dracpu-closed-channel.sock")
    channel.close()
    with pytest.raises(sim_dra.DRACallError) as info:
        sim_dra.unprepare(channel, "v1.DRAPlugin", [sim_dra.ClaimRef("default", "c", "u")])
    assert str(info.value) == (
        "NodeUnprepareResources failed: Cannot invoke RPC on closed channel!"
    )
