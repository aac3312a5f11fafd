"""The loopback API server's pure request handler under hypothesis.

Any method, target, header and body gives a ``Response`` (a Kubernetes ``Status`` for
errors), a ``WatchStart`` or an injected ``DropConnection``: never an exception, which the
HTTP shell would turn into a dropped connection and a client retry storm.
"""

from __future__ import annotations

import gc
import json
import types

from fuzzing import bounded, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from dracpu_sim.apiserver.faults import CallCounter, FaultInjector
from dracpu_sim.apiserver.handler import Handler, Request, Response, WatchStart
from dracpu_sim.apiserver.store import ObjectStore

COLLECTIONS = [
    "/api/v1/nodes",
    "/api/v1/pods",
    "/api/v1/namespaces/default/pods",
    "/apis/resource.k8s.io/v1/resourceslices",
    "/apis/resource.k8s.io/v1/deviceclasses",
    "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
    "/apis/resource.k8s.io/v1beta1/resourceslices",
]
segments = st.one_of(
    st.sampled_from(["n1", "status", "binding", "..", ".", "", "%2F", "namespaces", "x" * 300]),
    st.text(max_size=8),
)
names = st.sampled_from(["n1", "n2", "default", "x" * 300, "N!"])
routes = st.one_of(
    st.sampled_from(COLLECTIONS),
    st.builds(lambda base, name: f"{base}/{name}", st.sampled_from(COLLECTIONS), names),
    st.builds(
        lambda base, name, sub: f"{base}/{name}/{sub}",
        st.sampled_from(COLLECTIONS),
        names,
        st.sampled_from(["status", "binding"]),
    ),
)
targets = st.one_of(
    routes,
    st.builds(lambda route, query: route + query, routes, st.just("?watch=1")),
    st.builds(
        lambda base, extra, query: base + "".join("/" + s for s in extra) + query,
        st.sampled_from([*COLLECTIONS, "/api", "/apis", "/version", "/", "", "/apis/x/y/z"]),
        st.lists(segments, max_size=3),
        st.one_of(
            st.just(""),
            st.builds(
                lambda pairs: "?" + "&".join(f"{k}={v}" for k, v in pairs),
                st.lists(
                    st.tuples(
                        st.sampled_from(
                            [
                                "watch",
                                "labelSelector",
                                "fieldSelector",
                                "limit",
                                "continue",
                                "resourceVersion",
                                "resourceVersionMatch",
                                "timeoutSeconds",
                                "gracePeriodSeconds",
                                "allowWatchBookmarks",
                                "sendInitialEvents",
                            ]
                        ),
                        st.one_of(
                            st.sampled_from(
                                [
                                    "true",
                                    "1",
                                    "-1",
                                    "a=b",
                                    "a in (x",
                                    "!a,b!=c",
                                    "metadata.name=n1",
                                    "spec.nodeName==x",
                                    "1e9",
                                    "9" * 5000,
                                    "%00",
                                    "NotOlderThan",
                                ]
                            ),
                            st.text(max_size=10),
                        ),
                    ),
                    max_size=4,
                ),
            ),
        ),
    ),
    st.text(max_size=40),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "metadata",
                    "name",
                    "namespace",
                    "spec",
                    "status",
                    "kind",
                    "apiVersion",
                    "labels",
                    "resourceVersion",
                    "nodeName",
                    "target",
                    "devices",
                    "allocation",
                    "finalizers",
                    "uid",
                ]
            )
            | st.text(max_size=6),
            inner,
            max_size=5,
        )
    ),
    max_leaves=25,
)
objects = st.fixed_dictionaries(
    {},
    optional={
        "apiVersion": st.sampled_from(["v1", "resource.k8s.io/v1", "x"]) | json_values,
        "kind": st.sampled_from(
            ["Node", "Pod", "ResourceClaim", "ResourceSlice", "Binding", "DeleteOptions"]
        )
        | json_values,
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "name": names | json_values,
                "namespace": st.just("default") | json_values,
                "labels": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2)
                | json_values,
                "resourceVersion": st.sampled_from(["1", "0", "x"]) | json_values,
                "finalizers": st.lists(st.text(max_size=5), max_size=2) | json_values,
                "uid": json_values,
            },
        )
        | json_values,
        "spec": json_values,
        "status": json_values,
        "target": st.fixed_dictionaries({"name": names | json_values}) | json_values,
        "gracePeriodSeconds": st.integers(-5, 5) | json_values,
    },
)
bodies = st.one_of(
    objects.map(lambda v: json.dumps(v).encode()),
    st.lists(objects, max_size=2).map(lambda v: json.dumps(v).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(
        lambda name, extra: json.dumps(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, **extra}}
        ).encode(),
        st.sampled_from(["n1", "", "N!", "x" * 300]),
        st.dictionaries(
            st.sampled_from(["labels", "resourceVersion", "uid", "finalizers"]),
            json_values,
            max_size=2,
        ),
    ),
    st.binary(max_size=60),
    st.builds(lambda depth: b"[" * depth + b"]" * depth, st.integers(1, 50_000)),
)
requests = st.builds(
    Request,
    method=st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "get"]),
    target=targets,
    headers=st.dictionaries(
        st.sampled_from(["content-type", "accept"]),
        st.sampled_from(
            [
                "application/json",
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
                "application/json-patch+json",
                "application/apply-patch+yaml",
                "text/plain",
                "",
            ]
        ),
        max_size=2,
    ),
    body=bodies,
)


@fuzz_settings(300)
@given(st.lists(requests, min_size=1, max_size=6))
def test_any_request_gets_an_answer(batch: list[Request]) -> None:
    handler = Handler(ObjectStore(), FaultInjector(), CallCounter())
    with bounded():
        for request in batch:
            answer = handler.handle(request)
            assert isinstance(answer, Response | WatchStart)
            if isinstance(answer, Response):
                assert 200 <= answer.status < 600
                doc = json.loads(answer.body)
                if answer.status >= 400:
                    assert doc["kind"] == "Status" and doc["code"] == answer.status
                    assert doc["message"]


coherent = st.one_of(
    st.builds(
        lambda base, body: Request("POST", base, {}, body), st.sampled_from(COLLECTIONS), bodies
    ),
    st.builds(
        lambda method, base, name, sub, ctype, body: Request(
            method, f"{base}/{name}{sub}", {"content-type": ctype}, body
        ),
        st.sampled_from(["PUT", "PATCH", "DELETE", "GET"]),
        st.sampled_from(COLLECTIONS),
        st.sampled_from(["n1", "n2"]),
        st.sampled_from(["", "/status"]),
        st.sampled_from(
            [
                "application/merge-patch+json",
                "application/json-patch+json",
                "application/strategic-merge-patch+json",
                "text/plain",
            ]
        ),
        bodies,
    ),
    st.builds(
        lambda base, name, body: Request("POST", f"{base}/{name}/binding", {}, body),
        st.just("/api/v1/namespaces/default/pods"),
        st.sampled_from(["n1", "n2"]),
        bodies,
    ),
)
seed_objects = [
    ("/api/v1/nodes", {"metadata": {"name": "n1"}}),
    ("/api/v1/namespaces/default/pods", {"metadata": {"name": "n1"}, "spec": {}}),
    (
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
        {"metadata": {"name": "n1"}, "spec": {}},
    ),
]


@fuzz_settings(300)
@given(st.lists(coherent, min_size=1, max_size=6))
def test_well_routed_requests_with_any_body_get_an_answer(batch: list[Request]) -> None:
    handler = Handler(ObjectStore(), FaultInjector(), CallCounter())
    for path, obj in seed_objects:
        assert handler.handle(Request("POST", path, {}, json.dumps(obj).encode())).status == 201
    with bounded():
        for request in batch:
            answer = handler.handle(request)
            assert isinstance(answer, Response)
            doc = json.loads(answer.body)
            if answer.status >= 400:
                assert doc["kind"] == "Status" and doc["code"] == answer.status


def test_metadata_of_the_wrong_type_is_a_bad_request() -> None:
    handler = Handler(ObjectStore(), FaultInjector(), CallCounter())
    answer = handler.handle(Request("POST", "/api/v1/nodes", {}, b'{"metadata": {"name": 5}}'))
    assert isinstance(answer, Response) and answer.status == 400
    assert json.loads(answer.body)["message"] == (
        "json: cannot unmarshal number into Go struct field ObjectMeta.metadata.name of type string"
    )


def test_deeply_nested_body_is_a_bad_request() -> None:
    handler = Handler(ObjectStore(), FaultInjector(), CallCounter())
    answer = handler.handle(Request("POST", "/api/v1/nodes", {}, b"[" * 100_000 + b"]" * 100_000))
    assert isinstance(answer, Response) and answer.status == 400
    assert "nested too deeply" in json.loads(answer.body)["message"]


def test_error_answers_do_not_accumulate_memory() -> None:
    """Found by atheris (out of memory): re-raising one module-level ApiError chained every
    request's traceback, and with it the request's frames, onto that one object."""
    handler = Handler(ObjectStore(), FaultInjector(), CallCounter())

    def live_tracebacks() -> int:
        gc.collect()
        return sum(isinstance(o, types.TracebackType) for o in gc.get_objects())

    handler.handle(Request("GET", "/nope", {}))
    before = live_tracebacks()
    for target in ["/nope", "/api/v1/nosuch", "/api/v1/nodes/a/b/c"] * 200:
        answer = handler.handle(Request("GET", target, {}))
        assert isinstance(answer, Response) and answer.status == 404
    for _ in range(200):
        answer = handler.handle(Request("POST", "/api/v1/nodes/n1", {}))
        assert isinstance(answer, Response) and answer.status == 405
    assert live_tracebacks() - before < 10
