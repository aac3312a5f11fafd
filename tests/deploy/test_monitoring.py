"""deploy/overlays/monitoring and monitoring-servicemonitor: the grouped install plus
Prometheus operator objects and the Grafana dashboard.

The dashboard can never drift from the daemon: every series a panel queries must be one
that `DriverMetrics` exposes on a fresh registry (the `/metrics` text the daemon serves),
and every metric dracpu defines must have a panel. The Prometheus operator's kinds are not
in Kubernetes' schemas: they are checked against the fields of their CRDs that dracpu uses
(prometheus-operator pkg/apis/monitoring/v1: podmonitor_types.go, servicemonitor_types.go,
types.go's RelabelConfig), with every other field refused.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from deploy_render import DEPLOY, MONITORING_OVERLAYS, by_kind
from prometheus_client import CollectorRegistry

from dracpu.irq.metrics import IRQ_METRIC_DEFINITIONS, IrqMetrics
from dracpu.metrics import DRACPU_METRIC_DEFINITIONS, METRIC_DEFINITIONS, DriverMetrics

Render = Callable[[str], list[dict[str, Any]]]

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = DEPLOY / "components" / "grafana-dashboard" / "dracpu-dashboard.json"
K8S_VERSION = "1.34"
ADDED = {
    "monitoring": ["ConfigMap", "PodMonitor"],
    "monitoring-servicemonitor": ["ConfigMap", "Service", "ServiceMonitor"],
}

# Prometheus durations, the CRDs' pattern for interval and scrapeTimeout.
_DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
    r"(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
_RELABELING = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer"},
        "replacement": {"type": "string"},
        "action": {"type": "string"},
    },
}
_ENDPOINT_FIELDS = {
    "port": {"type": "string"},
    "path": {"type": "string"},
    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
    "interval": {"type": "string", "pattern": _DURATION},
    "scrapeTimeout": {"type": "string", "pattern": _DURATION},
    "honorLabels": {"type": "boolean"},
    "relabelings": {"type": "array", "items": _RELABELING},
    "metricRelabelings": {"type": "array", "items": _RELABELING},
}
_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array"},
    },
}


def _crd_schema(kind: str, endpoints_key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["selector"],
                "properties": {
                    "selector": _SELECTOR,
                    "namespaceSelector": {"type": "object"},
                    "jobLabel": {"type": "string"},
                    endpoints_key: {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": _ENDPOINT_FIELDS,
                        },
                    },
                },
            },
        },
    }


CRD_SCHEMAS = {
    "PodMonitor": _crd_schema("PodMonitor", "podMetricsEndpoints"),
    "ServiceMonitor": _crd_schema("ServiceMonitor", "endpoints"),
}


def validate(obj: dict[str, Any]) -> None:
    if obj["kind"] in CRD_SCHEMAS:
        jsonschema.validate(obj, CRD_SCHEMAS[obj["kind"]])
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]},
            K8S_VERSION,
            strict=True,
        )
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# -- the overlays -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", MONITORING_OVERLAYS)
def test_monitoring_is_the_grouped_install_plus_its_objects(render: Render, name: str) -> None:
    grouped = render("grouped")
    objects = render(name)
    rest = [o for o in objects if o not in grouped]
    # Every object of the grouped install is there, unchanged; the rest is added.
    assert all(o in objects for o in grouped)
    assert len(objects) == len(grouped) + len(rest)
    assert sorted(o["kind"] for o in rest) == ADDED[name]
    for obj in rest:
        assert obj["metadata"]["namespace"] == "kube-system", obj["kind"]
        assert obj["metadata"]["labels"]["app"] == "dracpu", obj["kind"]


@pytest.mark.parametrize("name", MONITORING_OVERLAYS)
def test_every_object_validates(render: Render, name: str) -> None:
    for obj in render(name):
        validate(obj)


def test_the_crd_check_is_not_vacuous(render: Render) -> None:
    monitor = by_kind(render("monitoring"), "PodMonitor")
    monitor["spec"]["podMetricsEndpoint"] = monitor["spec"].pop("podMetricsEndpoints")
    with pytest.raises(jsonschema.ValidationError, match="podMetricsEndpoint"):
        validate(monitor)
    monitor = by_kind(render("monitoring"), "PodMonitor")
    monitor["spec"]["podMetricsEndpoints"][0]["interval"] = "30 seconds"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = by_kind(objects, "DaemonSet")["spec"]["template"]
    container: dict[str, Any] = pod["spec"]["containers"][0]
    return container


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_podmonitor_scrapes_the_daemon_metrics_port(render: Render) -> None:
    objects = render("monitoring")
    monitor = by_kind(objects, "PodMonitor")
    pod_labels = by_kind(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert _matches(monitor["spec"]["selector"], pod_labels)
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"] for p in _container(objects)["ports"]}
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in (
        endpoint["relabelings"]
    )


def test_servicemonitor_reaches_the_pods_through_its_service(render: Render) -> None:
    objects = render("monitoring-servicemonitor")
    service = by_kind(objects, "Service")
    monitor = by_kind(objects, "ServiceMonitor")
    pod_labels = by_kind(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None"
    assert all(pod_labels.get(k) == v for k, v in service["spec"]["selector"].items())
    assert _matches(monitor["spec"]["selector"], service["metadata"]["labels"])
    # The selector picks this Service only, not every object labelled app=dracpu that
    # might be a Service in a user's overlay; here the Service is the one there is.
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = service["spec"]["ports"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
    container_ports = {p["name"]: p["containerPort"] for p in _container(objects)["ports"]}
    assert port["targetPort"] in container_ports
    assert port["port"] == container_ports[port["targetPort"]]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in (
        endpoint["relabelings"]
    )


@pytest.mark.parametrize("name", MONITORING_OVERLAYS)
def test_dashboard_configmap_is_what_the_grafana_sidecar_loads(render: Render, name: str) -> None:
    configmaps = [o for o in render(name) if o["kind"] == "ConfigMap"]
    (dashboard,) = [c for c in configmaps if "grafana_dashboard" in c["metadata"]["labels"]]
    assert dashboard["metadata"]["name"] == "dracpu-grafana-dashboard"  # no hash suffix
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert set(dashboard["data"]) == {DASHBOARD.name}
    assert json.loads(dashboard["data"][DASHBOARD.name]) == json.loads(DASHBOARD.read_text())


# -- the dashboard ----------------------------------------------------------------------------

_SERIES = re.compile(r"\b((?:dra_cpu|dracpu)_[A-Za-z0-9_]+)\b")
_SELECTED = re.compile(r"\b([A-Za-z_:][A-Za-z0-9_:]*)\{")


def exposed_series() -> set[str]:
    """Every sample name the daemon's metrics expose on a fresh registry."""
    registry = CollectorRegistry()
    DriverMetrics(registry)
    IrqMetrics(registry)  # the interrupt service's, on the same registry in the daemon
    return {
        sample.name
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def panel_queries(dashboard: dict[str, Any]) -> dict[str, list[str]]:
    """Panel title → its PromQL expressions (rows hold no queries)."""
    return {
        panel["title"]: [t["expr"] for t in panel["targets"]]
        for panel in dashboard["panels"]
        if panel["type"] != "row"
    }


def unknown_series(dashboard: dict[str, Any], exposed: set[str]) -> dict[str, set[str]]:
    """Panel title → the series its queries name that the daemon does not expose."""
    found: dict[str, set[str]] = {}
    for title, exprs in panel_queries(dashboard).items():
        for expr in exprs:
            named = set(_SERIES.findall(expr)) | set(_SELECTED.findall(expr))
            assert named, f"{title}: {expr!r} names no metric"
            missing = named - exposed
            if missing:
                found.setdefault(title, set()).update(missing)
    return found


def _family(series: str, histograms: set[str]) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if series.endswith(suffix) and series.removesuffix(suffix) in histograms:
            return series.removesuffix(suffix)
    return series


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_every_panel_queries_series_the_daemon_exposes(dashboard: dict[str, Any]) -> None:
    assert unknown_series(dashboard, exposed_series()) == {}


def test_every_metric_has_a_panel(dashboard: dict[str, Any]) -> None:
    definitions = METRIC_DEFINITIONS + DRACPU_METRIC_DEFINITIONS + IRQ_METRIC_DEFINITIONS
    histograms = {d.name for d in definitions if d.type == "histogram"}
    shown = {
        _family(series, histograms)
        for exprs in panel_queries(dashboard).values()
        for expr in exprs
        for series in _SERIES.findall(expr)
    }
    assert shown == {d.name for d in definitions}


def test_the_contract_metrics_are_the_ones_introspect_lists(dashboard: dict[str, Any]) -> None:
    """`dracpu introspect metrics` (what users are told to look at) lists the contract
    metrics; each of them is on the dashboard."""
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "dracpu"), "introspect", "metrics"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    listed = {m["name"] for m in json.loads(proc.stdout)}
    assert listed == {d.name for d in METRIC_DEFINITIONS}
    text = json.dumps(panel_queries(dashboard))
    for name in listed:
        assert name in text, name


def test_the_drift_check_is_not_vacuous(dashboard: dict[str, Any]) -> None:
    """A misspelt or renamed metric is caught, and so is a histogram suffix on a gauge."""
    broken = json.loads(json.dumps(dashboard))
    panel = next(p for p in broken["panels"] if p["type"] != "row")
    panel["targets"][0]["expr"] = 'sum(dra_cpu_allocated_cpu{node=~"$node"})'
    assert unknown_series(broken, exposed_series()) == {panel["title"]: {"dra_cpu_allocated_cpu"}}
    panel["targets"][0]["expr"] = 'sum(rate(dra_cpu_allocated_cpus_bucket{node=~"$node"}[5m]))'
    assert unknown_series(broken, exposed_series()) == {
        panel["title"]: {"dra_cpu_allocated_cpus_bucket"}
    }


def test_dashboard_shape(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "dracpu" and dashboard["title"] == "dracpu"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    # The node variable reads the label both monitors' relabelings add.
    assert variables["node"]["definition"] == "label_values(dra_cpu_available_cpus, node)"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert 'node=~"$node"' in target["expr"], panel["title"]
