"""The CPU map printed by `dracpu demo` and `dracpu map`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dracpu.cpumap import render_cpu_map, rows_from_document, rows_from_topology
from dracpu.cpuset import CPUSet
from dracpu.introspect import topology_json
from dracpu.topology.discover import discover_from_root

FIXTURES = Path(__file__).parents[1] / "fake_sysfs"


def test_map_marks_claims_shared_and_reserved_per_core() -> None:
    topo = discover_from_root(FIXTURES / "xeon-2s-ht")
    claims = {"default/a": CPUSet.parse("0-1,40-41"), "default/b": CPUSet.parse("20")}
    reserved = CPUSet.parse("79")
    shared = topo.all_cpus - CPUSet.parse("0-1,40-41,20") - reserved
    text = render_cpu_map(rows_from_topology(topo), claims=claims, shared=shared, reserved=reserved)
    lines = text.splitlines()
    assert lines[0] == "  Socket 0 · NUMA 0 · L3 0   AA AA " + " ".join([".."] * 18)
    # Core 0 of socket 1 holds CPUs 20 and 60: b has 20 only.
    assert lines[1].startswith("  Socket 1 · NUMA 1 · L3 1   B. .. ")
    assert lines[1].endswith(".r")
    assert lines[2:] == [
        "    A  default/a    0-1,40-41 (4 CPUs)",
        "    B  default/b    20 (1 CPU)",
        "    .  shared pool  2-19,21-39,42-78 (74 CPUs)",
        "    r  reserved     79 (1 CPU)",
    ]


def test_map_from_debug_document_equals_map_from_topology() -> None:
    topo = discover_from_root(FIXTURES / "epyc-nps4")
    doc = json.loads(topology_json(topo))
    kwargs = {"claims": {"x": CPUSet.parse("0-3")}, "shared": topo.all_cpus - CPUSet.parse("0-3")}
    assert render_cpu_map(rows_from_document(doc), **kwargs) == render_cpu_map(
        rows_from_topology(topo), **kwargs
    )


def test_cpus_outside_every_set_are_marked_unmanaged() -> None:
    topo = discover_from_root(FIXTURES / "vm-1cpu")
    text = render_cpu_map(rows_from_topology(topo), claims={}, shared=CPUSet())
    assert "-" in text.splitlines()[0]
    assert text.splitlines()[-1] == "    -  not managed by dracpu"
    assert "    .  shared pool  (none)" in text


@pytest.mark.parametrize("doc", [{}, {"cpus": [{"cpu": 0}]}, {"cpus": None}])
def test_bad_topology_document_is_a_clear_error(doc: object) -> None:
    with pytest.raises(ValueError, match="not a topology document"):
        rows_from_document(doc)  # type: ignore[arg-type]
