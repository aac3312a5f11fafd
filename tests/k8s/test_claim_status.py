"""dracpu's entries in ResourceClaim status.devices: the pure body builders
(dracpu.k8s.claim_status_body) and the writer service (dracpu.k8s.claim_status) taking the
owner's claim events against a scripted API (the owner's events reaching it through a real
prepare are in tests/kubelet/test_dra_claim_status_hook.py, the simulated API server's side
in tests/sim/test_apiserver_claim_status.py)."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from builders import cs, grid
from prometheus_client import CollectorRegistry

from dracpu.k8s.claim_status import ClaimStatusWriter
from dracpu.k8s.claim_status_body import (
    APPLY_PATCH,
    DATA_MAX_BYTES,
    FIELD_MANAGER,
    apply_body,
    decode_answer,
    device_data,
    entry_keys,
    removal_body,
    wanted_keys,
)
from dracpu.k8s.client import Invalid, K8sError, NotFound, ServerError
from dracpu.messages import ClaimDevice, ClaimEvent, ClaimPrepared, ClaimUnprepared
from dracpu.metrics import DriverMetrics

# One socket, two NUMA nodes of two 2-thread cores: core g holds CPUs g and g+4;
# NUMA 0 is CPUs 0,1,4,5 and NUMA 1 is CPUs 2,3,6,7.
TOPO = grid(1, 2, 2, threads=2)
SINCE = datetime(2026, 12, 3, 15, 0, 0, tzinfo=UTC)
UID = "11111111-2222-3333-4444-555555555555"


def prepared(cpus: str = "0,4", *devices: str, uid: str = UID, **kw: Any) -> ClaimPrepared:
    return ClaimPrepared(
        uid=uid,
        namespace="default",
        name="pinned",
        cpus=cpus,
        devices=tuple(ClaimDevice(pool="node-1", device=d) for d in devices or ("cpudev000",)),
        **kw,
    )


# -- the pure part ----------------------------------------------------------------------


def test_data_holds_the_cpuset_numa_nodes_and_whether_cores_are_whole() -> None:
    assert device_data(cs("0,4"), TOPO) == {
        "cpuset": "0,4",
        "cpuCount": 2,
        "numaNodes": "0",
        "fullCores": True,
        "sharedPoolAccess": False,
    }
    # CPU 2 without its sibling 6: a core shared with someone else; two NUMA nodes.
    data = device_data(cs("0-2,4-5"), TOPO, shared_pool_access=True)
    assert data["cpuset"] == "0-2,4-5"
    assert data["numaNodes"] == "0-1"
    assert data["fullCores"] is False
    assert data["sharedPoolAccess"] is True


def test_data_without_a_topology_has_only_the_cpus() -> None:
    assert device_data(cs("3"), None) == {"cpuset": "3", "cpuCount": 1, "sharedPoolAccess": False}


def test_data_never_exceeds_the_api_limit() -> None:
    # Every other CPU of 8192: the list alone is ~24 KiB, more than the 10 KiB allowed.
    scattered = cs(",".join(str(c) for c in range(0, 8192, 2)))
    data = device_data(scattered, None)
    assert "cpuset" not in data
    assert data["cpuCount"] == 4096
    assert len(msgspec.json.encode(data)) <= DATA_MAX_BYTES


def test_apply_body_has_one_ready_entry_per_device() -> None:
    change = prepared("0,4", "cpudev000", "cpudev004")
    body = apply_body(change, topology=TOPO, node_name="node-1", since=SINCE)
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert body["kind"] == "ResourceClaim"
    assert body["metadata"] == {"name": "pinned", "namespace": "default", "uid": UID}
    entries = body["status"]["devices"]
    assert [(e["driver"], e["pool"], e["device"]) for e in entries] == [
        ("dra.cpu", "node-1", "cpudev000"),
        ("dra.cpu", "node-1", "cpudev004"),
    ]
    for entry in entries:
        assert "shareID" not in entry
        assert entry["data"]["cpuset"] == "0,4"
        assert entry["conditions"] == [
            {
                "type": "Ready",
                "status": "True",
                "reason": "CPUsAssigned",
                "message": "2 exclusive CPUs 0,4 on node node-1",
                "lastTransitionTime": "2026-12-03T15:00:00Z",
            }
        ]


def test_apply_body_names_the_share_of_a_shared_device() -> None:
    share = "6a1b0f0e-8d39-4f6e-9c38-2f4a0a1b2c3d"
    change = ClaimPrepared(
        uid=UID,
        namespace="ns",
        name="c",
        cpus="2",
        devices=(ClaimDevice(pool="node-1", device="cpudevnuma001", share_id=share),),
    )
    body = apply_body(change, topology=TOPO, node_name="", since=SINCE)
    (entry,) = body["status"]["devices"]
    assert entry["shareID"] == share
    assert entry["conditions"][0]["message"] == "1 exclusive CPU 2"


def test_removal_body_applies_nothing_to_that_claim_only() -> None:
    assert removal_body("ns", "c", UID) == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": UID},
    }


def test_a_prepared_change_with_a_bad_cpuset_is_refused_by_the_builder() -> None:
    with pytest.raises(ValueError):
        apply_body(prepared("0-"), topology=TOPO, node_name="n", since=SINCE)


def test_the_answer_is_read_for_the_uid_and_our_entries_only() -> None:
    share = "6a1b0f0e-8d39-4f6e-9c38-2f4a0a1b2c3d"
    raw = json.dumps(
        {
            "metadata": {"uid": UID},
            "status": {
                "devices": [
                    {"driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0"},
                    {"driver": "dra.cpu", "pool": "node-1", "device": "cpudev000"},
                    {"driver": "dra.cpu", "pool": "node-1", "device": "d1", "shareID": share},
                    "not an entry",
                ]
            },
        }
    ).encode()
    answer = decode_answer(raw)
    assert answer.metadata["uid"] == UID
    assert entry_keys(answer.status["devices"]) == {
        ("node-1", "cpudev000", ""),
        ("node-1", "d1", share),
    }
    change = ClaimPrepared(
        uid=UID,
        namespace="default",
        name="pinned",
        cpus="0",
        devices=(ClaimDevice(pool="node-1", device="d1", share_id=share),),
    )
    assert wanted_keys(change) <= entry_keys(answer.status["devices"])
    # What does not decode, or holds no list, shows no UID and no entries.
    assert decode_answer(b"<html>502</html>").metadata == {}
    assert decode_answer(b'{"metadata": 3}').status == {}
    assert entry_keys({"driver": "dra.cpu"}) == set()


# -- the writer ---------------------------------------------------------------------------


class _Resource:
    def patch_namespaced_resource_claim_status(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("called through KubeClient.call_raw only")


Answer = bytes | Exception | Callable[[dict[str, Any]], bytes]


def echo(uid: str = UID) -> Callable[[dict[str, Any]], bytes]:
    """An API server that stores what it is given: the claim with our entries."""

    def answer(body: dict[str, Any]) -> bytes:
        return json.dumps(
            {"metadata": {"uid": uid, **body["metadata"]}, "status": body.get("status", {})}
        ).encode()

    return answer


class ScriptedKube:
    """call_raw answers from a script, get_raw (the claim read after a restart) from
    ``reads`` (404 when it runs out); every call is recorded."""

    def __init__(self, *answers: Answer, reads: tuple[bytes | Exception, ...] = ()) -> None:
        self.answers = list(answers)
        self.reads = list(reads)
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.gets: list[tuple[str, dict[str, str]]] = []
        self.resource = _Resource()

    async def get_raw(self, path: str, **params: str) -> bytes:
        self.gets.append((path, params))
        read = self.reads.pop(0) if self.reads else NotFound("not found", status=404)
        if isinstance(read, Exception):
            raise read
        return read

    async def call_raw(self, fn: Any, /, *args: Any, **kwargs: Any) -> bytes:
        self.calls.append((fn.__name__, args, kwargs))
        answer = self.answers.pop(0) if self.answers else echo()
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            return answer(args[2])
        return answer


class Owner:
    """The state owner's end of a writer's inbox (``NodeState.claim_events`` hands the
    writer the other): ``owner(event)`` publishes as the owner does, without waiting."""

    def __init__(self) -> None:
        self.send, self.inbox = trio.open_memory_channel[ClaimEvent](math.inf)

    def __call__(self, event: ClaimEvent) -> None:
        self.send.send_nowait(event)


def writer(kube: ScriptedKube, **kw: Any) -> tuple[ClaimStatusWriter, DriverMetrics, Owner]:
    metrics = DriverMetrics(CollectorRegistry())
    w = ClaimStatusWriter(
        kube,  # type: ignore[arg-type]
        node_name="node-1",
        topology=lambda: TOPO,
        count=metrics.count_claim_status_write,
        rand=lambda: 0.0,
        now=lambda: SINCE,
        **kw,
    )
    return w, metrics, Owner()


def unprepared(uid: str = UID, cpus: str = "0,4") -> ClaimUnprepared:
    return ClaimUnprepared(uid=uid, namespace="default", name="pinned", cpus=cpus)


def count(metrics: DriverMetrics, operation: str, result: str) -> float:
    return metrics.claim_status_writes.labels(operation=operation, result=result)._value.get()


async def settle(w: ClaimStatusWriter, seconds: float = 0.0) -> None:
    await trio.sleep(seconds)
    await trio.testing.wait_all_tasks_blocked()


@asynccontextmanager
async def running(w: ClaimStatusWriter, owner: Owner) -> AsyncIterator[None]:
    """The writer serving the owner's events for the length of the block, cancelled after."""
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run, owner.inbox)
        yield
        nursery.cancel_scope.cancel()


async def test_a_prepare_is_applied_with_our_field_manager(
    autojump_clock: trio.testing.MockClock,
) -> None:
    kube = ScriptedKube()
    w, metrics, owner = writer(kube)
    async with running(w, owner):
        owner(prepared())
        await settle(w)
    ((method, args, kwargs),) = kube.calls
    assert method == "patch_namespaced_resource_claim_status"
    assert args[:2] == ("pinned", "default")
    assert args[2] == apply_body(prepared(), topology=TOPO, node_name="node-1", since=SINCE)
    assert kwargs == {"field_manager": FIELD_MANAGER, "force": True, "_content_type": APPLY_PATCH}
    assert count(metrics, "apply", "success") == 1
    assert w.describe()["claims"] == {UID: "written"}


async def test_the_same_status_again_is_not_written_twice(
    autojump_clock: trio.testing.MockClock,
) -> None:
    kube = ScriptedKube()
    w, metrics, owner = writer(kube)
    async with running(w, owner):
        owner(prepared())
        await settle(w)
        owner(prepared())  # the kubelet prepares again (a retry, a restart)
        await settle(w)
    assert len(kube.calls) == 1
    assert count(metrics, "apply", "success") == 1


async def test_an_unprepare_removes_our_entries(autojump_clock: trio.testing.MockClock) -> None:
    kube = ScriptedKube()
    w, metrics, owner = writer(kube)
    async with running(w, owner):
        owner(prepared())
        await settle(w)
        owner(unprepared())
        await settle(w)
    assert [c[1][2] for c in kube.calls][1] == removal_body("default", "pinned", UID)
    assert count(metrics, "remove", "success") == 1
    assert w.describe()["claims"] == {}


async def test_a_status_never_written_is_not_taken_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    kube = ScriptedKube()
    w, _, owner = writer(kube)
    # Both arrive before the writer runs: the last word is that there is nothing to write.
    owner(prepared())
    owner(unprepared())
    async with running(w, owner):
        await settle(w)
    assert kube.calls == []


async def test_a_failed_write_is_counted_and_retried_with_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    kube = ScriptedKube(ServerError("etcd is slow", status=500), echo())
    w, metrics, owner = writer(kube, backoff_base=2.0)
    async with running(w, owner):
        start = trio.current_time()
        owner(prepared())
        await settle(w)
        assert len(kube.calls) == 1
        assert w.describe()["claims"] == {UID: "writing (retrying: etcd is slow)"}
        await settle(w, 0.9)  # rand 0 puts the first retry at half the 2 s base
        assert len(kube.calls) == 1
        await settle(w, 0.2)
    assert len(kube.calls) == 2
    assert trio.current_time() - start >= 1.0
    assert count(metrics, "apply", "error") == 1
    assert count(metrics, "apply", "success") == 1


async def test_retry_after_is_honoured(autojump_clock: trio.testing.MockClock) -> None:
    kube = ScriptedKube(ServerError("busy", status=503, retry_after=20.0), echo())
    w, _, owner = writer(kube)
    async with running(w, owner):
        owner(prepared())
        await settle(w, 19.0)
        assert len(kube.calls) == 1
        await settle(w, 2.0)
    assert len(kube.calls) == 2


async def test_an_invalid_status_is_refused_once_and_not_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    kube = ScriptedKube(Invalid("must be an allocated device in the claim", status=422))
    w, metrics, owner = writer(kube)
    async with running(w, owner):
        owner(prepared())
        await settle(w, 600.0)
    assert len(kube.calls) == 1
    assert count(metrics, "apply", "refused") == 1
    assert w.describe()["claims"] == {}


async def test_a_deleted_claim_is_gone(autojump_clock: trio.testing.MockClock) -> None:
    kube = ScriptedKube(NotFound('resourceclaims.resource.k8s.io "pinned" not found', status=404))
    w, metrics, owner = writer(kube)
    async with running(w, owner):
        owner(prepared())
        await settle(w, 600.0)
    assert len(kube.calls) == 1
    assert count(metrics, "apply", "gone") == 1


async def test_forbidden_is_said_once_and_retried_rarely(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    forbidden = K8sError("forbidden", status=403)
    kube = ScriptedKube(forbidden, forbidden, echo())
    w, metrics, owner = writer(kube, forbidden_retry=300.0)
    async with running(w, owner):
        owner(prepared())
        await settle(w, 299.0)
        assert len(kube.calls) == 1
        await settle(w, 302.0)
    assert len(kube.calls) == 3
    assert count(metrics, "apply", "refused") == 2
    assert count(metrics, "apply", "success") == 1
    said = [r for r in caplog.records if "ClusterRole" in r.getMessage()]
    assert len(said) == 1


# The 1.36 granular authorization's refusal: AuthorizedForDeviceStatus
# (pkg/registry/resource/authz.go) returns a field.Forbidden on status.devices from the
# status strategy's validation, so rest.BeforeUpdate wraps it in a 422 Invalid. The text up
# to "permission:" is authz.go's format (the verbs slice printed with %s); the rest is the
# authorizer's forbidden message for the synthetic resourceclaims/driver attributes.
GRANULAR_DENIED = Invalid(
    'ResourceClaim.resource.k8s.io "pinned" is invalid: status.devices: Forbidden: changing '
    'status.devices requires resource="resourceclaims/driver", '
    'verb="[associated-node:patch arbitrary-node:patch]" permission: '
    'resourceclaims.resource.k8s.io "dra.cpu" is forbidden: User '
    '"system:serviceaccount:dracpu:dracpu" cannot associated-node:patch resource '
    '"resourceclaims/driver" in API group "resource.k8s.io" in the namespace "default"',
    status=422,
    reason="Invalid",
)


async def test_the_granular_authorization_refusal_is_taken_as_forbidden(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    kube = ScriptedKube(GRANULAR_DENIED, GRANULAR_DENIED, echo())
    w, metrics, owner = writer(kube, forbidden_retry=300.0)
    async with running(w, owner):
        owner(prepared())
        await settle(w, 299.0)
        assert len(kube.calls) == 1
        assert "resourceclaims/driver" in w.describe()["claims"][UID]
        await settle(w, 302.0)
    assert len(kube.calls) == 3
    assert count(metrics, "apply", "refused") == 2
    assert count(metrics, "apply", "success") == 1
    said = [r for r in caplog.records if "associated-node:patch" in r.getMessage()]
    assert len(said) == 1


def test_only_those_two_422s_are_told_apart() -> None:
    from dracpu.k8s.claim_status_body import granular_authz_denied, replaced_claim

    assert replaced_claim(REPLACED.message, UID)
    assert not replaced_claim(REPLACED.message, "another-uid")
    assert granular_authz_denied(GRANULAR_DENIED.message)
    invalid = "must be an allocated device in the claim"
    assert not replaced_claim(invalid, UID) and not granular_authz_denied(invalid)
    # The binding check (status.allocation) names another synthetic subresource.
    binding = (
        "changing status.allocation or status.reservedFor requires "
        'resource="resourceclaims/binding"'
    )
    assert not granular_authz_denied(binding)


# -- after a restart ----------------------------------------------------------------------

EARLIER = datetime(2026, 12, 1, 8, 30, 0, tzinfo=UTC)


def stored_claim(change: ClaimPrepared, since: datetime, uid: str = UID) -> bytes:
    """The claim as a previous dracpu process left it: its entries written at ``since``."""
    body = apply_body(change, topology=TOPO, node_name="node-1", since=since)
    return json.dumps(
        {"metadata": {"uid": uid, "name": "pinned"}, "status": body["status"]}
    ).encode()


async def test_an_unprepare_after_a_restart_is_sent_while_the_apply_backs_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The previous process wrote the entries. After the restart the kubelet's repeated
    # prepare queues an apply that fails and backs off; the unprepare then arrives: the
    # previous process's entries must still be taken away.
    kube = ScriptedKube(ServerError("etcd is slow", status=500), echo(), reads=(b"{}",))
    w, metrics, owner = writer(kube, backoff_base=30.0)
    async with running(w, owner):
        owner(prepared(repeated=True))
        await settle(w)
        assert len(kube.calls) == 1
        owner(unprepared())
        await settle(w)
    assert [c[1][2] for c in kube.calls][1] == removal_body("default", "pinned", UID)
    assert count(metrics, "remove", "success") == 1


async def test_an_unprepare_after_a_restart_is_sent_even_before_any_write(
    autojump_clock: trio.testing.MockClock,
) -> None:
    kube = ScriptedKube()
    w, metrics, owner = writer(kube)
    owner(prepared(repeated=True))
    owner(unprepared())
    async with running(w, owner):
        await settle(w)
    assert [c[1][2] for c in kube.calls] == [removal_body("default", "pinned", UID)]
    assert count(metrics, "remove", "success") == 1


async def test_an_unprepare_after_a_failed_first_write_is_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A 500 may still have been applied: a write went out, so the removal goes too.
    kube = ScriptedKube(ServerError("timeout", status=504))
    w, _, owner = writer(kube, backoff_base=30.0)
    async with running(w, owner):
        owner(prepared())
        await settle(w)
        owner(unprepared())
        await settle(w)
    assert [c[1][2] for c in kube.calls][1] == removal_body("default", "pinned", UID)


async def test_a_restart_keeps_the_ready_time_the_claim_holds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The stored entries differ (the CPUs' NUMA view changed, here: another cpuset), so
    # the writer applies, but with the Ready time the previous process wrote.
    before = prepared("1,5")
    kube = ScriptedKube(reads=(stored_claim(before, EARLIER),))
    w, metrics, owner = writer(kube)
    async with running(w, owner):
        owner(prepared(repeated=True))
        await settle(w)
    assert kube.gets == [
        (
            "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}",
            {"namespace": "default", "name": "pinned"},
        )
    ]
    ((_, args, _),) = kube.calls
    assert args[2] == apply_body(prepared(), topology=TOPO, node_name="node-1", since=EARLIER)
    assert count(metrics, "apply", "success") == 1


async def test_a_restart_writes_nothing_when_the_claim_holds_our_entries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    kube = ScriptedKube(reads=(stored_claim(prepared(), EARLIER),))
    w, metrics, owner = writer(kube)
    async with running(w, owner):
        owner(prepared(repeated=True))
        await settle(w)
        owner(prepared(repeated=True))  # asked again: still nothing to write, no new read
        await settle(w)
    assert len(kube.gets) == 1
    assert kube.calls == []
    assert count(metrics, "apply", "success") == 0
    assert w.describe()["claims"] == {UID: "written"}


async def test_a_restart_read_that_fails_starts_the_ready_time_now(
    autojump_clock: trio.testing.MockClock,
) -> None:
    kube = ScriptedKube(reads=(ServerError("etcd is slow", status=500),))
    w, metrics, owner = writer(kube)
    async with running(w, owner):
        owner(prepared(repeated=True))
        await settle(w)
    ((_, args, _),) = kube.calls
    assert args[2] == apply_body(prepared(), topology=TOPO, node_name="node-1", since=SINCE)
    assert count(metrics, "apply", "success") == 1


@pytest.mark.parametrize(
    "read",
    [NotFound("not found", status=404), b'{"metadata": {"uid": "someone-else"}}'],
    ids=["deleted", "recreated"],
)
async def test_a_restart_read_of_a_claim_gone_writes_nothing(
    read: bytes | Exception, autojump_clock: trio.testing.MockClock
) -> None:
    kube = ScriptedKube(reads=(read,))
    w, metrics, owner = writer(kube)
    async with running(w, owner):
        owner(prepared(repeated=True))
        await settle(w, 600.0)
    assert kube.calls == []
    assert count(metrics, "apply", "gone") == 1


def test_the_stored_ready_time_is_ours_and_true_only() -> None:
    from dracpu.k8s.claim_status_body import already_written, ready_since

    change = prepared()
    answer = decode_answer(stored_claim(change, EARLIER))
    assert ready_since(answer, change) == EARLIER
    body = apply_body(change, topology=TOPO, node_name="node-1", since=EARLIER)
    assert already_written(answer, body)
    # Another device, another driver's entry, a False or unparsable condition: no time.
    assert ready_since(answer, prepared("0,4", "cpudev001")) is None
    raw = json.loads(stored_claim(change, EARLIER))
    entry = raw["status"]["devices"][0]
    raw["status"]["devices"].append({**entry, "driver": "gpu.example.com"})
    assert ready_since(decode_answer(json.dumps(raw).encode()), change) == EARLIER
    entry["conditions"][0]["status"] = "False"
    assert ready_since(decode_answer(json.dumps(raw).encode()), change) is None
    entry["conditions"][0].update(status="True", lastTransitionTime="yesterday")
    assert ready_since(decode_answer(json.dumps(raw).encode()), change) is None
    # Fields another manager added to our entry do not make it differ; our own do.
    fresh = json.loads(stored_claim(change, EARLIER))
    fresh["status"]["devices"][0]["networkData"] = {"interfaceName": "eth0"}
    assert already_written(decode_answer(json.dumps(fresh).encode()), body)
    fresh["status"]["devices"][0]["data"]["cpuset"] = "1"
    assert not already_written(decode_answer(json.dumps(fresh).encode()), body)
    # An entry of ours the body no longer has: applying would remove it.
    extra = json.loads(stored_claim(prepared("0,4", "cpudev000", "cpudev004"), EARLIER))
    assert not already_written(decode_answer(json.dumps(extra).encode()), body)


async def test_a_server_that_drops_the_field_stops_the_writer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The DRAResourceClaimDeviceStatus gate off: the apply succeeds, status.devices is gone.
    dropped = json.dumps({"metadata": {"uid": UID}, "status": {}}).encode()
    kube = ScriptedKube(dropped)
    w, metrics, owner = writer(kube)
    async with running(w, owner):
        owner(prepared())
        await settle(w)
        # The writer closed its inbox: the owner drops it and builds no more events for it.
        with pytest.raises(trio.BrokenResourceError):
            owner(prepared("1,5", uid="another"))
        await settle(w, 600.0)
    assert len(kube.calls) == 1
    assert count(metrics, "apply", "refused") == 1
    assert "DRAResourceClaimDeviceStatus" in w.describe()["disabled"]


# What the API server answers an apply naming another UID than the stored claim's:
# rest.BeforeUpdate's ValidateObjectMetaAccessorUpdate (apiserver pkg/registry/rest/update.go).
REPLACED = Invalid(
    f'ResourceClaim.resource.k8s.io "pinned" is invalid: metadata.uid: Invalid value: "{UID}": '
    "field is immutable",
    status=422,
    reason="Invalid",
)


async def test_a_replaced_claim_is_gone_for_an_apply(
    autojump_clock: trio.testing.MockClock,
) -> None:
    kube = ScriptedKube(REPLACED)
    w, metrics, owner = writer(kube)
    async with running(w, owner):
        owner(prepared())
        await settle(w, 600.0)
    assert len(kube.calls) == 1
    assert count(metrics, "apply", "gone") == 1
    assert count(metrics, "apply", "refused") == 0
    assert w.describe()["claims"] == {}


async def test_a_removal_retried_after_the_claim_was_recreated_leaves_the_new_one_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # default/pinned (UID) is deleted and recreated; the removal for the old one gets a 500
    # and backs off; meanwhile the new claim got its entries. The retried removal names the
    # old UID, so the server refuses it (422) and it is dropped as gone.
    kube = ScriptedKube(echo(), ServerError("etcd is slow", status=500), REPLACED)
    w, metrics, owner = writer(kube)
    async with running(w, owner):
        owner(prepared())
        await settle(w)
        owner(unprepared())
        await settle(w, 600.0)
    bodies = [c[1][2] for c in kube.calls]
    assert bodies[1:] == [removal_body("default", "pinned", UID)] * 2
    assert count(metrics, "remove", "error") == 1
    assert count(metrics, "remove", "gone") == 1
    assert w.describe()["claims"] == {}


async def test_an_answer_for_another_claim_is_taken_as_gone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A server that ignored the body's UID: nothing of ours is left to write to.
    kube = ScriptedKube(json.dumps({"metadata": {"uid": "someone-else"}}).encode())
    w, metrics, owner = writer(kube)
    async with running(w, owner):
        owner(prepared())
        await settle(w, 600.0)
    assert len(kube.calls) == 1
    assert count(metrics, "apply", "gone") == 1


async def test_a_writer_turned_off_writes_nothing(autojump_clock: trio.testing.MockClock) -> None:
    kube = ScriptedKube()
    w, _, owner = writer(kube, enabled=False)
    owner(prepared())  # queued before the service starts: dropped with the inbox
    async with running(w, owner):
        await settle(w)
        # Its inbox is closed at once, so the owner never builds an event for it.
        with pytest.raises(trio.BrokenResourceError):
            owner(prepared())
        await settle(w, 600.0)
    assert kube.calls == []
    assert w.describe()["disabled"] == "turned off"


async def test_the_writer_ends_when_the_owner_stops_publishing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    kube = ScriptedKube()
    w, metrics, owner = writer(kube)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run, owner.inbox)
        owner(prepared())
        owner.send.close()  # NodeState.close_channels, as the daemon stops
        with trio.fail_after(1):
            await trio.testing.wait_all_tasks_blocked()
        # The service returned on its own: nothing is left in the nursery.
        assert not nursery.child_tasks
    assert len(kube.calls) == 1
    assert count(metrics, "apply", "success") == 1


async def test_a_repeated_prepare_after_a_restart_writes_the_status(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # dracpu stopped after the prepare committed and before the status was written; the
    # kubelet, with no reply, prepares again: a new writer hears the repeat, reads the
    # claim (no status yet) and writes.
    kube = ScriptedKube(reads=(json.dumps({"metadata": {"uid": UID}}).encode(),))
    w, metrics, owner = writer(kube)
    async with running(w, owner):
        owner(prepared(repeated=True))
        await settle(w)
    ((_, args, _),) = kube.calls
    assert args[2] == apply_body(prepared(), topology=TOPO, node_name="node-1", since=SINCE)
    assert count(metrics, "apply", "success") == 1


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="forbidden_retry"):
        writer(ScriptedKube(), forbidden_retry=0)
    with pytest.raises(ValueError, match="backoff"):
        writer(ScriptedKube(), backoff_base=0)
    metrics = DriverMetrics(CollectorRegistry())
    with pytest.raises(ValueError, match="unknown claim status write"):
        metrics.count_claim_status_write("apply", "maybe")


def test_the_daemon_writes_status_unless_the_config_turns_it_off() -> None:
    from dracpu.config import DriverConfig
    from dracpu.daemon.app import Daemon

    kube: Any = ScriptedKube()  # the constructor only keeps it
    assert Daemon(DriverConfig(), kube=kube, node_name="n").claim_status.disabled == ""
    off = Daemon(DriverConfig(claimStatus=False), kube=kube, node_name="n")
    assert off.claim_status.disabled == "turned off"
