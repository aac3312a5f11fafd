"""The endpoints as a pure function: /healthz, /readyz, /metrics, /debug/state, 404, 405."""

from __future__ import annotations

import msgspec
import pytest
from fixed_views import FixedDebug, fixed_readiness
from prometheus_client import CollectorRegistry

from dracpu.http import HTTPApp, Request, Response
from dracpu.metrics import DriverMetrics


def get(app: HTTPApp, target: str, method: str = "GET", **headers: str) -> Response:
    return app.handle(Request(method=method, target=target, headers=tuple(headers.items())))


def test_healthz_is_503_until_started_then_200() -> None:
    app = HTTPApp()
    assert get(app, "/healthz") == Response(status=503)
    assert not app.started
    app.mark_started()
    assert get(app, "/healthz") == Response(status=200)
    assert get(app, "/healthz", method="HEAD").status == 200


def test_readyz_ok_when_every_component_is_ready() -> None:
    state = {"kubelet-registration": True, "nri": True, "slices": True}
    app = HTTPApp(readiness=fixed_readiness(state))
    response = get(app, "/readyz")
    assert (response.status, response.body) == (200, b"ok")
    assert response.content_type == "text/plain; charset=utf-8"


def test_readyz_lists_components_when_not_ready() -> None:
    state = {"slices": False, "kubelet-registration": True, "nri": False}
    reasons = {"nri": "not synchronized", "slices": "", "kubelet-registration": ""}
    app = HTTPApp(readiness=fixed_readiness(state, reasons))
    response = get(app, "/readyz")
    assert response.status == 503
    assert response.body.decode() == (
        "[+] kubelet-registration ok\n"
        "[-] nri: not synchronized\n"
        "[-] slices: not ready\n"
        "readyz check failed\n"
    )


def test_readyz_verbose_when_ready() -> None:
    app = HTTPApp(readiness=fixed_readiness({"nri": True}))
    response = get(app, "/readyz?verbose")
    assert (response.status, response.body) == (200, b"[+] nri ok\nreadyz check passed\n")


def test_readyz_follows_the_supervisor() -> None:
    from dracpu.nursery import Supervisor

    sup = Supervisor()
    registration, nri, slices = (
        sup.readiness.declare(name) for name in ("kubelet-registration", "nri", "slices")
    )
    app = HTTPApp(readiness=sup.readiness.view())
    assert get(app, "/readyz").status == 503
    registration.set_ready()
    nri.set_not_ready("not synchronized")
    assert b"[-] nri: not synchronized\n" in get(app, "/readyz").body
    nri.set_ready()
    slices.set_ready()
    assert get(app, "/readyz").body == b"ok"
    nri.set_not_ready("runtime not connected")  # and back
    assert get(app, "/readyz").status == 503


def test_readiness_view_error_is_a_500_and_the_app_keeps_serving() -> None:
    class Broken:
        def components(self) -> dict[str, bool]:
            raise RuntimeError("registry gone")

        def reasons(self) -> dict[str, str]:
            return {}

    app = HTTPApp(readiness=Broken())
    response = get(app, "/readyz")
    assert response.status == 500
    assert response.body == b"500 internal server error: /readyz: registry gone\n"
    assert get(app, "/healthz").status == 503


def test_metrics_prometheus_text() -> None:
    registry = CollectorRegistry()
    metrics = DriverMetrics(registry)
    metrics.set_snapshot(allocated=4, available=60, reserved=2, active=1)
    app = HTTPApp(registry=registry)
    response = get(app, "/metrics")
    assert response.status == 200
    assert response.content_type == "text/plain; version=0.0.4; charset=utf-8"
    text = response.body.decode()
    assert "# HELP dra_cpu_allocated_cpus Number of CPUs currently allocated" in text
    assert "dra_cpu_allocated_cpus 4.0" in text
    for result in ("success", "error", "unknown"):
        assert f'dra_cpu_prepare_claims_total{{result="{result}"}} 0.0' in text
    head = get(app, "/metrics", method="HEAD")
    assert head.status == 200 and head.content_type == response.content_type


def test_metrics_openmetrics_when_asked() -> None:
    registry = CollectorRegistry()
    DriverMetrics(registry)
    response = get(HTTPApp(registry=registry), "/metrics", accept="application/openmetrics-text")
    assert response.content_type is not None
    assert response.content_type.startswith("application/openmetrics-text")
    assert response.body.endswith(b"# EOF\n")


class Claim(msgspec.Struct):
    uid: str
    cpus: str


def test_debug_state_json() -> None:
    state = {"claims": [Claim(uid="u1", cpus="2-3")], "sharedPool": "0-1,4-7"}
    app = HTTPApp.debug_only(FixedDebug(state))
    assert app.paths == ("/debug/state",)
    response = get(app, "/debug/state")
    assert response.status == 200
    assert response.content_type == "application/json"
    assert msgspec.json.decode(response.body) == {
        "claims": [{"uid": "u1", "cpus": "2-3"}],
        "sharedPool": "0-1,4-7",
    }
    assert response.body.endswith(b"\n")
    assert get(app, "/healthz").status == 404  # the debug listener serves nothing else
    assert get(app, "/metrics").status == 404


def test_debug_state_not_on_the_main_app() -> None:
    app = HTTPApp(registry=CollectorRegistry(), readiness=fixed_readiness({}))
    assert set(app.paths) == {"/healthz", "/readyz", "/metrics"}
    assert get(app, "/debug/state").status == 404


def test_debug_state_that_cannot_be_encoded() -> None:
    app = HTTPApp.debug_only(FixedDebug({"x": object()}))
    response = get(app, "/debug/state")
    assert response.status == 500
    assert response.body.startswith(b"500 internal server error: cannot encode debug state: ")
    assert b"object" in response.body


def test_unknown_path_is_404() -> None:
    response = get(HTTPApp(), "/nope")
    assert (response.status, response.body) == (404, b"404 page not found\n")
    assert ("x-content-type-options", "nosniff") in response.headers


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS", "PATCH"])
def test_wrong_method_is_405_with_allow(method: str) -> None:
    response = get(HTTPApp(), "/healthz", method=method)
    assert response.status == 405
    assert response.body == b"405 method not allowed\n"
    assert ("allow", "GET, HEAD") in response.headers


def test_query_and_absolute_form_targets_route_by_path() -> None:
    app = HTTPApp()
    app.mark_started()
    assert get(app, "/healthz?x=1").status == 200
    assert get(app, "http://node:8080/healthz").status == 200


def test_app_construction_errors() -> None:
    with pytest.raises(ValueError, match="an HTTPApp needs at least one endpoint"):
        HTTPApp(healthz=False)
