"""`dracpu map`: what the daemon did with each claim's status.devices, under its legend
entry (cpumap notes and cli/map.py's reading of /debug/state's claimStatus)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dracpu.cli.map import _status_notes
from dracpu.cpumap import render_cpu_map, rows_from_topology
from dracpu.cpuset import CPUSet
from dracpu.topology.discover import discover_from_root

FIXTURES = Path(__file__).parents[1] / "fake_sysfs"


def test_a_note_goes_under_its_claims_legend_entry() -> None:
    topo = discover_from_root(FIXTURES / "xeon-2s-ht")
    claims = {"default/a": CPUSet.parse("0-1,40-41"), "default/b": CPUSet.parse("20")}
    shared = topo.all_cpus - CPUSet.parse("0-1,40-41,20")
    text = render_cpu_map(
        rows_from_topology(topo),
        claims=claims,
        shared=shared,
        notes={"default/b": "status.devices: written", "shared pool": "never shown"},
    )
    assert text.splitlines()[2:] == [
        "    A  default/a    0-1,40-41 (4 CPUs)",
        "    B  default/b    20 (1 CPU)",
        "       status.devices: written",
        "    .  shared pool  2-19,21-39,42-79 (75 CPUs)",
    ]


def state(**claim_status: Any) -> dict[str, Any]:
    return {
        "claims": [
            {"uid": "u1", "namespace": "default", "name": "a", "cpus": "0-1"},
            {"uid": "u2", "cpus": "2"},  # learnt from a container: no name
        ],
        "claimStatus": claim_status,
    }


def test_notes_come_from_the_daemons_claim_status_section() -> None:
    notes, off = _status_notes(
        state(disabled=None, claims={"u1": "written", "u2": "writing (retrying: 503)"})
    )
    assert notes == {
        "default/a": "status.devices: written",
        "u2": "status.devices: writing (retrying: 503)",
    }
    assert off == ""
    notes, off = _status_notes(state(disabled="turned off", claims={}))
    assert (notes, off) == ({}, "turned off")
    # A daemon from before the section existed: nothing to say.
    assert _status_notes({"claims": []}) == ({}, "")


def test_a_malformed_section_is_an_error_the_command_reports() -> None:
    with pytest.raises(AttributeError):
        _status_notes({**state(), "claimStatus": {"claims": ["not", "a", "map"]}})
