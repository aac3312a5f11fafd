"""The allocator's golden answers: a broad table of (shape, available, count, call) cases.

``allocator_golden.json`` holds the answers the allocator gave before its take was made
incremental (issue #18); ``test_allocator_golden.py`` checks that today's code still gives
exactly those. The table is self-contained: shapes are fixtures, grids or explicit rows,
and every call (options or the KEP-2902 port) is spelled out in the file.

Regenerate only on purpose, when an answer is meant to change:
    .venv/bin/python tests/allocation/golden_cases.py --write
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from topo_builders import Row, from_rows, grid, grid_rows  # noqa: E402

from dracpu.allocation import (  # noqa: E402
    AllocationError,
    AllocationOptions,
    take_by_topology_numa_distributed,
    take_cpus,
)
from dracpu.cpuset import CPUSet  # noqa: E402
from dracpu.topology import discover_from_root  # noqa: E402
from dracpu.topology.model import NO_ID, Topology  # noqa: E402

GOLDEN = HERE / "allocator_golden.json"
FIXTURES = HERE.parent / "fake_sysfs"
FIXTURE_NAMES = [
    "xeon-2s-ht",
    "xeon-snc",
    "epyc-nps1",
    "epyc-nps4",
    "epyc-2s-768",
    "intel-hybrid",
    "arm-server",
    "vm-1cpu",
    "offline-holes",
]

# name -> ("options", AllocationOptions fields) or ("distributed", {group, strategy});
# a group of 0 means the topology's CPUs per core.
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "packed": ("options", {}),
    "packed-no-uncore": ("options", {"prefer_align_by_uncore_cache": False}),
    "spread": ("options", {"strategy": "spread"}),
    "spread-no-uncore": (
        "options",
        {"strategy": "spread", "prefer_align_by_uncore_cache": False},
    ),
    "distribute": ("options", {"distribute_across_numa": True}),
    "distribute-spread": ("options", {"distribute_across_numa": True, "strategy": "spread"}),
    "distribute-no-uncore": (
        "options",
        {"distribute_across_numa": True, "prefer_align_by_uncore_cache": False},
    ),
    "full": ("options", {"full_pcpus_only": True}),
    "full-no-uncore": ("options", {"full_pcpus_only": True, "prefer_align_by_uncore_cache": False}),
    "full-distribute": ("options", {"full_pcpus_only": True, "distribute_across_numa": True}),
    "kep2902-g1": ("distributed", {"group": 1, "strategy": "packed"}),
    "kep2902-gcore": ("distributed", {"group": 0, "strategy": "packed"}),
    "kep2902-g1-spread": ("distributed", {"group": 1, "strategy": "spread"}),
}
# The KEP-2902 port tries NUMA combinations; keep it to shapes where that stays quick.
KEP2902_MAX_NUMA = 8


# -- shapes ------------------------------------------------------------------------------


def build_shape(spec: Mapping[str, Any]) -> Topology:
    if "fixture" in spec:
        return discover_from_root(FIXTURES / spec["fixture"])
    if "grid" in spec:
        return grid(*spec["grid"])
    return from_rows(
        Row(cpu=c, socket=s, numa=n, core=k, l3=l3, cluster=cl)
        for c, s, n, k, l3, cl in spec["rows"]
    )


def _random_rows(rng: random.Random) -> list[list[int]]:
    """An irregular machine: renumbered CPUs, dropped CPUs, odd ids, spanning groups."""
    cores_per_numa = rng.randint(1, 8)
    rows = grid_rows(
        sockets=rng.randint(1, 4),
        numa_per_socket=rng.randint(1, 3),
        cores_per_numa=cores_per_numa,
        threads=rng.choice([1, 2, 2, 2, 4]),
        cores_per_l3=rng.choice([None, 1, 2, 3, cores_per_numa, 2 * cores_per_numa]),
    )
    ids = list(range(len(rows)))
    if rng.random() < 0.6:
        rng.shuffle(ids)
    rows = [replace(r, cpu=ids[r.cpu]) for r in rows]
    if rng.random() < 0.25:  # NUMA nodes spanning sockets (fewer nodes than sockets)
        rows = [replace(r, numa=r.socket // 2) for r in rows]
    if rng.random() < 0.3:  # sparse, unordered ids for sockets, NUMA nodes and L3s
        rows = [
            replace(
                r,
                socket=(r.socket * 7) % 11,
                numa=(r.numa * 5 + 3) % 17,
                l3=r.l3 if r.l3 == NO_ID else (r.l3 * 3) % 13 + 20 * (r.l3 // 13),
            )
            for r in rows
        ]
    if rng.random() < 0.2:  # clusters: the same core id under two clusters
        rows = [replace(r, cluster=r.core % 2, core=r.core // 2) for r in rows]
    if rng.random() < 0.2:  # odd sysfs: a core's threads in two NUMA nodes or L3 groups
        rows = [replace(r, numa=r.numa + r.cpu % 2) for r in rows]
    if rng.random() < 0.2:
        rows = [replace(r, l3=r.l3 + r.cpu % 2) if r.l3 != NO_ID else r for r in rows]
    if rng.random() < 0.4:  # offline CPUs: asymmetric cores
        keep = max(1, len(rows) - rng.randint(1, max(1, len(rows) // 3)))
        rows = rng.sample(rows, keep)
    return sorted([r.cpu, r.socket, r.numa, r.core, r.l3, r.cluster] for r in rows)


def shapes() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {name: {"fixture": name} for name in FIXTURE_NAMES}
    grids = {
        "grid-1x1x4x2": [1, 1, 4, 2, None],
        "grid-2x2x10x2-l3x20": [2, 2, 10, 2, 20],
        "grid-1x1x16x1-l3x4": [1, 1, 16, 1, 4],
        "grid-1x1x8x2-l3x4": [1, 1, 8, 2, 4],
        "grid-2x1x3x2": [2, 1, 3, 2, None],
        "grid-2x4x4x2-l3x2": [2, 4, 4, 2, 2],
        "grid-2x1x4x2": [2, 1, 4, 2, None],
        "grid-2x1x24x2-l3x5": [2, 1, 24, 2, 5],  # L3 groups straddle the sockets
        "grid-4x2x16x2-l3x8": [4, 2, 16, 2, 8],
        "grid-8x1x128x2-l3x8": [8, 1, 128, 2, 8],  # 2,048 CPUs, 128 L3 groups
        "grid-2x4x128x2-l3x16": [2, 4, 128, 2, 16],  # 2,048 CPUs, sockets-first
    }
    out |= {name: {"grid": params} for name, params in grids.items()}
    rng = random.Random(18)
    for i in range(48):
        out[f"random-{i:02d}"] = {"rows": _random_rows(rng)}
    for i, params in enumerate([(2, 2, 4, 2), (1, 3, 3, 3), (2, 2, 6, None), (4, 2, 2, 1)]):
        out[f"split-numa-{i}"] = {"rows": _split_rows(rng, *params, field="numa")}
        out[f"split-l3-{i}"] = {"rows": _split_rows(rng, *params, field="l3")}
    return out


def _split_rows(
    rng: random.Random,
    sockets: int,
    numa_per_socket: int,
    cores_per_numa: int,
    cores_per_l3: int | None,
    field: str,
) -> list[list[int]]:
    """Odd sysfs data: the second thread of some cores in the socket's next NUMA node or
    in the next L3 group."""
    rows = grid_rows(sockets, numa_per_socket, cores_per_numa, 2, cores_per_l3)
    total_cores = len(rows) // 2
    out = []
    for r in rows:
        if r.cpu >= total_cores and rng.random() < 0.5:
            if field == "numa":
                first = r.socket * numa_per_socket
                r = replace(r, numa=first + (r.numa - first + 1) % numa_per_socket)
            elif r.l3 != NO_ID:
                r = replace(r, l3=r.l3 + 1)
        out.append([r.cpu, r.socket, r.numa, r.core, r.l3, r.cluster])
    return out


# -- available sets and counts -------------------------------------------------------------


def _fragmented(topo: Topology) -> CPUSet:
    """Per 4 cores: none free, the second CPU, the first, all (bench/allocate.py's free set)."""
    free = 0
    for i, threads in enumerate(topo.by_core_key.values()):
        order = list(threads)
        for cpu in {0: [], 1: order[1:], 2: order[:1], 3: order}[i % 4]:
            free |= 1 << cpu
    return CPUSet.from_mask(free)


def availables(topo: Topology, rng: random.Random) -> list[CPUSet]:
    cpus = sorted(topo.cpus)
    out = [topo.all_cpus, _fragmented(topo)]
    numa = min(topo.by_numa)
    out.append(_fragmented(topo) & topo.by_numa[numa])  # grouped mode: one node's free CPUs
    if len(cpus) <= 600:
        for density in (0.35, 0.8):
            out.append(CPUSet(c for c in cpus if rng.random() < density))
    out.append(topo.all_cpus - CPUSet(cpus[:1]) - CPUSet(cpus[len(cpus) // 2 :][:3]))
    unique: list[CPUSet] = []
    for cpuset in out:
        if cpuset not in unique:
            unique.append(cpuset)
    return unique


def counts(topo: Topology, available: CPUSet, rng: random.Random) -> list[int]:
    size = len(available)
    units = [topo.cpus_per_core, topo.cpus_per_uncore, topo.cpus_per_socket]
    units += [len(m) for m in topo.by_numa.values()][:2]
    picks = {0, 1, 2, 3, size - 1, size, size + 1}
    for unit in units:
        picks |= {unit - 1, unit, unit + 1}
    picks |= {rng.randint(0, size) for _ in range(2)}
    if size > 600:  # big machines: keep the table small
        picks = {p for p in picks if p in (1, 3, size - 1, size) or rng.random() < 0.4}
    return sorted(p for p in picks if 0 <= p <= size + 1)


# -- running a call ------------------------------------------------------------------------


def run_call(
    topo: Topology, available: CPUSet, count: int, kind: str, args: Mapping[str, Any]
) -> str:
    """The allocator's answer as ``cpus:<list>`` or ``error:<message>``."""
    try:
        if kind == "options":
            got = take_cpus(topo, available, count, AllocationOptions(**args))
        else:
            group = args["group"] or max(topo.cpus_per_core, 1)
            got = take_by_topology_numa_distributed(topo, available, count, group, args["strategy"])
    except AllocationError as exc:
        return f"error:{exc}"
    return f"cpus:{got.format()}"


def calls_for(topo: Topology) -> list[str]:
    if len(topo.by_numa) > KEP2902_MAX_NUMA:
        return [c for c in CALLS if CALLS[c][0] == "options"]
    return list(CALLS)


def generate() -> Iterator[dict[str, Any]]:
    for name, spec in shapes().items():
        topo = build_shape(spec)
        rng = random.Random(f"{name}/{len(topo.cpus)}")
        for available in availables(topo, rng):
            picked = counts(topo, available, rng)
            answers: dict[str, int] = {}
            expected = {
                call: [
                    answers.setdefault(run_call(topo, available, n, *CALLS[call]), len(answers))
                    for n in picked
                ]
                for call in calls_for(topo)
            }
            yield {
                "shape": name,
                "available": available.format(),
                "counts": picked,
                # expected[call][i] indexes ``answers``: the answer for counts[i]
                "answers": list(answers),
                "expected": expected,
            }


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print(__doc__, file=sys.stderr)
        return 2
    about = "Allocator answers before the incremental take (issue #18); see golden_cases.py"
    calls = {name: {"kind": kind, "args": args} for name, (kind, args) in CALLS.items()}
    cases = list(generate())
    GOLDEN.write_text(_layout(about, calls, shapes(), cases))
    print(f"wrote {len(cases)} case groups to {GOLDEN}")
    return 0


def _layout(about: str, calls: Any, shape_specs: Any, cases: list[Any]) -> str:
    """JSON with one shape or case group per line, so a changed answer shows as one line."""

    def lines(items: list[str]) -> str:
        return "[\n" + ",\n".join(items) + "\n]" if items else "[]"

    def compact(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"))

    shape_lines = "{\n" + ",\n".join(f"{compact(k)}:{compact(v)}" for k, v in shape_specs.items())
    return (
        f'{{"about":{compact(about)},\n"calls":{compact(calls)},\n'
        f'"shapes":{shape_lines}\n}},\n"cases":{lines([compact(c) for c in cases])}}}\n'
    )


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
