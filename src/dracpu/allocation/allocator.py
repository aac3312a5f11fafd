"""The topology-aware CPU allocator (behavior.md §9): pure, deterministic, bitmask based.

``take_cpus`` is kubelet's TakeByTopologyNUMAPacked as upstream's driver uses it: whole NUMA
nodes and sockets when the request covers them (NUMA first when the machine declares at
least as many sockets as NUMA nodes, sockets first otherwise), then whole uncore (L3) groups
and the partial-L3 rule, then whole free cores, then single CPUs in packed order. Options
(options.py) add the spread strategy, ``fullPCPUsOnly`` and ``distributeAcrossNUMA``;
``take_by_topology_numa_distributed`` is a port of kubelet's KEP-2902 variant (§9.4).

Deviations from upstream, on purpose:

- A core is its machine-unique key (socket, cluster, core), never the raw ``core_id`` that
  repeats in every socket (§19.1). Upstream's "take full cores" step takes every topology
  CPU with a given ``core_id`` and so hands out CPUs of another socket that were not
  candidates; here a result is always a subset of the available set.
- A socket or core is "free" only when every one of its CPUs is available. Upstream compares
  the available count with the declared average (CPUsPerSocket, CPUsPerCore), which on
  asymmetric machines (hybrid cores, offline siblings) marks half-used units free and then
  takes their unavailable CPUs. On symmetric machines both rules agree.
- Orderings drop repeated ids (upstream keeps them when a socket spans NUMA nodes or the
  reverse, and then counts a repeated unit twice against the request).
- When no CPU reports an L3 cache, each socket is one uncore group.
- The KEP-2902 port copies each NUMA combination it keeps (upstream's slices can alias for
  four or more nodes) and treats a remainder subset whose nodes cannot give another group as
  unusable instead of looping on it.

The packed algorithm and the per-topology index it runs on (built once and cached by the
Topology object's identity) are in packed.py.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dracpu.allocation.options import DEFAULT_OPTIONS, AllocationOptions, Strategy
from dracpu.allocation.packed import (
    AllocationError,
    Packer,
    TopologyIndex,
    not_enough,
    take_packed,
    topology_index,
)
from dracpu.cpuset import CPUSet
from dracpu.topology.model import Topology

__all__ = [
    "AllocationError",
    "take_by_topology_numa_distributed",
    "take_cpus",
]


# -- options: fullPCPUsOnly and distributeAcrossNUMA -------------------------------------


def _whole_cores(ix: TopologyIndex, details: int) -> tuple[int, int]:
    """(mask of the cores wholly inside ``details``, how many such cores)."""
    mask = count = 0
    for core in ix.core_mask:
        if core & details == core:
            mask |= core
            count += 1
    return mask, count


def _is_whole_cores(ix: TopologyIndex, mask: int) -> bool:
    return all(core & mask in (0, core) for core in ix.core_mask)


def _even_shares(free_units: Sequence[tuple[int, int]], units: int) -> list[tuple[int, int]]:
    """(node, share) over the fewest nodes that can each give a floor/ceil share.

    ``free_units`` is (node, free units), most free first. The k nodes with the most free
    units are the easiest k to satisfy, so trying only them for each k is enough.
    """
    for k in range(1, len(free_units) + 1):
        base, extra = divmod(units, k)
        shares = [base + (1 if i < extra else 0) for i in range(k)]
        chosen = free_units[:k]
        if all(free >= share for (_, free), share in zip(chosen, shares, strict=True)):
            return [(node, share) for (node, _), share in zip(chosen, shares, strict=True)]
    return []


def _take_spread_over_numa(
    ix: TopologyIndex, pool: int, count: int, group: int, options: AllocationOptions
) -> int:
    """Split ``count`` evenly (in groups of ``group`` CPUs) over the fewest NUMA nodes."""
    nodes = [(n, (pool & m).bit_count() // group) for n, m in ix.numa_mask.items() if pool & m]
    nodes.sort(key=lambda item: (-item[1], item[0]))
    plan = _even_shares(nodes, count // group)
    if not plan:
        # No even split exists (small nodes): fall back to plain packing over the pool.
        return take_packed(
            ix,
            pool,
            count,
            pool.bit_count(),
            options.strategy,
            options.prefer_align_by_uncore_cache,
        )
    result = 0
    for node, share in plan:
        local = pool & ix.numa_mask[node] & ~result
        result |= take_packed(
            ix,
            local,
            share * group,
            local.bit_count(),
            options.strategy,
            options.prefer_align_by_uncore_cache,
        )
    return result


def _take_full_pcpus(
    ix: TopologyIndex, details: int, count: int, available_size: int, options: AllocationOptions
) -> int:
    per_core = max(ix.cpus_per_core, 1)
    if count % per_core:
        raise AllocationError(
            f"fullPCPUsOnly: requested {count} CPUs is not a multiple of "
            f"{per_core} threads per core"
        )
    if count > details.bit_count():
        raise not_enough(count, available_size)
    whole, whole_count = _whole_cores(ix, details)
    if count > whole.bit_count():
        raise AllocationError(
            "fullPCPUsOnly: not enough free physical cores: "
            f"requested={count} CPUs ({count // per_core} cores), "
            f"available={whole_count} whole cores"
        )
    if options.distribute_across_numa:
        result = _take_spread_over_numa(ix, whole, count, per_core, options)
    else:
        result = take_packed(
            ix,
            whole,
            count,
            available_size,
            options.strategy,
            options.prefer_align_by_uncore_cache,
        )
    if not _is_whole_cores(ix, result):
        # Only reachable when cores have unequal thread counts (CPUsPerCore is an average).
        raise AllocationError(
            f"fullPCPUsOnly: cannot make {count} CPUs out of whole physical cores "
            "on this topology (cores have unequal thread counts)"
        )
    return result


def take_cpus(
    topo: Topology,
    available: CPUSet,
    count: int,
    options: AllocationOptions = DEFAULT_OPTIONS,
) -> CPUSet:
    """Choose ``count`` CPUs out of ``available`` (CPUs outside the topology never count).

    Raises AllocationError with the claim-facing message when the request cannot be met.
    """
    ix = topology_index(topo)
    details = available.mask & ix.all_mask
    if count < 1:
        return CPUSet()
    if options.full_pcpus_only:
        result = _take_full_pcpus(ix, details, count, len(available), options)
    elif options.distribute_across_numa:
        if count > details.bit_count():
            raise not_enough(count, len(available))
        result = _take_spread_over_numa(ix, details, count, 1, options)
    else:
        result = take_packed(
            ix,
            details,
            count,
            len(available),
            options.strategy,
            options.prefer_align_by_uncore_cache,
        )
    # The steps above only ever take available CPUs; keep that a checked promise.
    if result & ~details or result.bit_count() != count:
        raise AllocationError("failed to allocate cpus")
    return CPUSet.from_mask(result)


# -- KEP-2902: takeByTopologyNUMADistributed (§9.4) --------------------------------------


def _balance(values: Iterable[int]) -> float:
    """Population standard deviation rounded to 3 decimals, halves away from zero."""
    xs = list(values)
    mean = sum(xs) / len(xs)
    spread = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return math.floor(spread * 1000 + 0.5) / 1000


def _hand_out(left: dict[int, int], subset: Sequence[int], remainder: int, group: int) -> bool:
    """Take ``group`` CPUs at a time round-robin from ``subset``; False if it gets stuck."""
    while remainder > 0:
        progressed = False
        for numa in subset:
            if remainder == 0:
                break
            if left[numa] < group:
                continue
            left[numa] -= group
            remainder -= group
            progressed = True
        if not progressed:
            return False
    return True


@dataclass(slots=True)
class _Best:
    balance: float = math.inf
    combo: tuple[int, ...] = ()
    remainder_nodes: tuple[int, ...] = ()


def _score_combo(
    free: Mapping[int, int], combo: tuple[int, ...], count: int, group: int
) -> tuple[float, tuple[int, ...]] | None:
    """Balance score of spreading ``count`` over ``combo``, or None if it cannot work."""
    if sum(free[n] for n in combo) < count:
        return None
    if sum(free[n] // group for n in combo) * group < count:
        return None
    share = count // len(combo) // group * group
    if any(free[n] < share for n in combo):
        return None
    left = dict(free)
    for n in combo:
        left[n] -= share
    remainder = count - share * len(combo)
    if remainder == 0:
        return _balance(left.values()), ()
    candidates = [n for n in combo if left[n] >= group]
    best: tuple[float, tuple[int, ...]] | None = None
    # Largest subsets first: keep spreading the remainder over as many nodes as possible.
    for k in range(len(candidates), 0, -1):
        for subset in itertools.combinations(candidates, k):
            if sum(left[n] for n in subset) < remainder:
                continue
            trial = dict(left)
            if not _hand_out(trial, subset, remainder, group):
                continue
            score = _balance(trial.values())
            if best is None or score < best[0]:
                best = (score, subset)
    return best


def _numa_range(ix: TopologyIndex, details: int, need: int, group: int) -> tuple[int, int]:
    """kubelet's rangeNUMANodesNeededToSatisfy: bounds on how many nodes to try."""
    nodes = len(ix.numa_mask)
    nodes_available = sum(1 for m in ix.numa_mask.values() if m & details)
    groups = (ix.all_mask.bit_count() - 1) // group + 1
    groups_per_node = (groups - 1) // nodes + 1
    groups_needed = (need - 1) // group + 1
    return (groups_needed - 1) // groups_per_node + 1, min(groups_needed, nodes_available)


def take_by_topology_numa_distributed(
    topo: Topology,
    available: CPUSet,
    count: int,
    cpu_group_size: int,
    strategy: Strategy = "packed",
) -> CPUSet:
    """kubelet's takeByTopologyNUMADistributed (KEP-2902), uncore alignment off.

    Picks the combination of the fewest NUMA nodes that leaves the machine most balanced,
    hands out an even share (in groups of ``cpu_group_size``) from each, then the remainder.
    Falls back to the packed algorithm when no combination works.
    """
    if cpu_group_size < 1:
        raise ValueError(f"cpu_group_size must be positive, got {cpu_group_size}")
    ix = topology_index(topo)
    details = available.mask & ix.all_mask

    def packed(pool: int, n: int) -> int:
        return take_packed(ix, pool, n, len(available), strategy, False)

    if count % cpu_group_size:
        return CPUSet.from_mask(packed(details, count))
    acc = Packer(ix, details, count)
    if acc.satisfied():
        return CPUSet()
    if count > details.bit_count():
        raise not_enough(count, len(available))
    numas = acc.sort_numa()
    free = {n: (ix.numa_mask[n] & details).bit_count() for n in numas}
    low, high = _numa_range(ix, details, count, cpu_group_size)
    for k in range(low, high + 1):
        best = _Best()
        for combo in itertools.combinations(numas, k):
            if best.balance == 0:
                break
            scored = _score_combo(free, combo, count, cpu_group_size)
            if scored is not None and scored[0] < best.balance:
                best = _Best(scored[0], combo, scored[1])
        if not best.combo:
            continue
        share = count // len(best.combo) // cpu_group_size * cpu_group_size
        for n in best.combo:
            acc.take(packed(acc.details & ix.numa_mask[n], share))
        remainder = count - share * len(best.combo)
        while remainder > 0:
            before = remainder
            for n in best.remainder_nodes:
                if remainder == 0:
                    break
                if (acc.details & ix.numa_mask[n]).bit_count() < cpu_group_size:
                    continue
                acc.take(packed(acc.details & ix.numa_mask[n], cpu_group_size))
                remainder -= cpu_group_size
            if remainder == before:
                break
        if acc.need != 0:
            raise AllocationError(f"accounting error, CPUs still needed: {acc.need}")
        return CPUSet.from_mask(acc.result)
    return CPUSet.from_mask(packed(details, count))
