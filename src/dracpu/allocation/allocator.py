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

Per-topology lookup tables are built once and cached by the Topology object's identity.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from dracpu.allocation.options import DEFAULT_OPTIONS, AllocationOptions, Strategy
from dracpu.cpuset import CPUSet
from dracpu.topology.model import NO_ID, Topology

__all__ = [
    "AllocationError",
    "take_by_topology_numa_distributed",
    "take_cpus",
]


class AllocationError(Exception):
    """The request cannot be met from the available CPUs; the message is the claim error."""


def _not_enough(requested: int, available: int) -> AllocationError:
    return AllocationError(
        "not enough cpus available to satisfy request: "
        f"requested={requested}, available={available}"
    )


# -- per-topology index ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Index:
    """Topology facts as int masks; core ids are indexes into ``core_mask`` (key order)."""

    all_mask: int
    numa_first: bool
    cpus_per_core: int
    cpus_per_socket: int
    cpus_per_uncore: int
    numa_mask: Mapping[int, int]
    socket_mask: Mapping[int, int]
    uncore_mask: Mapping[int, int]
    core_mask: Sequence[int]
    numa_sockets: Mapping[int, Sequence[int]]
    socket_numas: Mapping[int, Sequence[int]]
    numa_uncores: Mapping[int, Sequence[int]]
    numa_cores: Mapping[int, Sequence[int]]
    socket_cores: Mapping[int, Sequence[int]]
    uncore_cores: Mapping[int, Sequence[int]]


def _links(pairs: Iterable[tuple[int, int]]) -> dict[int, tuple[int, ...]]:
    out: dict[int, set[int]] = {}
    for a, b in pairs:
        out.setdefault(a, set()).add(b)
    return {a: tuple(sorted(bs)) for a, bs in sorted(out.items())}


def _build_index(topo: Topology) -> _Index:
    core_index = {key: i for i, key in enumerate(topo.by_core_key)}
    has_l3 = topo.num_uncore_caches > 0
    # Without any L3 information, the socket stands in for the uncore group.
    uncore_of = {cpu: (info.l3 if has_l3 else info.socket) for cpu, info in topo.cpus.items()}
    uncore_mask: dict[int, int] = {}
    for cpu, uncore in uncore_of.items():
        if uncore != NO_ID:
            uncore_mask[uncore] = uncore_mask.get(uncore, 0) | 1 << cpu
    infos = list(topo.cpus.values())
    with_uncore = [i for i in infos if uncore_of[i.cpu] != NO_ID]
    return _Index(
        all_mask=topo.all_cpus.mask,
        numa_first=topo.num_sockets >= topo.num_numa_nodes,
        cpus_per_core=topo.cpus_per_core,
        cpus_per_socket=topo.cpus_per_socket,
        cpus_per_uncore=topo.cpus_per_uncore if has_l3 else topo.cpus_per_socket,
        numa_mask={n: s.mask for n, s in topo.by_numa.items()},
        socket_mask={n: s.mask for n, s in topo.by_socket.items()},
        uncore_mask=dict(sorted(uncore_mask.items())),
        core_mask=tuple(s.mask for s in topo.by_core_key.values()),
        numa_sockets=_links((i.numa, i.socket) for i in infos),
        socket_numas=_links((i.socket, i.numa) for i in infos),
        numa_uncores=_links((i.numa, uncore_of[i.cpu]) for i in with_uncore),
        numa_cores=_links((i.numa, core_index[i.core_key]) for i in infos),
        socket_cores=_links((i.socket, core_index[i.core_key]) for i in infos),
        uncore_cores=_links((uncore_of[i.cpu], core_index[i.core_key]) for i in with_uncore),
    )


# Topology is unhashable (it holds dicts), so the cache is keyed by id() and each entry is
# dropped by a finalizer when its Topology is collected (so a reused id never hits).
_INDEX_CACHE: dict[int, _Index] = {}


def _index(topo: Topology) -> _Index:
    found = _INDEX_CACHE.get(id(topo))
    if found is None:
        found = _build_index(topo)
        _INDEX_CACHE[id(topo)] = found
        weakref.finalize(topo, _INDEX_CACHE.pop, id(topo), None)
    return found


def _bits(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _unique(ids: Iterable[int]) -> list[int]:
    return list(dict.fromkeys(ids))


# -- the packed algorithm (§9.1-§9.3) ----------------------------------------------------


class _Packer:
    """One TakeByTopologyNUMAPacked run: ``details`` shrinks as ``result`` grows."""

    __slots__ = ("details", "ix", "need", "result")

    def __init__(self, ix: _Index, details: int, need: int) -> None:
        self.ix = ix
        self.details = details
        self.need = need
        self.result = 0

    def satisfied(self) -> bool:
        return self.need < 1

    def take(self, mask: int) -> None:
        self.result |= mask
        self.details &= ~mask
        self.need -= mask.bit_count()

    def _by_count(self, ids: Iterable[int], masks: Mapping[int, int] | Sequence[int]) -> list[int]:
        """Sort ids by (CPUs of the id still available, id), as every §9.2 ordering does."""
        details = self.details
        return sorted(ids, key=lambda i: ((masks[i] & details).bit_count(), i))

    # -- orderings (§9.2) -------------------------------------------------------------
    def sort_numa(self) -> list[int]:
        ix, d = self.ix, self.details
        if ix.numa_first:
            return self._by_count((n for n, m in ix.numa_mask.items() if m & d), ix.numa_mask)
        out: list[int] = []
        for s in self.sort_sockets():
            here = ix.socket_mask[s] & d
            out += self._by_count(
                (n for n in ix.socket_numas[s] if ix.numa_mask[n] & here), ix.numa_mask
            )
        return _unique(out)

    def sort_sockets(self) -> list[int]:
        ix, d = self.ix, self.details
        if not ix.numa_first:
            return self._by_count((s for s, m in ix.socket_mask.items() if m & d), ix.socket_mask)
        out: list[int] = []
        for n in self.sort_numa():
            here = ix.numa_mask[n] & d
            out += self._by_count(
                (s for s in ix.numa_sockets[n] if ix.socket_mask[s] & here), ix.socket_mask
            )
        return _unique(out)

    def sort_cores(self) -> list[int]:
        ix, d = self.ix, self.details
        cores = ix.core_mask
        out: list[int] = []
        if ix.numa_first:
            for s in self.sort_sockets():
                out += self._by_count((c for c in ix.socket_cores[s] if cores[c] & d), cores)
        else:
            for n in self.sort_numa():
                here = ix.numa_mask[n] & d
                out += self._by_count((c for c in ix.numa_cores[n] if cores[c] & here), cores)
        return _unique(out)

    def sort_uncore(self) -> list[int]:
        ix, d = self.ix, self.details
        out: list[int] = []
        for n in self.sort_numa():
            here = ix.numa_mask[n] & d
            out += self._by_count(
                (u for u in ix.numa_uncores.get(n, ()) if ix.uncore_mask[u] & here),
                ix.uncore_mask,
            )
        return _unique(out)

    def sorted_cpus(self, strategy: Strategy) -> Iterable[int]:
        d = self.details
        if strategy == "spread":
            for s in self.sort_sockets():
                yield from _bits(self.ix.socket_mask[s] & d)
        else:
            for c in self.sort_cores():
                yield from _bits(self.ix.core_mask[c] & d)

    # -- steps (§9.3) -----------------------------------------------------------------
    def take_whole(self, ids: Iterable[int], masks: Mapping[int, int] | Sequence[int]) -> None:
        """Take each unit that is wholly available and no larger than what is still needed.

        Units of one kind are disjoint, so checking "free" as we go equals upstream's list
        of free units computed before the loop.
        """
        for i in ids:
            mask = masks[i]
            if mask & ~self.details == 0 and self.need >= mask.bit_count():
                self.take(mask)

    def take_uncore(self) -> None:
        ix = self.ix
        for uncore in self.sort_uncore():
            if self.need >= ix.cpus_per_uncore:
                self.take_whole(self.sort_uncore(), ix.uncore_mask)
            if self.satisfied():
                return
            self.take_partial_uncore(uncore)
            if self.satisfied():
                return

    def take_partial_uncore(self, uncore: int) -> None:
        ix, d = self.ix, self.details
        per_core = max(ix.cpus_per_core, 1)
        cores_needed = -(-self.need // per_core)
        here = ix.uncore_mask[uncore] & d
        cores = [c for c in ix.uncore_cores[uncore] if ix.core_mask[c] & here][:cores_needed]
        cpus = 0
        for c in cores:
            cpus |= ix.core_mask[c]
        cpus &= d
        if self.need % 2 and ix.cpus_per_core > 1 and cpus.bit_count() > self.need:
            cpus &= ~(1 << (cpus.bit_length() - 1))
        if cpus.bit_count() == self.need:
            self.take(cpus)

    def take_single_cpus(self, strategy: Strategy) -> None:
        picked = 0
        for cpu in itertools.islice(self.sorted_cpus(strategy), self.need):
            picked |= 1 << cpu
        self.take(picked)


def _take_packed(
    ix: _Index,
    details: int,
    count: int,
    available_size: int,
    strategy: Strategy,
    align_by_uncore: bool,
) -> int:
    """TakeByTopologyNUMAPacked on a details mask (already restricted to topology CPUs)."""
    acc = _Packer(ix, details, count)
    if acc.satisfied():
        return 0
    if acc.need > details.bit_count():
        raise _not_enough(count, available_size)
    levels: list[tuple[Callable[[], list[int]], Mapping[int, int]]] = [
        (acc.sort_numa, ix.numa_mask),
        (acc.sort_sockets, ix.socket_mask),
    ]
    if not ix.numa_first:
        levels.reverse()
    for order, masks in levels:
        acc.take_whole(order(), masks)
        if acc.satisfied():
            return acc.result
    if align_by_uncore:
        acc.take_uncore()
        if acc.satisfied():
            return acc.result
    if strategy != "spread":
        acc.take_whole(acc.sort_cores(), ix.core_mask)
        if acc.satisfied():
            return acc.result
    acc.take_single_cpus(strategy)
    if acc.satisfied():
        return acc.result
    raise AllocationError("failed to allocate cpus")


# -- options: fullPCPUsOnly and distributeAcrossNUMA -------------------------------------


def _whole_cores(ix: _Index, details: int) -> tuple[int, int]:
    """(mask of the cores wholly inside ``details``, how many such cores)."""
    mask = count = 0
    for core in ix.core_mask:
        if core & ~details == 0:
            mask |= core
            count += 1
    return mask, count


def _is_whole_cores(ix: _Index, mask: int) -> bool:
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
    ix: _Index, pool: int, count: int, group: int, options: AllocationOptions
) -> int:
    """Split ``count`` evenly (in groups of ``group`` CPUs) over the fewest NUMA nodes."""
    nodes = [(n, (pool & m).bit_count() // group) for n, m in ix.numa_mask.items() if pool & m]
    nodes.sort(key=lambda item: (-item[1], item[0]))
    plan = _even_shares(nodes, count // group)
    if not plan:
        # No even split exists (small nodes): fall back to plain packing over the pool.
        return _take_packed(
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
        result |= _take_packed(
            ix,
            local,
            share * group,
            local.bit_count(),
            options.strategy,
            options.prefer_align_by_uncore_cache,
        )
    return result


def _take_full_pcpus(
    ix: _Index, details: int, count: int, available_size: int, options: AllocationOptions
) -> int:
    per_core = max(ix.cpus_per_core, 1)
    if count % per_core:
        raise AllocationError(
            f"fullPCPUsOnly: requested {count} CPUs is not a multiple of "
            f"{per_core} threads per core"
        )
    if count > details.bit_count():
        raise _not_enough(count, available_size)
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
        result = _take_packed(
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
    ix = _index(topo)
    details = available.mask & ix.all_mask
    if count < 1:
        return CPUSet()
    if options.full_pcpus_only:
        result = _take_full_pcpus(ix, details, count, len(available), options)
    elif options.distribute_across_numa:
        if count > details.bit_count():
            raise _not_enough(count, len(available))
        result = _take_spread_over_numa(ix, details, count, 1, options)
    else:
        result = _take_packed(
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


def _numa_range(ix: _Index, details: int, need: int, group: int) -> tuple[int, int]:
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
    ix = _index(topo)
    details = available.mask & ix.all_mask

    def packed(pool: int, n: int) -> int:
        return _take_packed(ix, pool, n, len(available), strategy, False)

    if count % cpu_group_size:
        return CPUSet.from_mask(packed(details, count))
    acc = _Packer(ix, details, count)
    if acc.satisfied():
        return CPUSet()
    if count > details.bit_count():
        raise _not_enough(count, len(available))
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
