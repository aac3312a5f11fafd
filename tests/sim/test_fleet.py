"""The simulated fleet (docs/scale.md): a short run holds the properties the long one
measures, and the figures' arithmetic. Properties only: times depend on the machine."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dracpu.cpuset import CPUSet
from dracpu_sim.apiserver.faults import RequestRecord
from dracpu_sim.fleet import FleetOptions, FleetResult, build_parser, main, run_fleet
from dracpu_sim.fleet.report import peak_rate, percentile, phase_counts
from dracpu_sim.fleet.shapes import FIXTURES, SliceFactory, load_shapes


async def test_short_fleet_run_is_cheap_at_rest_and_converges_after_every_fault() -> None:
    opts = FleetOptions(
        nodes=50,
        duration=6.0,
        seed=7,
        resync_interval=2.0,
        reconnect_spread=1.0,
        restart_downtime=1.0,
        max_rps=50.0,  # start-up and restart go past it: 429s, Retry-After honoured
    )
    r = await run_fleet(opts)

    assert r.objects_total == 50 and r.slices_per_node == 1  # grouped, 768 CPUs
    assert r.shapes == {"epyc-2s-768": 50}
    assert r.watches_open == 50
    # at rest: the resync ran on every node, from the cache; nothing but watch renewals
    assert r.idle_resyncs_from_cache >= 50
    assert r.idle_per_node_hour["list"] == 0
    assert all(r.idle_per_node_hour[v] == 0 for v in ("create", "update", "delete", "get"))
    assert 0 < r.requests_per_node_hour_idle <= 2
    # every topology change reached the server: one list and one update each
    assert r.topology_changes == 20 == len(r.topology_change_s)
    assert r.topology_changes_unapplied == 0
    assert r.topology is not None
    assert r.topology.ok_by_verb == {"list": 20, "update": 20}
    # every watch dropped: each node watches again from its version, no relist
    assert r.watch_drop is not None
    assert r.watch_drop.ok_by_verb == {"watch": 50}
    assert "list" not in r.watch_drop.by_verb
    # restart: everyone converged, the deleted slices are back, nobody stampeded
    assert r.restart is not None
    assert r.restart_unconverged_nodes == 0
    assert r.restart_deleted_slices >= 1
    assert r.restart.ok_by_verb.get("create", 0) == r.restart_deleted_slices
    assert r.restart.max_per_agent <= 10
    assert r.restart_max_node_attempts <= 10
    # roll-out: every node restarted, read its pool and wrote nothing
    assert r.rollout is not None
    assert r.rollout_unconverged_nodes == 0
    assert r.rollout.writes == 0
    assert r.rollout.by_verb.get("list", 0) >= 50
    assert r.throttled_total > 0


def test_cli_parses_into_options() -> None:
    from dracpu_sim.fleet.cli import options_from

    args = build_parser().parse_args(
        ["--nodes", "1000", "--cpus-per-node", "0", "--mode", "individual", "--duration", "60"]
    )
    opts = options_from(args)
    assert (opts.nodes, opts.cpus_per_node, opts.mode, opts.duration) == (
        1000,
        None,
        "individual",
        60.0,
    )
    assert (opts.seed, opts.max_rps, opts.resync_interval) == (1, 300.0, 30.0)
    assert options_from(build_parser().parse_args(["--max-rps", "0"])).max_rps is None


def test_cli_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--nodes", "0"]) == 2
    assert capsys.readouterr().err == "error: --nodes must be at least 1, got 0\n"
    assert main(["--duration", "-1"]) == 2
    assert "--duration must be > 0 seconds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--mode", "both"])


def test_cli_prints_name_value_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def fake_run(opts: FleetOptions) -> FleetResult:
        result = FleetResult(nodes=opts.nodes, mode=opts.mode, cpus_per_node=768, shapes={})
        result.idle_per_node_hour = {"list": 0.0, "watch": 1.25}
        result.topology_change_s = [0.1, 0.2]
        result.topology_changes = 2
        return result

    monkeypatch.setattr("dracpu_sim.fleet.cli.run_fleet", fake_run)
    assert main(["--nodes", "3"]) == 0
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    for name in ("objects_total", "requests_per_node_hour_idle", "watches_open"):
        assert name in lines
    assert lines["nodes"] == "3"
    assert lines["requests_per_node_hour_idle"] == "1.250"
    assert lines["requests_per_node_hour_idle_watch"] == "1.250"
    assert lines["topology_change_p99_s"] == "0.200"


def test_cli_names_the_cpu_counts_there_are(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--cpus-per-node", "7"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no machine under ") and "epyc-2s-768=768" in err


def test_shapes_and_slices_come_from_the_fixtures() -> None:
    shapes = load_shapes(FIXTURES, 128)
    assert [s.name for s in shapes] == ["epyc-nps1", "epyc-nps4"]
    assert len(load_shapes(FIXTURES, None)) >= 9
    (big,) = load_shapes(FIXTURES, 768)
    factory = SliceFactory("individual")
    slices = factory.slices(big, "node-00001", "uid-1")
    assert len(slices) == 6
    assert {s["spec"]["nodeName"] for s in slices} == {"node-00001"}
    fewer = factory.slices(big, "node-00001", "uid-1", reserved=CPUSet([5]))
    assert sum(len(s["spec"]["devices"]) for s in fewer) == 767
    assert factory.inventory(big, CPUSet()) is factory.inventory(big, CPUSet())


def test_percentile_and_peak_rate() -> None:
    assert math.isnan(percentile([], 99))
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([5.0], 99) == 5.0
    # a burst split across a fixed 1 s boundary is still one burst
    assert peak_rate([0.6, 0.7, 0.8, 1.1, 1.2, 5.0]) == 5.0
    assert peak_rate([]) == 0.0
    assert peak_rate([0.0, 0.5, 1.0, 1.5], width=2.0) == 2.0


def test_phase_counts_by_verb_agent_and_status() -> None:
    records = [
        RequestRecord(0.0, "list", "resourceslices", "a", 200, 100),
        RequestRecord(0.1, "watch", "resourceslices", "a", 200, 0),
        RequestRecord(0.2, "list", "resourceslices", "b", 429, 50),
        RequestRecord(0.3, "create", "resourceslices", "b", 201, 10),
        RequestRecord(3.0, "update", "resourceslices", "b", 200, 10),
    ]
    c = phase_counts(records)
    assert (c.total, c.by_verb, c.by_agent) == (
        5,
        {"create": 1, "list": 2, "update": 1, "watch": 1},
        {"a": 2, "b": 3},
    )
    assert c.ok_by_verb == {"create": 1, "list": 1, "update": 1, "watch": 1}
    assert (c.throttled, c.writes, c.peak_rps, c.response_bytes, c.max_per_agent) == (
        1,
        2,
        4.0,
        170,
        3,
    )


def test_fixtures_default_points_at_the_repository() -> None:
    assert Path(__file__).parents[1] / "fake_sysfs" == FIXTURES
