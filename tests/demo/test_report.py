"""The demo's report: what each container's cpuset read back is."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from dracpu.cpuset import CPUSet
from dracpu.topology.discover import discover_from_root
from dracpu_sim.demo.runner import DemoOptions, DemoResult, _text_report, container_kind
from dracpu_sim.demo.scenario import Scenario

FIXTURES = Path(__file__).parents[1] / "fake_sysfs"
POOL = CPUSet.parse("0-3,8-15")


@pytest.mark.parametrize(
    ("cpus", "claimed", "kind"),
    [
        ("0-3,8-15", "", "shared pool"),
        ("4-5", "4-5", "exclusive"),
        ("0-5,8-15", "4-5", "exclusive + shared pool"),
        ("4", "4-5", "unexpected"),
        ("0-3", "", "unexpected"),
    ],
)
def test_container_kind(cpus: str, claimed: str, kind: str) -> None:
    assert container_kind(CPUSet.parse(cpus), CPUSet.parse(claimed), POOL) == kind


def test_text_report_tells_shared_pool_access_apart() -> None:
    topo = discover_from_root(FIXTURES / "xeon-2s-ht")
    result = DemoResult(
        claims={"default/data-plane": {"cpus": "4-5", "error": None}},
        containers={
            "default/packet-processor/dataplane": "0-5,8-15",
            "default/plain/app": "0-3,8-15",
        },
        container_kinds={
            "default/packet-processor/dataplane": "exclusive + shared pool",
            "default/plain/app": "shared pool",
        },
        shared_pool="0-3,8-15",
    )
    opts = DemoOptions(sysfs_root=str(FIXTURES / "xeon-2s-ht"), topology=topo, scenario=Scenario())
    out = io.StringIO()
    _text_report(opts, result, out)
    lines = out.getvalue().splitlines()
    [line] = [ln for ln in lines if "packet-processor" in ln]
    assert line.split()[1:] == [
        "exclusive",
        "+",
        "shared",
        "pool",
        "0-5,8-15",
        "(claimed",
        "4-5",
        "+",
        "shared",
        "pool",
        "0-3,8-15)",
    ]
    [plain] = [ln for ln in lines if "default/plain/app" in ln]
    assert plain.split()[1:] == ["shared", "pool", "0-3,8-15"]
