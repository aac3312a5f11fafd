"""Pod sandboxes: NRI reports them (RunPodSandbox, StopPodSandbox, RemovePodSandbox, their
StateChange forms, Synchronize's pods); dracpu keeps each one's cgroup on the shared pool."""

from __future__ import annotations

import pytest
from builders import cs, nri_container, nri_pod

from dracpu.allocation.store import AllocationStore, ClaimRecord
from dracpu.messages import ContainerIntent
from dracpu.nri.handlers import EVENT_MASK, PluginHandlers
from dracpu.nri.plugin import NRIPlugin
from dracpu.proto.nri import api_pb2
from dracpu.state import NodeState

SYSTEMD_PATH = "kubepods-burstable-podp1.slice:cri-containerd:sb-p1"


def sandbox(uid: str, path: str | None = None) -> api_pb2.PodSandbox:
    pod = nri_pod(uid)
    pod.linux.cgroups_path = f"/kubepods/burstable/pod{uid}/sb-{uid}" if path is None else path
    pod.linux.cgroup_parent = f"/kubepods/burstable/pod{uid}"
    return pod


def handlers() -> tuple[NodeState, PluginHandlers]:
    state = NodeState(AllocationStore(cs("0-7"), cs(""), floor=cs("0")))
    return state, PluginHandlers(NRIPlugin(state))


def by_id(intents: list[ContainerIntent]) -> dict[str, tuple[str, bool]]:
    return {i.container_id: (i.cpus, i.sandbox) for i in intents}


def test_the_plugin_subscribes_to_the_three_sandbox_events() -> None:
    for event in (api_pb2.RUN_POD_SANDBOX, api_pb2.STOP_POD_SANDBOX, api_pb2.REMOVE_POD_SANDBOX):
        assert EVENT_MASK & (1 << (event - 1))
    assert EVENT_MASK == 0x060F


def test_run_pod_sandbox_keeps_it_on_the_pool_and_asks_for_verification() -> None:
    state, h = handlers()
    state.restore([ClaimRecord(uid="A", cpus=cs("4-7"))])
    request = api_pb2.RunPodSandboxRequest(pod=sandbox("p1", SYSTEMD_PATH))
    assert h.handle("RunPodSandbox", request.SerializeToString()) == b""
    assert h.applied == [
        ContainerIntent(
            container_id="sb-p1",
            cgroups_path=SYSTEMD_PATH,
            cpus="0-3",
            pod_uid="p1",
            sandbox=True,
        )
    ]
    assert by_id(h.plugin.intents()) == {"sb-p1": ("0-3", True)}
    assert by_id(h.plugin.sandbox_intents()) == {"sb-p1": ("0-3", True)}
    # Never an NRI update: the runtime has none for a sandbox.
    assert h.plugin.shared_pool_updates() == []


@pytest.mark.parametrize("method", ["StopPodSandbox", "RemovePodSandbox"])
def test_stop_or_remove_forgets_the_sandbox(method: str) -> None:
    state, h = handlers()
    h.handle("RunPodSandbox", api_pb2.RunPodSandboxRequest(pod=sandbox("p1")).SerializeToString())
    request = getattr(api_pb2, f"{method}Request")(pod=sandbox("p1"))
    assert h.handle(method, request.SerializeToString()) == b""
    assert state.view.sandbox_ids() == []
    assert h.plugin.intents() == []
    # Idempotent: the second of Stop and Remove finds nothing.
    h.handle(method, request.SerializeToString())


def test_older_runtimes_deliver_sandbox_events_through_state_change() -> None:
    state, h = handlers()
    run = api_pb2.StateChangeEvent(event=api_pb2.RUN_POD_SANDBOX, pod=sandbox("p1"))
    assert h.handle("StateChange", run.SerializeToString()) == b""
    assert [i.container_id for i in h.applied] == ["sb-p1"]
    assert set(state.view.sandbox_ids()) == {"sb-p1"}
    stop = api_pb2.StateChangeEvent(event=api_pb2.STOP_POD_SANDBOX, pod=sandbox("p1"))
    h.handle("StateChange", stop.SerializeToString())
    assert state.view.sandbox_ids() == []


def test_a_sandbox_without_a_cgroups_path_is_left_alone() -> None:
    state, h = handlers()
    h.handle("RunPodSandbox", api_pb2.RunPodSandboxRequest(pod=nri_pod("p1")).SerializeToString())
    assert h.applied == []
    assert state.view.sandbox_ids() == []


def test_synchronize_takes_the_pods_as_sandboxes_and_verifies_them() -> None:
    state, h = handlers()
    h.handle("RunPodSandbox", api_pb2.RunPodSandboxRequest(pod=sandbox("old")).SerializeToString())
    request = api_pb2.SynchronizeRequest(
        pods=[sandbox("p1"), sandbox("p2"), nri_pod("p3")],
        containers=[nri_container("p1", "c1")],
    )
    pending = h.sync_chunk(request.SerializeToString())
    assert pending is not None
    reply = api_pb2.SynchronizeResponse.FromString(h.finish_sync(pending, {}))
    # Sandboxes get no NRI update; the shared container does.
    assert [u.container_id for u in reply.update] == ["c1"]
    # The runtime's list replaces what was known; p3 reported no cgroups path.
    assert set(state.view.sandbox_ids()) == {"sb-p1", "sb-p2"}
    # Verified once the reply is out: the update (a runtime may drop it) and the sandboxes.
    assert by_id(h.applied) == {
        "c1": ("0-7", False),
        "sb-p1": ("0-7", True),
        "sb-p2": ("0-7", True),
    }


def test_sandboxes_follow_the_pool_in_the_intents() -> None:
    state, h = handlers()
    h.handle("RunPodSandbox", api_pb2.RunPodSandboxRequest(pod=sandbox("p1")).SerializeToString())
    state.restore([ClaimRecord(uid="A", cpus=cs("1-6"))])
    assert by_id(h.plugin.sandbox_intents()) == {"sb-p1": ("0,7", True)}
