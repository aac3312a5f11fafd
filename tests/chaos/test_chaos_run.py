"""The short seeded chaos run: the real daemon under every kind of fault, then invariants.

One run per device mode on the 80-CPU fixture with CPUs 0 and 40 reserved. Each injects
every kind of fault (the plan puts one of each first) while pods come and go, then waits
for the node to settle and checks every invariant of :mod:`dracpu_sim.chaos`. The long run
is ``make chaos SEED=... DURATION=...``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dracpu_sim.chaos import FAULT_KINDS, ChaosOptions, format_result, main, make_plan, run_chaos

XEON = str(Path(__file__).parents[1] / "fake_sysfs" / "xeon-2s-ht")
SEED = 20261202


# Each run on its own cgroup flavor: v2 + systemd (most nodes, the default) and v1 + cgroupfs.
@pytest.mark.parametrize(
    ("mode", "duration", "cgroup_version", "cgroup_driver"),
    [("grouped", 30.0, 2, "systemd"), ("individual", 18.0, 1, "cgroupfs")],
)
async def test_short_chaos_run_keeps_every_invariant(
    mode: str, duration: float, cgroup_version: int, cgroup_driver: str
) -> None:
    plan = make_plan(SEED, duration, mode=mode)
    assert set(plan.fault_counts()) == set(FAULT_KINDS)
    result = await run_chaos(
        ChaosOptions(
            seed=SEED,
            duration=duration,
            mode=mode,
            sysfs_root=XEON,
            reserved_cpus="0,40",
            settle_timeout=60.0,
            cgroup_version=cgroup_version,
            cgroup_driver=cgroup_driver,
        )
    )
    report = format_result(result) + f"evidence: {dict(result.evidence)}; kept {result.workdir}"
    assert result.violations == [], report
    assert result.settled, report
    # Every planned fault fired, so every kind was injected.
    assert result.faults == plan.fault_counts(), report
    assert set(result.faults) == set(FAULT_KINDS)
    for kind in ("cpuset-tamper", "slice-delete"):
        assert result.missed[kind] < result.faults[kind], f"no {kind} hit anything: {report}"
    assert result.pods_created >= 15 and result.pods_deleted >= 5, report
    # The daemon was killed and came back (its log shows each start that got that far).
    assert result.evidence["daemon_starts"] >= 2, report
    assert report.startswith(f"faults_injected: {sum(plan.fault_counts().values())}\n")
    assert "invariant_violations: 0\n" in report


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cgroup-version", "0"], "argument --cgroup-version: must be 1 or 2, got '0'"),
        (["--cgroup-driver", "x"], "argument --cgroup-driver: invalid choice: 'x'"),
    ],
)
def test_bad_cgroup_flags_are_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"python -m dracpu_sim.chaos: {message}")
