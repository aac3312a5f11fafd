"""The chaos plan: a pure function of the seed, a sane workload, every fault kind early."""

from __future__ import annotations

import logging

import pytest

from dracpu_sim.chaos import (
    FAULT_KINDS,
    ChaosResult,
    PodPlan,
    Violation,
    claim_object,
    describe_crash,
    format_result,
    main,
    make_plan,
    pod_object,
)


def test_same_seed_same_plan_other_seed_other_plan() -> None:
    a = make_plan(7, 60.0, mode="grouped")
    b = make_plan(7, 60.0, mode="grouped")
    assert a == b
    assert a.actions == b.actions and dict(a.pods) == dict(b.pods)
    c = make_plan(8, 60.0, mode="grouped")
    assert c.actions != a.actions
    # The mode is part of the seed: the two runs of `--mode both` are not the same run.
    assert make_plan(7, 60.0, mode="individual").actions != a.actions


def test_every_fault_kind_comes_first_then_by_weight() -> None:
    plan = make_plan(3, 40.0)
    faults = [a for a in plan.actions if a.kind in FAULT_KINDS]
    assert sorted(a.kind for a in faults[: len(FAULT_KINDS)]) == sorted(FAULT_KINDS)
    assert len(faults) > len(FAULT_KINDS)
    assert set(plan.fault_counts()) == set(FAULT_KINDS)
    assert all(0 < a.at < 40.0 for a in plan.actions)
    assert [a.at for a in plan.actions] == sorted(a.at for a in plan.actions)


def test_workload_creates_before_deleting_and_bounds_live_pods() -> None:
    plan = make_plan(11, 120.0, max_live_pods=5)
    created: dict[str, float] = {}
    live: set[str] = set()
    for action in plan.actions:
        if action.kind == "create-pod":
            assert action.pod not in created, "a pod name is used twice"
            created[action.pod] = action.at
            live.add(action.pod)
            assert len(live) <= 5
        elif action.kind == "delete-pod":
            assert action.pod in live, f"{action.pod} deleted before it was created"
            live.discard(action.pod)
    assert set(created) == set(plan.pods)
    kinds = [p.claim_cpus > 0 for p in plan.pods.values()]
    assert any(kinds) and not all(kinds), "both plain pods and claim holders"
    assert any(p.sidecar for p in plan.pods.values())
    assert live, "some pods live through the end and are checked after settling"


def test_bad_plan_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="chaos duration must be positive, got 0"):
        make_plan(1, 0)
    with pytest.raises(ValueError, match="chaos mode must be 'grouped' or 'individual', got 'x'"):
        make_plan(1, 10, mode="x")


def test_claim_and_pod_objects() -> None:
    pod = PodPlan("p0001", claim_cpus=4, full_cores=True, sidecar=True)
    grouped = claim_object(pod, "grouped")
    request = grouped["spec"]["devices"]["requests"][0]["exactly"]
    assert grouped["metadata"] == {"name": "p0001-cpus", "namespace": "default"}
    assert request == {"deviceClassName": "dra.cpu", "capacity": {"requests": {"dra.cpu/cpu": "4"}}}
    params = grouped["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert params["fullPCPUsOnly"] is True
    individual = claim_object(PodPlan("p2", claim_cpus=3), "individual")
    assert individual["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "dra.cpu",
        "count": 3,
    }
    assert "config" not in individual["spec"]["devices"]
    obj = pod_object(pod)
    assert obj["spec"]["resourceClaims"] == [{"name": "cpus", "resourceClaimName": "p0001-cpus"}]
    app, sidecar = obj["spec"]["containers"]
    assert app["resources"] == {"claims": [{"name": "cpus"}]}
    assert sidecar["name"] == "sidecar" and "resources" not in sidecar
    plain = pod_object(PodPlan("p3"))
    assert "resourceClaims" not in plain["spec"] and len(plain["spec"]["containers"]) == 1


def test_report_format() -> None:
    result = ChaosResult(mode="grouped", seed=1)
    result.faults.update({"nri-drop": 2, "api-409": 3})
    result.settle_ms = 812
    assert format_result(result) == "faults_injected: 5\ninvariant_violations: 0\nsettle_ms: 812\n"
    result.violations = [
        Violation("cpu-in-two-claims", "claim b shares CPUs 3 with another claim"),
        Violation("claim-leaked", "x"),
    ]
    assert format_result(result) == (
        "faults_injected: 5\n"
        "violation: cpu-in-two-claims: claim b shares CPUs 3 with another claim\n"
        "violation: claim-leaked: x\n"
        "invariant_violations: 2\n"
        "settle_ms: 812\n"
    )


def test_cli_rejects_a_bad_duration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--duration", "0"]) == 2
    assert capsys.readouterr().err == "chaos: --duration must be positive, got 0.0\n"
    assert main(["--intensity", "-1"]) == 2
    assert capsys.readouterr().err == "chaos: --intensity must be positive, got -1.0\n"
    # main() quiets logging while it runs and must leave it as it found it.
    assert logging.root.manager.disable == logging.NOTSET
    with pytest.raises(SystemExit) as exc:
        main(["--mode", "sideways"])
    assert exc.value.code == 2
    assert "invalid choice: 'sideways'" in capsys.readouterr().err


def test_a_crash_is_described_by_its_innermost_error_and_place() -> None:
    def closed_channel() -> None:
        raise ValueError("Cannot invoke RPC on closed channel!")

    try:
        try:
            closed_channel()
        except ValueError as inner:
            raise ExceptionGroup("nursery", [ExceptionGroup("kubelet", [inner])]) from None
    except ExceptionGroup as group:
        text = describe_crash(group)
    assert text.startswith("ValueError: Cannot invoke RPC on closed channel! at ")
    assert text.endswith("test_plan.py:" + str(closed_channel.__code__.co_firstlineno + 1))
