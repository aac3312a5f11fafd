"""The contract metrics: names, help strings, types, labels and exposition."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, generate_latest

from dracpu.metrics import DriverMetrics, describe_metrics_json


def test_introspect_json_is_exact() -> None:
    text = describe_metrics_json()
    assert text.endswith("]\n")
    doc = json.loads(text)
    assert [(m["name"], m["type"], m["labels"]) for m in doc] == [
        ("dra_cpu_allocated_cpus", "gauge", []),
        ("dra_cpu_available_cpus", "gauge", []),
        ("dra_cpu_reserved_cpus", "gauge", []),
        ("dra_cpu_resource_claims_active", "gauge", []),
        ("dra_cpu_prepare_claims_total", "counter", ["result"]),
        ("dra_cpu_unprepare_claims_total", "counter", ["result"]),
        ("dra_cpu_prepare_claim_duration_seconds", "histogram", []),
        ("dra_cpu_claim_allocated_cpus", "histogram", []),
    ]
    assert {m["stability"] for m in doc} == {"ALPHA"}
    assert list(doc[0]) == ["name", "type", "stability", "help", "labels"]
    assert doc[1]["help"] == (
        "Number of CPUs available for allocation after reserved and active claim CPUs are excluded."
    )
    assert text.startswith('[\n  {\n    "name": "dra_cpu_allocated_cpus",\n')


def test_exposition_has_every_series_from_start() -> None:
    registry = CollectorRegistry()
    m = DriverMetrics(registry)
    m.set_snapshot(allocated=4, available=10, reserved=2, active=1)
    m.count_prepare("success")
    m.count_prepare("weird")
    m.claim_allocated_cpus.observe(4)
    out = generate_latest(registry).decode()
    assert "dra_cpu_allocated_cpus 4.0" in out
    assert "dra_cpu_available_cpus 10.0" in out
    assert "dra_cpu_reserved_cpus 2.0" in out
    assert "dra_cpu_resource_claims_active 1.0" in out
    assert 'dra_cpu_prepare_claims_total{result="success"} 1.0' in out
    assert 'dra_cpu_prepare_claims_total{result="unknown"} 1.0' in out
    assert 'dra_cpu_prepare_claims_total{result="error"} 0.0' in out
    for result in ("success", "error", "unknown"):
        assert f'dra_cpu_unprepare_claims_total{{result="{result}"}} 0.0' in out
    assert 'dra_cpu_claim_allocated_cpus_bucket{le="4.0"} 1.0' in out
    assert 'dra_cpu_claim_allocated_cpus_bucket{le="2.0"} 0.0' in out
    assert 'dra_cpu_prepare_claim_duration_seconds_bucket{le="0.005"} 0.0' in out
    assert (
        "# HELP dra_cpu_reserved_cpus Number of CPUs reserved and excluded from DRA management."
        in out
    )


def test_dracpu_own_metrics_are_exposed_but_not_in_the_contract_list() -> None:
    registry = CollectorRegistry()
    m = DriverMetrics(registry)
    m.count_fallback_write("success", "runtime-reported")
    m.count_fallback_write("error", "verify-mismatch")
    m.count_fallback_write("odd", "drift")
    m.pool_convergence.observe(0.02)
    m.count_drift_repair("odd")
    m.drifted_containers.set(3)
    m.nri_reconnects.inc()
    m.count_checkpoint_write("success")
    out = generate_latest(registry).decode()
    fallback = "dracpu_cgroup_fallback_writes_total"
    assert f'{fallback}{{cause="runtime-reported",result="success"}} 1.0' in out
    assert f'{fallback}{{cause="verify-mismatch",result="error"}} 1.0' in out
    assert f'{fallback}{{cause="drift",result="unknown"}} 1.0' in out
    assert f'{fallback}{{cause="drift",result="success"}} 0.0' in out
    assert 'dracpu_pool_convergence_seconds_bucket{le="0.025"} 1.0' in out
    assert "dracpu_cgroup_cpuset_hierarchy_found 1.0" in out
    assert 'dracpu_cgroup_drift_repairs_total{result="unknown"} 1.0' in out
    assert 'dracpu_cgroup_drift_repairs_total{result="success"} 0.0' in out
    assert "dracpu_cgroup_drifted_containers 3.0" in out
    assert "dracpu_nri_reconnects_total 1.0" in out
    assert 'dracpu_checkpoint_writes_total{result="success"} 1.0' in out
    names = {d["name"] for d in json.loads(describe_metrics_json())}
    assert not any(n.startswith("dracpu_") for n in names)
