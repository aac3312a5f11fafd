"""kubelet's TakeByTopologyNUMAPacked (behavior.md §9.1-§9.3) over a per-topology index.

The steps and orderings are upstream's; the deviations are listed in allocator.py. Where
upstream repeats work the run here does it once, so a whole-machine request stays close to
linear in the number of CPUs, with the same answer:

- Upstream re-sorts every L3 group and retries every free one before each partial L3 take.
  After the first pass no free group fits the need, and a partial take either meets the
  whole need or takes nothing, so one sort and one pass take the same CPUs.
- A partial L3 take is skipped without touching a mask when all the cores of the group
  together could not hold the CPUs still needed.
- Whole units of one kind are disjoint, so a pass checks "free" against the details as they
  were before it and takes everything it found at once.
- The available CPUs of each core are counted in one pass over the details, and the whole
  core step keeps the counts in step for the single-CPU step, instead of a mask operation
  per core in every sort.
- Single CPUs are the lowest CPUs of each core (or socket) in order, taken as a prefix of
  masks rather than one bit at a time.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress

from dracpu.allocation.options import Strategy
from dracpu.topology.model import NO_ID, Topology

__all__ = [
    "AllocationError",
    "Packer",
    "TopologyIndex",
    "not_enough",
    "take_packed",
    "topology_index",
]


class AllocationError(Exception):
    """The request cannot be met from the available CPUs; the message is the claim error."""


def not_enough(requested: int, available: int) -> AllocationError:
    return AllocationError(
        "not enough cpus available to satisfy request: "
        f"requested={requested}, available={available}"
    )


# -- per-topology index ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopologyIndex:
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
    core_size: Sequence[int]  # CPUs per core
    core_of: Sequence[int]  # CPU id -> core index (-1 for ids not in the topology)
    # Every core's CPUs share one NUMA node, so a core listed under a node and with any CPU
    # available has it in that node (false only on odd sysfs data).
    cores_in_one_numa: bool
    numa_sockets: Mapping[int, Sequence[int]]
    socket_numas: Mapping[int, Sequence[int]]
    numa_uncores: Mapping[int, Sequence[int]]
    numa_cores: Mapping[int, Sequence[int]]
    socket_cores: Mapping[int, Sequence[int]]
    uncore_cores: Mapping[int, Sequence[int]]
    # CPUs of all the cores that have a CPU in the uncore group: the most a partial take
    # of that group can ever pick.
    uncore_reach: Mapping[int, int]


def _links(pairs: Iterable[tuple[int, int]]) -> dict[int, tuple[int, ...]]:
    out: dict[int, set[int]] = {}
    for a, b in pairs:
        out.setdefault(a, set()).add(b)
    return {a: tuple(sorted(bs)) for a, bs in sorted(out.items())}


def _build_index(topo: Topology) -> TopologyIndex:
    core_index = {key: i for i, key in enumerate(topo.by_core_key)}
    core_mask = tuple(s.mask for s in topo.by_core_key.values())
    has_l3 = topo.num_uncore_caches > 0
    # Without any L3 information, the socket stands in for the uncore group.
    uncore_of = {cpu: (info.l3 if has_l3 else info.socket) for cpu, info in topo.cpus.items()}
    uncore_mask: dict[int, int] = {}
    for cpu, uncore in uncore_of.items():
        if uncore != NO_ID:
            uncore_mask[uncore] = uncore_mask.get(uncore, 0) | 1 << cpu
    infos = list(topo.cpus.values())
    with_uncore = [i for i in infos if uncore_of[i.cpu] != NO_ID]
    uncore_cores = _links((uncore_of[i.cpu], core_index[i.core_key]) for i in with_uncore)
    core_of = [-1] * (max(topo.cpus, default=-1) + 1)
    for info in infos:
        core_of[info.cpu] = core_index[info.core_key]
    core_numas = {(core_of[i.cpu], i.numa) for i in infos}
    return TopologyIndex(
        all_mask=topo.all_cpus.mask,
        numa_first=topo.num_sockets >= topo.num_numa_nodes,
        cpus_per_core=topo.cpus_per_core,
        cpus_per_socket=topo.cpus_per_socket,
        cpus_per_uncore=topo.cpus_per_uncore if has_l3 else topo.cpus_per_socket,
        numa_mask={n: s.mask for n, s in topo.by_numa.items()},
        socket_mask={n: s.mask for n, s in topo.by_socket.items()},
        uncore_mask=dict(sorted(uncore_mask.items())),
        core_mask=core_mask,
        core_size=tuple(m.bit_count() for m in core_mask),
        core_of=core_of,
        cores_in_one_numa=len(core_numas) == len(core_mask),
        numa_sockets=_links((i.numa, i.socket) for i in infos),
        socket_numas=_links((i.socket, i.numa) for i in infos),
        numa_uncores=_links((i.numa, uncore_of[i.cpu]) for i in with_uncore),
        numa_cores=_links((i.numa, core_index[i.core_key]) for i in infos),
        socket_cores=_links((i.socket, core_index[i.core_key]) for i in infos),
        uncore_cores=uncore_cores,
        uncore_reach={
            u: sum(core_mask[c].bit_count() for c in cores) for u, cores in uncore_cores.items()
        },
    )


# Topology is unhashable (it holds dicts), so the cache is keyed by id() and each entry is
# dropped by a finalizer when its Topology is collected (so a reused id never hits).
_INDEX_CACHE: dict[int, TopologyIndex] = {}


def topology_index(topo: Topology) -> TopologyIndex:
    """The index of ``topo``, built on first use and cached while ``topo`` lives."""
    found = _INDEX_CACHE.get(id(topo))
    if found is None:
        found = _build_index(topo)
        _INDEX_CACHE[id(topo)] = found
        weakref.finalize(topo, _INDEX_CACHE.pop, id(topo), None)
    return found


def _unique(ids: Iterable[int]) -> list[int]:
    return list(dict.fromkeys(ids))


_DIGIT_VALUES = bytes.maketrans(b"01", b"\x00\x01")


def _cpus(mask: int) -> list[int]:
    """The set bits of ``mask``, ascending: one pass over its binary digits, in C."""
    digits = f"{mask:b}".encode()[::-1].translate(_DIGIT_VALUES)
    return list(compress(range(len(digits)), digits))


def _lowest(mask: int, count: int) -> int:
    """The ``count`` lowest set bits of ``mask`` (all of them when it has fewer)."""
    if count >= mask.bit_count():
        return mask
    if count < 1:
        return 0
    # Bisect for the shortest prefix of bit positions that holds ``count`` set bits.
    short, long = 0, mask.bit_length()
    while long - short > 1:
        mid = (short + long) // 2
        if (mask & ((1 << mid) - 1)).bit_count() < count:
            short = mid
        else:
            long = mid
    return mask & ((1 << long) - 1)


def _first_cpus(parts: Iterable[int], count: int) -> int:
    """The first ``count`` CPUs of disjoint ``parts`` in order, each part's CPUs ascending."""
    picked = 0
    for part in parts:
        size = part.bit_count()
        if size >= count:
            return picked | _lowest(part, count)
        picked |= part
        count -= size
    return picked


# -- the packed algorithm (§9.1-§9.3) ----------------------------------------------------


class Packer:
    """One TakeByTopologyNUMAPacked run: ``details`` shrinks as ``result`` grows.

    ``free`` counts the available CPUs of each core when something keeps it in step with
    ``details``, else it is None and is counted again when next needed.
    """

    __slots__ = ("details", "free", "ix", "need", "result")

    def __init__(self, ix: TopologyIndex, details: int, need: int) -> None:
        self.ix = ix
        self.details = details
        self.need = need
        self.result = 0
        self.free: list[int] | None = None

    def satisfied(self) -> bool:
        return self.need < 1

    def take(self, mask: int, free_after: list[int] | None = None) -> None:
        """Move ``mask`` to the result; ``free_after`` is the per-core count afterwards."""
        self.result |= mask
        self.details &= ~mask
        self.need -= mask.bit_count()
        self.free = free_after

    def free_per_core(self) -> list[int]:
        if self.free is None:
            core_of = self.ix.core_of
            self.free = free = [0] * len(self.ix.core_mask)
            for cpu in _cpus(self.details):
                free[core_of[cpu]] += 1
        return self.free

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
        free = self.free_per_core()
        # Core lists are ascending, so a stable sort by free count is the (count, id) order.
        by_free = free.__getitem__
        out: list[int] = []
        if ix.numa_first:
            for s in self.sort_sockets():
                out += sorted([c for c in ix.socket_cores[s] if free[c]], key=by_free)
            return _unique(out)
        for n in self.sort_numa():
            if ix.cores_in_one_numa:
                listed = [c for c in ix.numa_cores[n] if free[c]]
            else:
                here = ix.numa_mask[n] & d
                listed = [c for c in ix.numa_cores[n] if ix.core_mask[c] & here]
            out += sorted(listed, key=by_free)
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

    # -- steps (§9.3) -----------------------------------------------------------------
    def take_whole(self, ids: Iterable[int], masks: Mapping[int, int] | Sequence[int]) -> None:
        """Take each unit that is wholly available and no larger than what is still needed.

        Units of one kind are disjoint: taking one never changes whether another is free,
        so upstream's list of free units computed before the loop is checked as we go,
        against the details as they were, and the units found are taken together.
        """
        details, need, taken = self.details, self.need, 0
        for i in ids:
            mask = masks[i]
            if mask & details == mask and need >= (size := mask.bit_count()):
                taken |= mask
                need -= size
        self.take(taken)

    def take_whole_cores(self, order: Iterable[int]) -> None:
        """``take_whole`` for cores, deciding "free" on the per-core counts."""
        ix = self.ix
        free, need, taken = self.free_per_core(), self.need, 0
        for c in order:
            size = ix.core_size[c]
            if free[c] == size and need >= size:
                taken |= ix.core_mask[c]
                need -= size
                free[c] = 0
        self.take(taken, free)

    def take_uncore(self) -> None:
        ix = self.ix
        order = self.sort_uncore()
        # Upstream re-sorts and retries the free groups before each partial take. After
        # this pass no free group fits the need, and a partial take meets the whole need
        # or takes nothing, so those retries can never take a CPU.
        if self.need >= ix.cpus_per_uncore:
            self.take_whole(order, ix.uncore_mask)
        for uncore in order:
            if self.satisfied():
                return
            if ix.uncore_reach[uncore] >= self.need:
                self.take_partial_uncore(uncore)

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
        ix, d = self.ix, self.details
        if strategy == "spread":
            parts = (ix.socket_mask[s] & d for s in self.sort_sockets())
        else:
            parts = (ix.core_mask[c] & d for c in self.sort_cores())
        self.take(_first_cpus(parts, self.need))


def take_packed(
    ix: TopologyIndex,
    details: int,
    count: int,
    available_size: int,
    strategy: Strategy,
    align_by_uncore: bool,
) -> int:
    """TakeByTopologyNUMAPacked on a details mask (already restricted to topology CPUs)."""
    acc = Packer(ix, details, count)
    if acc.satisfied():
        return 0
    if acc.need > details.bit_count():
        raise not_enough(count, available_size)
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
        acc.take_whole_cores(acc.sort_cores())
        if acc.satisfied():
            return acc.result
    acc.take_single_cpus(strategy)
    if acc.satisfied():
        return acc.result
    raise AllocationError("failed to allocate cpus")
