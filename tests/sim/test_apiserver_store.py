"""The pure core of the simulated API server: store, selectors, validation, patches."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest

from dracpu_sim.apiserver.errors import ApiError
from dracpu_sim.apiserver.faults import CallCounter, FaultInjector
from dracpu_sim.apiserver.patch import json_patch, merge_patch
from dracpu_sim.apiserver.resources import (
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from dracpu_sim.apiserver.selectors import parse_field_selector, parse_label_selector
from dracpu_sim.apiserver.store import JSON_PATCH, MERGE_PATCH, ObjectStore
from dracpu_sim.apiserver.validation import validate_resource_slice

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def make_store(**kwargs: Any) -> ObjectStore:
    return ObjectStore(clock=lambda: NOW, rng=random.Random(7), **kwargs)


def slice_body(
    name: str = "s1", node: str = "node-a", devices: int = 1, **meta: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, **meta},
        "spec": {
            "driver": "dra.cpu",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"cpudev{i:03d}"} for i in range(devices)],
        },
    }


def error_of(fn: Any, *args: Any, **kwargs: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(*args, **kwargs)
    return info.value


def test_create_sets_server_fields() -> None:
    store = make_store()
    created = store.create(RESOURCE_SLICES, None, slice_body())
    meta = created["metadata"]
    assert meta["resourceVersion"] == "1"
    assert meta["generation"] == 1
    assert meta["creationTimestamp"] == "2025-01-02T03:04:05Z"
    assert len(meta["uid"]) == 36
    assert "namespace" not in meta
    assert store.get(RESOURCE_SLICES, None, "s1") == created


def test_generate_name_uses_five_char_suffix() -> None:
    store = make_store()
    body = slice_body()
    body["metadata"] = {"generateName": "node-a-dra.cpu-"}
    names = {store.create(RESOURCE_SLICES, None, body)["metadata"]["name"] for _ in range(20)}
    assert len(names) == 20
    for name in names:
        assert name.startswith("node-a-dra.cpu-")
        suffix = name.removeprefix("node-a-dra.cpu-")
        assert len(suffix) == 5
        assert set(suffix) <= set("bcdfghjklmnpqrstvwxz2456789")


def test_create_without_name_is_invalid() -> None:
    body = slice_body()
    body["metadata"] = {}
    err = error_of(make_store().create, RESOURCE_SLICES, None, body)
    assert (err.code, err.reason) == (422, "Invalid")
    assert err.message == (
        'ResourceSlice.resource.k8s.io "" is invalid: metadata.name: Required value: '
        "name or generateName is required"
    )


def test_create_twice_is_already_exists() -> None:
    store = make_store()
    store.create(RESOURCE_SLICES, None, slice_body())
    err = error_of(store.create, RESOURCE_SLICES, None, slice_body())
    assert err.status() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'resourceslices.resource.k8s.io "s1" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "s1", "group": "resource.k8s.io", "kind": "resourceslices"},
        "code": 409,
    }


def test_create_with_resource_version_is_bad_request() -> None:
    err = error_of(make_store().create, RESOURCE_SLICES, None, slice_body(resourceVersion="5"))
    assert (err.code, err.message) == (
        400,
        "resourceVersion should not be set on objects to be created",
    )


def test_namespace_mismatch_is_bad_request() -> None:
    body = {"metadata": {"name": "c", "namespace": "other"}, "spec": {}}
    err = error_of(make_store().create, RESOURCE_CLAIMS, "default", body)
    assert err.message == (
        "the namespace of the provided object does not match the namespace sent on the request"
    )


def test_claim_status_is_dropped_on_create_and_kept_by_main_update() -> None:
    store = make_store()
    claim = store.create(
        RESOURCE_CLAIMS,
        "default",
        {"metadata": {"name": "c"}, "spec": {"devices": {}}, "status": {"allocation": {}}},
    )
    assert "status" not in claim
    claim["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}
    updated = store.update(RESOURCE_CLAIMS, "default", "c", claim, subresource="status")
    assert updated["status"] == claim["status"]
    assert updated["metadata"]["resourceVersion"] == "2"
    # A main-resource update cannot change status.
    updated["status"] = {}
    updated["metadata"]["labels"] = {"a": "b"}
    again = store.update(RESOURCE_CLAIMS, "default", "c", updated)
    assert again["status"] == claim["status"]
    assert again["metadata"]["labels"] == {"a": "b"}


def test_update_conflict_on_stale_resource_version() -> None:
    store = make_store()
    created = store.create(RESOURCE_SLICES, None, slice_body())
    store.patch(RESOURCE_SLICES, None, "s1", MERGE_PATCH, {"metadata": {"labels": {"x": "1"}}})
    err = error_of(store.update, RESOURCE_SLICES, None, "s1", created)
    assert (err.code, err.reason) == (409, "Conflict")
    assert err.message == (
        'Operation cannot be fulfilled on resourceslices.resource.k8s.io "s1": the object has '
        "been modified; please apply your changes to the latest version and try again"
    )


def test_spec_change_bumps_generation_and_noop_keeps_version() -> None:
    store = make_store()
    created = store.create(RESOURCE_SLICES, None, slice_body())
    same = store.update(RESOURCE_SLICES, None, "s1", created)
    assert same["metadata"]["resourceVersion"] == "1"
    created["spec"]["pool"]["generation"] = 2
    changed = store.update(RESOURCE_SLICES, None, "s1", created)
    assert changed["metadata"]["generation"] == 2
    assert changed["metadata"]["resourceVersion"] == "2"
    labelled = store.patch(
        RESOURCE_SLICES, None, "s1", MERGE_PATCH, {"metadata": {"labels": {"a": "b"}}}
    )
    assert labelled["metadata"]["generation"] == 2


def test_slice_immutable_fields() -> None:
    store = make_store()
    created = store.create(RESOURCE_SLICES, None, slice_body())
    created["spec"]["nodeName"] = "node-b"
    err = error_of(store.update, RESOURCE_SLICES, None, "s1", created)
    assert err.message == (
        'ResourceSlice.resource.k8s.io "s1" is invalid: spec.nodeName: Invalid value: '
        '"node-b": field is immutable'
    )


def test_delete_returns_object_or_status() -> None:
    store = make_store()
    store.create(RESOURCE_SLICES, None, slice_body())
    body, code = store.delete(RESOURCE_SLICES, None, "s1")
    assert code == 200
    assert body["metadata"]["name"] == "s1"
    assert body["metadata"]["resourceVersion"] == "2"
    node = store.create(NODES, None, {"metadata": {"name": "node-a"}})
    body, code = store.delete(NODES, None, "node-a")
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "node-a", "kind": "nodes", "uid": node["metadata"]["uid"]},
    }
    err = error_of(store.get, NODES, None, "node-a")
    assert err.message == 'nodes "node-a" not found'


def test_delete_preconditions() -> None:
    store = make_store()
    created = store.create(RESOURCE_SLICES, None, slice_body())
    err = error_of(store.delete, RESOURCE_SLICES, None, "s1", {"preconditions": {"uid": "nope"}})
    assert err.message == (
        'Operation cannot be fulfilled on resourceslices.resource.k8s.io "s1": Precondition '
        f"failed: UID in precondition: nope, UID in object meta: {created['metadata']['uid']}"
    )
    store.delete(RESOURCE_SLICES, None, "s1", {"preconditions": {"resourceVersion": "1"}})


def test_finalizers_delay_delete_until_removed() -> None:
    store = make_store()
    store.create(RESOURCE_CLAIMS, "ns", {"metadata": {"name": "c", "finalizers": ["f"]}})
    body, code = store.delete(RESOURCE_CLAIMS, "ns", "c")
    assert code == 202
    assert body["metadata"]["deletionTimestamp"] == "2025-01-02T03:04:05Z"
    store.patch(RESOURCE_CLAIMS, "ns", "c", MERGE_PATCH, {"metadata": {"finalizers": None}})
    assert error_of(store.get, RESOURCE_CLAIMS, "ns", "c").code == 404


def test_graceful_pod_deletion() -> None:
    store = make_store(graceful_pod_deletion=True)
    store.create(PODS, "ns", {"metadata": {"name": "p"}, "spec": {"nodeName": "node-a"}})
    body, code = store.delete(PODS, "ns", "p")
    assert code == 202
    assert body["metadata"]["deletionGracePeriodSeconds"] == 30
    body, code = store.delete(PODS, "ns", "p", {"gracePeriodSeconds": 0})
    assert code == 200
    assert error_of(store.get, PODS, "ns", "p").code == 404


def test_list_selectors_and_pagination() -> None:
    store = make_store()
    for i, node in enumerate(["node-a", "node-b", "node-a"]):
        store.create(RESOURCE_SLICES, None, slice_body(f"s{i}", node, labels={"i": str(i)}))
    fields = parse_field_selector("spec.nodeName=node-a", RESOURCE_SLICES.field_labels)
    listed = store.list(RESOURCE_SLICES, None, None, fields)
    assert [o["metadata"]["name"] for o in listed["items"]] == ["s0", "s2"]
    assert "kind" not in listed["items"][0]
    assert listed["metadata"] == {"resourceVersion": "3"}
    page = store.list(RESOURCE_SLICES, limit=2)
    assert [o["metadata"]["name"] for o in page["items"]] == ["s0", "s1"]
    assert page["metadata"]["remainingItemCount"] == 1
    store.delete(RESOURCE_SLICES, None, "s2")
    # The continuation lists at the first page's version: s2 is still there.
    rest = store.list(RESOURCE_SLICES, continue_token=page["metadata"]["continue"])
    assert [o["metadata"]["name"] for o in rest["items"]] == ["s2"]
    labels = parse_label_selector("i in (0,1),i!=1")
    assert [o["metadata"]["name"] for o in store.list(RESOURCE_SLICES, None, labels)["items"]] == [
        "s0"
    ]


def test_list_exact_old_version_and_gone() -> None:
    store = make_store(history_limit=2)
    store.create(RESOURCE_SLICES, None, slice_body("a"))
    store.create(RESOURCE_SLICES, None, slice_body("b"))
    at_1 = store.list(RESOURCE_SLICES, resource_version="1", resource_version_match="Exact")
    assert [o["metadata"]["name"] for o in at_1["items"]] == ["a"]
    store.create(RESOURCE_SLICES, None, slice_body("c"))
    store.create(RESOURCE_SLICES, None, slice_body("d"))
    err = error_of(
        store.list, RESOURCE_SLICES, resource_version="1", resource_version_match="Exact"
    )
    assert (err.code, err.reason, err.message) == (
        410,
        "Expired",
        "The resourceVersion for the provided list is too old.",
    )
    err = error_of(store.list, RESOURCE_SLICES, resource_version="99")
    assert (err.code, err.message) == (504, "Too large resource version: 99, current: 4")


def test_watch_replays_history_and_filters_by_selector() -> None:
    store = make_store()
    store.create(RESOURCE_SLICES, None, slice_body("a", "node-a"))
    seen: list[tuple[str, str]] = []
    fields = parse_field_selector("spec.nodeName=node-a", RESOURCE_SLICES.field_labels)
    store.watch(
        RESOURCE_SLICES,
        None,
        parse_label_selector(""),
        fields,
        "0",
        lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
    )
    store.create(RESOURCE_SLICES, None, slice_body("b", "node-b"))
    store.delete(RESOURCE_SLICES, None, "a")
    assert seen == [("ADDED", "a"), ("DELETED", "a")]
    replay: list[tuple[str, str]] = []
    store.watch(
        RESOURCE_SLICES,
        None,
        parse_label_selector(""),
        parse_field_selector("", ()),
        "1",
        lambda kind, obj: replay.append((kind, obj["metadata"]["resourceVersion"])),
    )
    assert replay == [("ADDED", "2"), ("DELETED", "3")]


def test_watch_label_change_moves_object_in_and_out() -> None:
    store = make_store()
    store.create(RESOURCE_SLICES, None, slice_body("a"))
    seen: list[str] = []
    store.watch(
        RESOURCE_SLICES,
        None,
        parse_label_selector("sel"),
        parse_field_selector("", ()),
        None,
        lambda kind, obj: seen.append(kind),
    )
    store.patch(RESOURCE_SLICES, None, "a", MERGE_PATCH, {"metadata": {"labels": {"sel": "1"}}})
    store.patch(RESOURCE_SLICES, None, "a", MERGE_PATCH, {"metadata": {"labels": {"sel": "2"}}})
    store.patch(RESOURCE_SLICES, None, "a", MERGE_PATCH, {"metadata": {"labels": None}})
    assert seen == ["ADDED", "MODIFIED", "DELETED"]


def test_watch_too_old_version_is_gone() -> None:
    store = make_store()
    store.create(RESOURCE_SLICES, None, slice_body("a"))
    store.create(RESOURCE_SLICES, None, slice_body("b"))
    store.compact()
    err = error_of(
        store.watch,
        RESOURCE_SLICES,
        None,
        parse_label_selector(""),
        parse_field_selector("", ()),
        "1",
        lambda kind, obj: None,
    )
    assert err.status() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "too old resource version: 1 (3)",
        "reason": "Expired",
        "code": 410,
    }


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda s: s["spec"].update(devices=[{"name": f"d{i}"} for i in range(129)]),
            "spec.devices: Too many: 129: must have at most 128 items",
        ),
        (
            lambda s: s["spec"].update(
                devices=[{"name": f"d{i}", "attributes": {"a": {"ints": [1]}}} for i in range(65)]
            ),
            "spec.devices: Too many: 65: must have at most 64 items",
        ),
        (
            lambda s: s["spec"]["devices"][0].update(
                attributes={f"a{i}": {"int": i} for i in range(20)},
                capacity={f"c{i}": {"value": "1"} for i in range(13)},
            ),
            "spec.devices[0]: Invalid value: 33: the total number of attributes and capacities "
            "must not exceed 32",
        ),
        (
            lambda s: s["spec"]["devices"][0].update(name="CPU_0"),
            'spec.devices[0].name: Invalid value: "CPU_0": a lowercase RFC 1123 label must '
            "consist of lower case alphanumeric characters or '-', and must start and end with an "
            "alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
            "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        ),
        (
            lambda s: s["spec"]["devices"][0].update(attributes={"model": {"string": "x" * 65}}),
            "spec.devices[0].attributes[model].string: Too long: may not be more than 64 bytes",
        ),
        (
            lambda s: s["spec"]["devices"].append({"name": "cpudev000"}),
            'spec.devices[1].name: Duplicate value: "cpudev000"',
        ),
        (
            lambda s: s["spec"].update(allNodes=True),
            'spec: Invalid value: "{`nodeName`, `allNodes`}": exactly one of `nodeName`, '
            "`nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple "
            "fields are set",
        ),
        (
            lambda s: s["spec"]["pool"].update(resourceSliceCount=0),
            "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero",
        ),
    ],
)
def test_slice_validation(mutate: Any, message: str) -> None:
    body = slice_body()
    mutate(body)
    assert [e.render() for e in validate_resource_slice(body)] == [message]
    err = error_of(make_store().create, RESOURCE_SLICES, None, body)
    assert err.code == 422
    assert err.message == f'ResourceSlice.resource.k8s.io "s1" is invalid: {message}'
    assert err.details is not None and err.details["causes"][0]["message"] in message


def test_object_name_too_long() -> None:
    err = error_of(make_store().create, RESOURCE_SLICES, None, slice_body("a" * 254))
    assert err.message.endswith(
        'metadata.name: Invalid value: "' + "a" * 254 + '": must be no more than 253 characters'
    )


def test_two_problems_are_listed_in_brackets() -> None:
    body = slice_body()
    body["spec"]["driver"] = ""
    body["spec"]["pool"]["name"] = ""
    err = error_of(make_store().create, RESOURCE_SLICES, None, body)
    assert err.message == (
        'ResourceSlice.resource.k8s.io "s1" is invalid: '
        "[spec.driver: Required value, spec.pool.name: Required value]"
    )


def test_label_selector_forms() -> None:
    labels = {"metadata": {"labels": {"app": "web", "tier": "front"}}}
    cases = {
        "app=web": True,
        "app==web": True,
        "app!=web": False,
        "app in (db, web)": True,
        "app notin (web)": False,
        "tier": True,
        "!tier": False,
        "missing!=x": True,
        "app=web,tier in (front,back)": True,
        "": True,
    }
    for text, expected in cases.items():
        assert parse_label_selector(text).matches(labels) is expected, text
    with pytest.raises(ApiError) as info:
        parse_label_selector("app=we b")
    assert info.value.message == (
        "unable to parse requirement: invalid label value 'we b' in 'app=we b'"
    )


def test_unsupported_field_label() -> None:
    with pytest.raises(ApiError) as info:
        parse_field_selector("spec.other=x", RESOURCE_SLICES.field_labels)
    assert (info.value.code, info.value.message) == (400, "field label not supported: spec.other")


def test_patches() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}) == {
        "a": {"c": 2, "d": 3}
    }
    doc = {"spec": {"devices": [{"name": "a"}]}}
    ops = [
        {"op": "add", "path": "/spec/devices/-", "value": {"name": "b"}},
        {"op": "replace", "path": "/spec/devices/0/name", "value": "z"},
        {"op": "test", "path": "/spec/devices/1/name", "value": "b"},
        {"op": "remove", "path": "/spec/devices/1"},
    ]
    assert json_patch(doc, ops) == {"spec": {"devices": [{"name": "z"}]}}
    store = make_store()
    store.create(RESOURCE_SLICES, None, slice_body())
    patched = store.patch(
        RESOURCE_SLICES,
        None,
        "s1",
        JSON_PATCH,
        [{"op": "replace", "path": "/spec/pool/generation", "value": 5}],
    )
    assert patched["spec"]["pool"]["generation"] == 5
    err = error_of(store.patch, RESOURCE_SLICES, None, "s1", "application/apply-patch+yaml", {})
    assert err.code == 415


def test_faults_and_counters() -> None:
    faults = FaultInjector()
    faults.inject("get", "nodes", 2, status=503)
    assert faults.take("list", "nodes") is None
    assert faults.take("get", "nodes") is not None
    assert faults.take("get", "nodes") is not None
    assert faults.take("get", "nodes") is None
    with pytest.raises(ValueError, match="fault count must be at least 1, got 0"):
        faults.inject("get", "nodes", 0)
    counter = CallCounter()
    counter.record("get", "nodes")
    counter.record("list", "nodes")
    counter.record("get", "nodes")
    assert counter.get("get", "nodes") == 2
    assert counter.get("*", "nodes") == 3
    assert counter.snapshot() == {"get nodes": 2, "list nodes": 1}
