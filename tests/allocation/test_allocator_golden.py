"""The allocator gives exactly the answers recorded in allocator_golden.json.

The file was written by golden_cases.py with the allocator as it was before its take became
incremental (issue #18), so this pins every answer of the rewrite to the old algorithm's:
fixtures, regular grids, 2,048-CPU shapes and irregular machines (renumbered, offline CPUs,
NUMA nodes spanning sockets, L3 groups spanning sockets), each option set and the KEP-2902
port, errors included.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest
from golden_cases import GOLDEN, build_shape, run_call

from dracpu.cpuset import CPUSet

DOCUMENT: dict[str, Any] = json.loads(GOLDEN.read_text())
BY_SHAPE: dict[str, list[dict[str, Any]]] = defaultdict(list)
for _group in DOCUMENT["cases"]:
    BY_SHAPE[_group["shape"]].append(_group)


def test_table_is_broad() -> None:
    checks = sum(len(g["counts"]) * len(g["expected"]) for g in DOCUMENT["cases"])
    assert len(BY_SHAPE) >= 60 and checks >= 40_000


@pytest.mark.parametrize("shape", sorted(BY_SHAPE))
def test_answers_match_golden(shape: str) -> None:
    topo = build_shape(DOCUMENT["shapes"][shape])
    mismatches = []
    for group in BY_SHAPE[shape]:
        available = CPUSet.parse(group["available"])
        for call, indexes in group["expected"].items():
            spec = DOCUMENT["calls"][call]
            for count, index in zip(group["counts"], indexes, strict=True):
                want = group["answers"][index]
                got = run_call(topo, available, count, spec["kind"], spec["args"])
                if got != want:
                    mismatches.append(f"{call} available={group['available']} count={count}")
                    mismatches.append(f"  want {want}\n  got  {got}")
    assert not mismatches, "\n".join(mismatches[:10])
