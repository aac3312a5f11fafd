"""ResourceClaim status.devices on the simulated API server: server-side apply merges each
field manager's entries by (driver, device, pool, shareID), validation refuses what the
real server refuses, deallocation drops the entries; and dracpu's ClaimStatusWriter
against it through the official client."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from builders import allocation, device_result, resource_claim

from dracpu.k8s.claim_status import ClaimStatusWriter
from dracpu.k8s.claim_status_body import FIELD_MANAGER, apply_body, removal_body
from dracpu.k8s.client import Invalid, KubeClient, load_api_client
from dracpu.messages import ClaimDevice, ClaimEvent, ClaimPrepared, ClaimUnprepared
from dracpu_sim.apiserver import SimAPIServer
from dracpu_sim.apiserver.errors import ApiError
from dracpu_sim.apiserver.resources import RESOURCE_CLAIMS
from dracpu_sim.apiserver.store import ObjectStore

NOW = datetime(2026, 12, 3, 15, 0, 0, tzinfo=UTC)
SHARE = "6a1b0f0e-8d39-4f6e-9c38-2f4a0a1b2c3d"
CONDITION = {
    "type": "Ready",
    "status": "True",
    "reason": "Configured",
    "message": "",
    "lastTransitionTime": "2026-12-03T15:00:00Z",
}


def make_store() -> ObjectStore:
    return ObjectStore(clock=lambda: NOW, rng=random.Random(7))


def allocated_claim(store: ObjectStore, *results: dict[str, Any]) -> dict[str, Any]:
    store.create(RESOURCE_CLAIMS, "ns", resource_claim("c1", namespace=None))
    results = results or (
        device_result("cpudev000"),
        device_result("gpu-0", driver="gpu.example.com", pool="node-a-gpus"),
    )
    return store.update(
        RESOURCE_CLAIMS,
        "ns",
        "c1",
        {**store.get(RESOURCE_CLAIMS, "ns", "c1"), "status": {"allocation": allocation(*results)}},
        subresource="status",
    )


def entry(device: str = "cpudev000", **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"driver": "dra.cpu", "pool": "node-a", "device": device}
    out.update(fields)
    return out


def apply_status(store: ObjectStore, manager: str, *entries: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": "ns"},
    }
    if entries:
        config["status"] = {"devices": list(entries)}
    applied, code = store.apply(
        RESOURCE_CLAIMS, "ns", "c1", config, manager=manager, subresource="status"
    )
    assert code == 200
    return applied


def refusal(store: ObjectStore, *entries: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as info:
        apply_status(store, FIELD_MANAGER, *entries)
    assert info.value.code == 422
    return info.value


def devices_of(claim: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e["driver"], e["device"]) for e in claim["status"].get("devices", [])]


# -- merging ---------------------------------------------------------------------------------


def test_each_drivers_entries_merge_apart_and_leave_as_they_came() -> None:
    store = make_store()
    allocated_claim(store)
    gpu = {"driver": "gpu.example.com", "pool": "node-a-gpus", "device": "gpu-0"}
    apply_status(store, "gpu-driver", {**gpu, "conditions": [CONDITION]})
    claim = apply_status(store, FIELD_MANAGER, entry(data={"cpuset": "0-3"}))
    assert devices_of(claim) == [("gpu.example.com", "gpu-0"), ("dra.cpu", "cpudev000")]
    # Applying again changes our entry in place; the other driver's stays as it was.
    claim = apply_status(store, FIELD_MANAGER, entry(data={"cpuset": "4-7"}))
    ours = [e for e in claim["status"]["devices"] if e["driver"] == "dra.cpu"]
    assert [e["data"] for e in ours] == [{"cpuset": "4-7"}]
    assert claim["status"]["devices"][0] == {**gpu, "conditions": [CONDITION]}
    # Applying nothing takes our entries away and nothing else: not the other driver's,
    # not the allocation.
    claim = apply_status(store, FIELD_MANAGER)
    assert devices_of(claim) == [("gpu.example.com", "gpu-0")]
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "cpudev000"
    claim = apply_status(store, "gpu-driver")
    assert "devices" not in claim["status"]
    assert claim["status"]["allocation"]


def test_an_entry_left_out_of_the_next_apply_is_removed() -> None:
    store = make_store()
    allocated_claim(store, device_result("cpudev000"), device_result("cpudev001"))
    apply_status(store, FIELD_MANAGER, entry("cpudev000"), entry("cpudev001"))
    claim = apply_status(store, FIELD_MANAGER, entry("cpudev001"))
    assert devices_of(claim) == [("dra.cpu", "cpudev001")]


def test_shares_of_one_device_are_separate_entries() -> None:
    store = make_store()
    other = "0f0e0d0c-0b0a-4908-8706-050403020100"
    allocated_claim(
        store,
        device_result("cpudevnuma000", 2, share_id=SHARE),
        device_result("cpudevnuma000", 2, share_id=other),
    )
    claim = apply_status(
        store,
        FIELD_MANAGER,
        entry("cpudevnuma000", shareID=SHARE, data={"n": 1}),
        entry("cpudevnuma000", shareID=other, data={"n": 2}),
    )
    assert [e["data"]["n"] for e in claim["status"]["devices"]] == [1, 2]
    # The second share's entry alone again: the first goes.
    claim = apply_status(store, FIELD_MANAGER, entry("cpudevnuma000", shareID=other))
    assert [e["shareID"] for e in claim["status"]["devices"]] == [other]


def test_deallocation_drops_the_entries() -> None:
    store = make_store()
    allocated_claim(store)
    apply_status(store, FIELD_MANAGER, entry())
    claim = store.get(RESOURCE_CLAIMS, "ns", "c1")
    claim["status"].pop("allocation")
    updated = store.update(RESOURCE_CLAIMS, "ns", "c1", claim, subresource="status")
    assert "devices" not in updated["status"]


def test_the_main_resource_cannot_write_status_devices() -> None:
    store = make_store()
    claim = allocated_claim(store)
    claim["status"]["devices"] = [entry()]
    updated = store.update(RESOURCE_CLAIMS, "ns", "c1", claim)
    assert "devices" not in updated["status"]


# -- validation (the real server's messages) --------------------------------------------------


def test_an_entry_must_name_an_allocated_device() -> None:
    store = make_store()
    allocated_claim(store)
    err = refusal(store, entry("cpudev009"))
    assert err.status()["message"] == (
        'ResourceClaim.resource.k8s.io "c1" is invalid: status.devices[0]: Invalid value: '
        "dra.cpu/node-a/cpudev009: must be an allocated device in the claim"
    )
    assert err.status()["reason"] == "Invalid"
    assert err.status()["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: dra.cpu/node-a/cpudev009: must be an allocated device "
            "in the claim",
            "field": "status.devices[0]",
        }
    ]
    # The share is part of the device's identity.
    err = refusal(store, entry(shareID=SHARE))
    assert f"dra.cpu/node-a/cpudev000/{SHARE}: must be an allocated device" in str(
        err.status()["message"]
    )


def test_an_unallocated_claim_takes_no_entries() -> None:
    store = make_store()
    store.create(RESOURCE_CLAIMS, "ns", resource_claim("c1", namespace=None))
    err = refusal(store, entry())
    assert "must be an allocated device in the claim" in err.status()["message"]


def test_data_must_be_an_object_of_at_most_10_kib() -> None:
    store = make_store()
    allocated_claim(store)
    # {"x":"..."} of exactly 10240 bytes is allowed, one more byte is not.
    fits = {"x": "a" * (10 * 1024 - 8)}
    assert len(msgspec.json.encode(fits)) == 10 * 1024
    apply_status(store, FIELD_MANAGER, entry(data=fits))
    err = refusal(store, entry(data={"x": "a" * (10 * 1024 - 7)}))
    assert err.status()["message"].endswith(
        "status.devices[0].data: Too long: may not be more than 10240 bytes"
    )
    err = refusal(store, entry(data=[1, 2]))
    assert err.status()["message"].endswith(
        'status.devices[0].data: Invalid value: "<value omitted>": must be a valid JSON object'
    )


def test_conditions_are_checked_as_metav1_conditions() -> None:
    store = make_store()
    allocated_claim(store)
    nine = [{**CONDITION, "type": f"T{i}"} for i in range(9)]
    err = refusal(store, entry(conditions=nine))
    assert "status.devices[0].conditions: Too many: 9: must have at most 8 items" in str(
        err.status()["message"]
    )
    bad = {"type": "Ready", "status": "Maybe", "reason": "no spaces allowed"}
    causes = refusal(store, entry(conditions=[bad])).status()["details"]["causes"]
    assert [(c["field"], c["message"]) for c in causes] == [
        (
            "status.devices[0].conditions[0].status",
            'Unsupported value: "Maybe": supported values: "False", "True", "Unknown"',
        ),
        ("status.devices[0].conditions[0].lastTransitionTime", "Required value: must be set"),
        (
            "status.devices[0].conditions[0].reason",
            'Invalid value: "no spaces allowed": a condition reason must start with alphabetic '
            "character, optionally followed by a string of alphanumeric characters or '_,:', "
            "and must end with an alphanumeric character or '_' (e.g. 'my_name',  or "
            "'MY_NAME',  or 'MyName',  or 'ReasonA,ReasonB',  or 'ReasonA:ReasonB', regex "
            "used for validation is '[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')",
        ),
    ]
    twice = refusal(store, entry(conditions=[CONDITION, CONDITION])).status()
    assert 'status.devices[0].conditions[1].type: Duplicate value: "Ready"' in twice["message"]


def test_names_shares_duplicates_and_network_data_are_checked() -> None:
    store = make_store()
    allocated_claim(store)
    causes = refusal(store, entry(driver="Not_A_Driver")).status()["details"]["causes"]
    assert causes[0]["field"] == "status.devices[0].driver"
    err = refusal(store, entry(shareID="NOT-A-UUID"))
    assert "status.devices[0].shareID: Invalid value" in err.status()["message"]
    # Twice the same key in an update (PUT /status; an apply merges by the key).
    claim = store.get(RESOURCE_CLAIMS, "ns", "c1")
    claim["status"]["devices"] = [entry(), entry()]
    with pytest.raises(ApiError) as info:
        store.update(RESOURCE_CLAIMS, "ns", "c1", claim, subresource="status")
    assert "status.devices[1]: Duplicate value: dra.cpu/node-a/cpudev000" in str(
        info.value.status()["message"]
    )
    network = {
        "interfaceName": "x" * 257,
        "hardwareAddress": "y" * 129,
        "ips": [f"10.0.0.{i}/24" for i in range(17)],
    }
    fields = [
        c["field"] for c in refusal(store, entry(networkData=network)).status()["details"]["causes"]
    ]
    assert fields == [
        "status.devices[0].networkData.interfaceName",
        "status.devices[0].networkData.hardwareAddress",
        "status.devices[0].networkData.ips",
    ]
    err = refusal(store, entry(networkData={"ips": ["10.0.0.1"]}))
    assert "status.devices[0].networkData.ips[0]: Invalid value" in err.status()["message"]


# -- dracpu's writer against the server, through the official client --------------------------


@pytest.fixture
async def kube(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[tuple[SimAPIServer, Any]]:
    server = SimAPIServer(seed=3)
    await nursery.start(server.serve)
    client = KubeClient(load_api_client(str(server.write_kubeconfig(tmp_path / "kubeconfig"))))
    yield server, client
    client.close()


async def read_claim(client: KubeClient) -> dict[str, Any]:
    raw = await client.call_raw(client.resource.read_namespaced_resource_claim, "c1", "ns")
    claim: dict[str, Any] = msgspec.json.decode(raw)
    return claim


async def apply_as_dracpu(client: KubeClient, body: dict[str, Any]) -> bytes:
    """Server-side apply of ``body`` to ns/c1's status as dracpu's field manager."""
    return await client.call_raw(
        client.resource.patch_namespaced_resource_claim_status,
        "c1",
        "ns",
        body,
        field_manager=FIELD_MANAGER,
        force=True,
        _content_type="application/apply-patch+yaml",
    )


def claim_prepared(uid: str, cpus: str, device: str = "cpudev000") -> ClaimPrepared:
    """ns/c1 prepared on node-a with one of dracpu's devices."""
    return ClaimPrepared(
        uid=uid,
        namespace="ns",
        name="c1",
        cpus=cpus,
        devices=(ClaimDevice(pool="node-a", device=device),),
    )


def counting_writer(
    client: KubeClient, **kw: Any
) -> tuple[ClaimStatusWriter, list[tuple[str, str]]]:
    """A writer for node-a that lists each (operation, result) it counts."""
    counted: list[tuple[str, str]] = []
    writer = ClaimStatusWriter(
        client,
        node_name="node-a",
        topology=lambda: None,
        count=lambda op, result: counted.append((op, result)),
        now=lambda: NOW,
        **kw,
    )
    return writer, counted


@asynccontextmanager
async def running(writer: ClaimStatusWriter) -> AsyncIterator[trio.MemorySendChannel[ClaimEvent]]:
    """The writer serving its inbox for the length of the block, cancelled after; yields the
    owner's end of the inbox (NodeState.claim_events in the daemon)."""
    async with trio.open_nursery() as nursery:
        owner, events = trio.open_memory_channel[ClaimEvent](math.inf)
        await nursery.start(writer.run, events)
        yield owner
        nursery.cancel_scope.cancel()


async def counted_to(counted: list[tuple[str, str]], n: int) -> None:
    """Wait (10 s at most) until the writer has counted n writes."""
    with trio.fail_after(10):
        while len(counted) < n:
            await trio.sleep(0.01)


async def test_the_writer_applies_and_removes_dracpus_entries(
    kube: tuple[SimAPIServer, KubeClient],
) -> None:
    server, client = kube
    store = server.store
    allocated_claim(store)
    uid = store.get(RESOURCE_CLAIMS, "ns", "c1")["metadata"]["uid"]
    gpu = {"driver": "gpu.example.com", "pool": "node-a-gpus", "device": "gpu-0"}
    apply_status(store, "gpu-driver", gpu)
    writer, counted = counting_writer(client)
    change = claim_prepared(uid, "2-3")
    async with running(writer) as owner:
        owner.send_nowait(change)
        await counted_to(counted, 1)
        claim = await read_claim(client)
        expected = apply_body(change, topology=None, node_name="node-a", since=NOW)
        assert claim["status"]["devices"] == [gpu, *expected["status"]["devices"]]
        assert claim["status"]["devices"][1]["data"]["cpuset"] == "2-3"
        # GET on the status subresource answers the same object.
        raw = await client.call_raw(
            client.resource.read_namespaced_resource_claim_status, "c1", "ns"
        )
        assert msgspec.json.decode(raw) == claim
        owner.send_nowait(ClaimUnprepared(uid=uid, namespace="ns", name="c1", cpus="2-3"))
        await counted_to(counted, 2)
        claim = await read_claim(client)
    assert counted == [("apply", "success"), ("remove", "success")]
    assert claim["status"]["devices"] == [gpu]


async def test_the_client_sees_the_refusal_as_invalid(
    kube: tuple[SimAPIServer, KubeClient],
) -> None:
    server, client = kube
    allocated_claim(server.store)
    uid = server.store.get(RESOURCE_CLAIMS, "ns", "c1")["metadata"]["uid"]
    change = claim_prepared(uid, "0", "cpudev042")
    body = apply_body(change, topology=None, node_name="node-a", since=NOW)
    with pytest.raises(Invalid) as info:
        await apply_as_dracpu(client, body)
    assert info.value.message == (
        'ResourceClaim.resource.k8s.io "c1" is invalid: status.devices[0]: Invalid value: '
        "dra.cpu/node-a/cpudev042: must be an allocated device in the claim"
    )
    # Removing what was never written is fine.
    raw = await apply_as_dracpu(client, removal_body("ns", "c1", uid))
    assert "devices" not in msgspec.json.decode(raw)["status"]


def test_an_apply_naming_another_uid_is_refused() -> None:
    # rest.BeforeUpdate validates the merged metadata against the stored object's: a UID
    # is immutable, on /status as on the object (the apply itself is no precondition).
    store = make_store()
    allocated_claim(store)
    stored = store.get(RESOURCE_CLAIMS, "ns", "c1")
    other = "0f0e0d0c-0b0a-4908-8706-050403020100"
    config = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": "ns", "uid": other},
        "status": {"devices": [entry(conditions=[CONDITION])]},
    }
    for subresource in ("status", None):
        with pytest.raises(ApiError) as info:
            store.apply(
                RESOURCE_CLAIMS, "ns", "c1", config, manager=FIELD_MANAGER, subresource=subresource
            )
        assert info.value.code == 422
        assert info.value.message == (
            'ResourceClaim.resource.k8s.io "c1" is invalid: metadata.uid: Invalid value: '
            f'"{other}": field is immutable'
        )
        assert info.value.details is not None
        assert info.value.details["causes"] == [
            {
                "reason": "FieldValueInvalid",
                "message": f'Invalid value: "{other}": field is immutable',
                "field": "metadata.uid",
            }
        ]
    assert store.get(RESOURCE_CLAIMS, "ns", "c1") == stored
    # The stored UID, or none, is taken.
    config["metadata"]["uid"] = stored["metadata"]["uid"]
    claim = store.apply(
        RESOURCE_CLAIMS, "ns", "c1", config, manager=FIELD_MANAGER, subresource="status"
    )[0]
    assert devices_of(claim) == [("dra.cpu", "cpudev000")]
    # Nothing under the name: /status never creates (404); the object itself would, but
    # not with a UID of its own choosing (patch.go's applyPatch: 409).
    store.delete(RESOURCE_CLAIMS, "ns", "c1")
    with pytest.raises(ApiError) as info:
        store.apply(RESOURCE_CLAIMS, "ns", "c1", config, manager="m", subresource="status")
    assert info.value.code == 404
    with pytest.raises(ApiError) as info:
        store.apply(RESOURCE_CLAIMS, "ns", "c1", config, manager="m")
    assert info.value.code == 409
    assert info.value.message == (
        'Operation cannot be fulfilled on resourceclaims.resource.k8s.io "c1": uid mismatch: '
        f"the provided object specified uid {stored['metadata']['uid']}, and no existing "
        "object was found"
    )


async def test_a_late_removal_leaves_the_recreated_claims_entries(
    kube: tuple[SimAPIServer, KubeClient],
) -> None:
    # ns/c1 is prepared and written, then deleted and recreated under the same name and
    # prepared again (a new UID) while the old claim's removal is still to be sent. The
    # removal names the old UID: the server refuses it, the writer takes it as gone, and
    # the new claim keeps its entries.
    server, client = kube
    store = server.store
    allocated_claim(store)
    old_uid = store.get(RESOURCE_CLAIMS, "ns", "c1")["metadata"]["uid"]
    writer, counted = counting_writer(client)
    async with running(writer) as owner:
        owner.send_nowait(claim_prepared(old_uid, "2-3"))
        await counted_to(counted, 1)
        store.delete(RESOURCE_CLAIMS, "ns", "c1")
        allocated_claim(store)
        new_uid = store.get(RESOURCE_CLAIMS, "ns", "c1")["metadata"]["uid"]
        assert new_uid != old_uid
        owner.send_nowait(claim_prepared(new_uid, "2-3"))
        await counted_to(counted, 2)
        owner.send_nowait(ClaimUnprepared(uid=old_uid, namespace="ns", name="c1", cpus="2-3"))
        await counted_to(counted, 3)
        claim = await read_claim(client)
    assert counted == [("apply", "success"), ("apply", "success"), ("remove", "gone")]
    assert devices_of(claim) == [("dra.cpu", "cpudev000")]
    assert writer.describe()["claims"] == {new_uid: "written"}


async def test_the_granular_authorization_422_reaches_the_writer_as_an_rbac_refusal(
    kube: tuple[SimAPIServer, KubeClient],
) -> None:
    # Kubernetes 1.36 with DRAResourceClaimGranularStatusAuthorization and a ClusterRole
    # without associated-node:patch on resourceclaims/driver: the status strategy's
    # validation refuses the apply (authz.go's field.Forbidden in a 422 Invalid).
    server, client = kube
    allocated_claim(server.store)
    uid = server.store.get(RESOURCE_CLAIMS, "ns", "c1")["metadata"]["uid"]
    server.faults.inject(
        "patch",
        "resourceclaims/status",
        status=422,
        message='ResourceClaim.resource.k8s.io "c1" is invalid: status.devices: Forbidden: '
        'changing status.devices requires resource="resourceclaims/driver", '
        'verb="[associated-node:patch arbitrary-node:patch]" permission: '
        'resourceclaims.resource.k8s.io "dra.cpu" is forbidden: User '
        '"system:serviceaccount:dracpu:dracpu" cannot associated-node:patch resource '
        '"resourceclaims/driver" in API group "resource.k8s.io" in the namespace "ns"',
    )
    writer, counted = counting_writer(client, forbidden_retry=0.5)
    change = claim_prepared(uid, "2-3")
    async with running(writer) as owner:
        owner.send_nowait(change)
        await counted_to(counted, 2)  # refused, then written at the slow retry
        claim = await read_claim(client)
    assert counted == [("apply", "refused"), ("apply", "success")]
    assert devices_of(claim) == [("dra.cpu", "cpudev000")]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")
async def test_kubectl_shows_the_entries_the_writer_applied(
    kube: tuple[SimAPIServer, KubeClient], tmp_path: Path
) -> None:
    server, client = kube
    allocated_claim(server.store)
    change = claim_prepared(server.store.get(RESOURCE_CLAIMS, "ns", "c1")["metadata"]["uid"], "0-1")
    body = apply_body(change, topology=None, node_name="node-a", since=NOW)
    await apply_as_dracpu(client, body)
    kubeconfig = tmp_path / "kubeconfig"  # written by the fixture
    env = {**os.environ, "HOME": str(tmp_path), "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    argv = ["kubectl", "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache")]
    shown = await trio.to_thread.run_sync(
        partial(
            subprocess.run,
            [*argv, "get", "resourceclaim", "c1", "-n", "ns", "-o", "json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
    )
    assert shown.returncode == 0, shown.stderr
    devices = json.loads(shown.stdout)["status"]["devices"]
    assert devices == body["status"]["devices"]
    assert devices[0]["data"]["cpuset"] == "0-1"


def test_with_the_gate_off_the_field_is_dropped_silently() -> None:
    store = ObjectStore(clock=lambda: NOW, rng=random.Random(7), device_status=False)
    allocated_claim(store)
    claim = apply_status(store, FIELD_MANAGER, entry())
    assert "devices" not in claim["status"]
    assert claim["status"]["allocation"]


async def test_the_writer_stops_when_the_server_drops_the_field(tmp_path: Path) -> None:
    server = SimAPIServer(seed=3, device_status=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        client = KubeClient(load_api_client(str(server.write_kubeconfig(tmp_path / "kc"))))
        allocated_claim(server.store)
        uid = server.store.get(RESOURCE_CLAIMS, "ns", "c1")["metadata"]["uid"]
        writer, counted = counting_writer(client)
        owner, events = trio.open_memory_channel[ClaimEvent](math.inf)
        await nursery.start(writer.run, events)
        owner.send_nowait(claim_prepared(uid, "0"))
        await counted_to(counted, 1)
        # Nothing more is written: not this claim's removal, not another claim (the
        # writer closed its inbox, so the owner drops it).
        with pytest.raises(trio.BrokenResourceError):
            owner.send_nowait(ClaimUnprepared(uid=uid, namespace="ns", name="c1", cpus="0"))
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    client.close()
    assert counted == [("apply", "refused")]
    assert server.calls.get("patch", "resourceclaims/status") == 1
    assert "DRAResourceClaimDeviceStatus" in writer.describe()["disabled"]
