"""Server-side printing: the pod Table the real API server answers `kubectl get pods` with
(kubernetes pkg/printers/internalversion/printers.go), and the real kubectl showing it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_apiserver_openapi import apiserver, kubectl

from dracpu_sim.apiserver import tables
from dracpu_sim.apiserver.faults import CallCounter, FaultInjector
from dracpu_sim.apiserver.handler import Handler, Request, Response
from dracpu_sim.apiserver.resources import RESOURCES
from dracpu_sim.apiserver.store import ObjectStore

__all__ = ["apiserver"]  # the fixture, shared with the OpenAPI tests

KUBECTL_ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)
T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def _pod(name: str, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "creationTimestamp": "2023-11-14T22:13:20Z",
        },
        "spec": {"containers": [{"name": "a"}, {"name": "b"}], "nodeName": "n1"},
        "status": status,
    }


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (125, "2m5s"),
        (600, "10m"),
        (3 * 3600 - 1, "179m"),
        (3 * 3600 + 60, "3h1m"),
        (8 * 3600 + 59, "8h"),
        (50 * 3600, "2d2h"),
        (48 * 3600, "2d"),
        (10 * 86400, "10d"),
        (3 * 365 * 86400 + 86400, "3y1d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_human_duration_is_apimachinerys(seconds: float, text: str) -> None:
    assert tables.human_duration(seconds) == text


@pytest.mark.parametrize(
    ("accept", "version"),
    [
        (KUBECTL_ACCEPT, "v1"),
        ("application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json", "v1beta1"),
        ("application/json", None),
        ("", None),
        ("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io", None),
    ],
)
def test_table_version_from_accept(accept: str, version: str | None) -> None:
    assert tables.table_version(accept) == version


def test_pod_cells_running_pending_terminating_and_restarted() -> None:
    running = _pod(
        "web",
        phase="Running",
        podIPs=[{"ip": "10.0.0.7"}],
        containerStatuses=[
            {
                "name": "a",
                "ready": True,
                "state": {"running": {}},
                "restartCount": 2,
                "lastState": {"terminated": {"finishedAt": "2023-11-14T22:23:20Z"}},
            },
            {"name": "b", "ready": False, "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
        ],
    )
    assert tables.pod_cells(running, T0 + 3600) == [
        "web",
        "1/2",
        "CrashLoopBackOff",
        "2 (50m ago)",
        "60m",
        "10.0.0.7",
        "n1",
        "<none>",
        "<none>",
    ]
    pending = _pod("wait", phase="Pending")
    pending["spec"].pop("nodeName")
    assert tables.pod_cells(pending, T0 + 5)[:5] == ["wait", "0/2", "Pending", "0", "5s"]
    assert tables.pod_cells(pending, T0 + 5)[6] == "<none>"
    gone = _pod("gone", phase="Running")
    gone["metadata"]["deletionTimestamp"] = "2023-11-14T22:13:30Z"
    assert tables.pod_cells(gone, T0)[2] == "Terminating"


def _handler(now: float) -> Handler:
    store = ObjectStore()
    pods = next(r for r in RESOURCES if r.plural == "pods")
    pod = _pod("p")
    del pod["metadata"]["creationTimestamp"]
    store.create(pods, "default", pod)
    return Handler(store, FaultInjector(), CallCounter(), wall_clock=lambda: now)


def test_handler_answers_a_table_for_pods_only() -> None:
    handler = _handler(0)
    response = handler.handle(
        Request("GET", "/api/v1/namespaces/default/pods", {"accept": KUBECTL_ACCEPT})
    )
    assert isinstance(response, Response) and response.status == 200
    assert ("content-type", "application/json;as=Table;v=v1;g=meta.k8s.io") in response.headers
    doc = json.loads(response.body)
    assert (doc["kind"], doc["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [c["name"] for c in doc["columnDefinitions"]] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
        "IP",
        "Node",
        "Nominated Node",
        "Readiness Gates",
    ]
    assert [c["priority"] for c in doc["columnDefinitions"]] == [0] * 5 + [1] * 4
    [row] = doc["rows"]
    assert row["cells"][:4] == ["p", "0/2", "Pending", "0"]
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["name"] == "p"
    assert doc["metadata"]["resourceVersion"]
    one = handler.handle(
        Request(
            "GET",
            "/api/v1/namespaces/default/pods/p?includeObject=Object",
            {"accept": KUBECTL_ACCEPT},
        )
    )
    assert isinstance(one, Response)
    assert json.loads(one.body)["rows"][0]["object"]["kind"] == "Pod"
    plain = handler.handle(Request("GET", "/api/v1/namespaces/default/pods", {}))
    assert isinstance(plain, Response) and json.loads(plain.body)["kind"] == "PodList"
    nodes = handler.handle(Request("GET", "/api/v1/nodes", {"accept": KUBECTL_ACCEPT}))
    assert isinstance(nodes, Response) and json.loads(nodes.body)["kind"] == "NodeList"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_get_pods_shows_the_pod_columns(apiserver: Path) -> None:
    created = kubectl(apiserver, "create", "-f", "docs/examples/grouped-claim.yaml")
    assert created.returncode == 0, created.stderr
    got = kubectl(apiserver, "get", "pods")
    assert got.returncode == 0, got.stderr
    header, row = got.stdout.splitlines()
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    cells = row.split()
    assert cells[:4] == ["pinned", "0/1", "Pending", "0"]
    assert cells[4].endswith("s")
    wide = kubectl(apiserver, "get", "pods", "-o", "wide")
    assert wide.returncode == 0, wide.stderr
    header, row = wide.stdout.splitlines()
    assert header.split() == [
        "NAME",
        "READY",
        "STATUS",
        "RESTARTS",
        "AGE",
        "IP",
        "NODE",
        "NOMINATED",
        "NODE",
        "READINESS",
        "GATES",
    ]
    assert row.split()[5:] == ["<none>"] * 4
    everywhere = kubectl(apiserver, "get", "pods", "-A")
    assert everywhere.stdout.splitlines()[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert everywhere.stdout.splitlines()[1].split()[:2] == ["default", "pinned"]
    # Other kinds keep kubectl's own NAME / AGE columns.
    claims = kubectl(apiserver, "get", "resourceclaims")
    assert claims.stdout.splitlines()[0].split() == ["NAME", "AGE"]
