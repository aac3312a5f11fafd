"""The per-claim prepare decision (behavior.md §8.1-§8.3, §8.5, §8.6), without any I/O.

``plan_claim`` looks at one allocated claim and the current store and says which CPUs the
claim gets and which devices the kubelet is told about, or raises ``PrepareError`` with the
claim's error text. Carrying a plan out (reserve, write the files, commit or undo, §8.6,
§8.7) is the state owner's: ``dracpu.state.NodeState.begin_prepare`` and what follows it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import msgspec

from dracpu import DRIVER_NAME
from dracpu.allocation.allocator import AllocationError, take_cpus
from dracpu.allocation.opaque import (
    DeviceConfig,
    OpaqueConfigError,
    check_override,
    parse_cpuset_override,
    select_allocation_options,
    select_cpuset_override,
)
from dracpu.allocation.options import DEFAULT_OPTIONS, AllocationOptions
from dracpu.allocation.quantity import QuantityError, is_whole, parse_quantity
from dracpu.allocation.store import (
    AllocationStore,
    ClaimRecord,
    PreparedDevice,
)
from dracpu.cpuset import CPUSet
from dracpu.devices.model import CAPACITY_CPU
from dracpu.gofmt import go_quote
from dracpu.topology.model import Topology

__all__ = [
    "AllocationResult",
    "ClaimAllocation",
    "ClaimPlan",
    "DeviceNames",
    "PrepareError",
    "plan_claim",
]


class PrepareError(Exception):
    """The claim cannot be prepared; ``str(exc)`` is the per-claim error of the reply."""


class AllocationResult(msgspec.Struct, frozen=True, kw_only=True):
    """One ``status.allocation.devices.results[]`` entry (the fields prepare reads)."""

    request: str
    driver: str
    pool: str
    device: str
    consumed_capacity: dict[str, str] = msgspec.field(default_factory=dict)
    share_id: str = ""


class ClaimAllocation(msgspec.Struct, frozen=True, kw_only=True):
    """A ResourceClaim as prepare sees it. ``allocated`` is False when status.allocation is
    nil; ``configs`` is ``status.allocation.devices.config[]``."""

    uid: str
    namespace: str
    name: str
    allocated: bool = True
    results: tuple[AllocationResult, ...] = ()
    configs: tuple[DeviceConfig, ...] = ()


class ClaimPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What prepare decided. ``already_prepared``: the store held the claim already, so
    the state owner leaves the store alone and only the CDI spec is rewritten."""

    record: ClaimRecord
    already_prepared: bool = False

    @property
    def claim_uid(self) -> str:
        return self.record.uid

    @property
    def cpus(self) -> CPUSet:
        return self.record.cpus

    @property
    def devices(self) -> tuple[PreparedDevice, ...]:
        return self.record.devices

    @property
    def is_empty(self) -> bool:
        """Nothing for this driver: no devices, no CDI spec, no reservation."""
        return not self.record.devices


class DeviceNames(Protocol):
    """The published device names prepare resolves (devices.DeviceInventory provides them).

    ``mode`` is ``individual`` or ``grouped``; ``group_by`` is ``numanode``, ``socket`` or
    ``machine``. ``cpu_of_device`` is filled in individual mode, ``group_of_device`` (NUMA
    or socket id) in grouped numanode/socket mode.
    """

    @property
    def mode(self) -> str: ...

    @property
    def group_by(self) -> str: ...

    @property
    def cpu_of_device(self) -> Mapping[str, int]: ...

    @property
    def group_of_device(self) -> Mapping[str, int]: ...


# -- planning ----------------------------------------------------------------------------------


def _claim_ref(claim: ClaimAllocation) -> str:
    return f"{claim.namespace}/{claim.name}"


def _allocated_num_cpus(result: AllocationResult) -> int | None:
    raw = result.consumed_capacity.get(CAPACITY_CPU)
    if raw is None:
        return None
    try:
        return math.ceil(parse_quantity(raw))
    except QuantityError:
        return None


def _prepared_device(result: AllocationResult, allocated: int | None) -> PreparedDevice:
    return PreparedDevice(
        pool_name=result.pool,
        device_name=result.device,
        request_names=(result.request,) if result.request else (),
        allocated_num_cpus=allocated,
    )


def _devices(results: Sequence[AllocationResult]) -> tuple[PreparedDevice, ...]:
    return tuple(_prepared_device(r, _allocated_num_cpus(r)) for r in results)


def _record(
    claim: ClaimAllocation,
    cpus: CPUSet,
    results: Sequence[AllocationResult],
    options: dict[str, AllocationOptions] | None = None,
) -> ClaimRecord:
    return ClaimRecord(
        uid=claim.uid,
        namespace=claim.namespace,
        name=claim.name,
        cpus=cpus,
        devices=_devices(results),
        options=options or {},
    )


def _again(
    claim: ClaimAllocation, stored: ClaimRecord, results: Sequence[AllocationResult]
) -> ClaimPlan:
    # A repeated prepare: stored CPUs, devices of the results as they are now (§8.2 step 2).
    record = msgspec.structs.replace(
        stored, namespace=claim.namespace, name=claim.name, devices=_devices(results)
    )
    return ClaimPlan(record=record, already_prepared=True)


def _plan_individual(
    claim: ClaimAllocation,
    ours: Sequence[AllocationResult],
    names: DeviceNames,
    store: AllocationStore,
) -> ClaimPlan:
    mask = 0
    for result in ours:
        cpu = names.cpu_of_device.get(result.device)
        if cpu is None:
            raise PrepareError(
                f"device {go_quote(result.device)} not found in device to CPU ID map"
            )
        mask |= 1 << cpu
    cpus = CPUSet.from_mask(mask)
    if not ours:
        return ClaimPlan(record=_record(claim, cpus, ()))
    stored = store.get(claim.uid)
    if stored is not None:
        if stored.cpus == cpus:
            return _again(claim, stored, ours)
        raise PrepareError(
            f"claim {_claim_ref(claim)} is already prepared with different CPUs "
            f"{stored.cpus} (requested {cpus})"
        )
    if not cpus <= store.free:
        raise PrepareError(
            f"claim {_claim_ref(claim)} has overlapping device assignment with other claims"
        )
    return ClaimPlan(record=_record(claim, cpus, ours, _individual_options(claim, ours)))


def _individual_options(
    claim: ClaimAllocation, ours: Sequence[AllocationResult]
) -> dict[str, AllocationOptions]:
    """The options configs of an individual-mode claim. The scheduler chose its CPUs, so
    only what applies after allocation counts (``sharedPoolAccess``); a broken options
    config is still an error, as in grouped mode."""
    options: dict[str, AllocationOptions] = {}
    for result in ours:
        try:
            chosen = select_allocation_options(claim.configs, result.request)
        except OpaqueConfigError as exc:
            raise PrepareError(str(exc)) from None
        if chosen is not None:
            options[result.request] = chosen
    return options


def _requested_count(result: AllocationResult) -> int:
    """§8.2 step 3 capacity checks: the result's ``dra.cpu/cpu`` as a positive integer."""
    device = go_quote(result.device)
    raw = result.consumed_capacity.get(CAPACITY_CPU)
    if raw is None:
        raise PrepareError(f"CPU capacity {go_quote(CAPACITY_CPU)} for device {device} is missing")
    try:
        value = parse_quantity(raw)
    except QuantityError as exc:
        raise PrepareError(f"CPU capacity for device {device} is not a quantity: {exc}") from None
    if value <= 0:
        raise PrepareError(f"CPU capacity for device {device} must be positive, got {raw}")
    if not is_whole(value):
        raise PrepareError(f"CPU capacity for device {device} must be a whole number, got {raw}")
    return int(value)


_GROUP_WORDS = {"socket": "socket ID", "numanode": "NUMA node ID"}


def _pick_from_group(
    result: AllocationResult,
    count: int,
    *,
    configs: Sequence[DeviceConfig],
    names: DeviceNames,
    topology: Topology,
    free: CPUSet,
) -> tuple[CPUSet, AllocationOptions | None]:
    group = names.group_of_device.get(result.device)
    if group is None:
        word = _GROUP_WORDS.get(names.group_by, names.group_by)
        raise PrepareError(f"no valid {word} found for device {result.device}")
    by_group = topology.by_socket if names.group_by == "socket" else topology.by_numa
    candidates = free & by_group.get(group, CPUSet())
    try:
        options = select_allocation_options(configs, result.request) or DEFAULT_OPTIONS
    except OpaqueConfigError as exc:
        raise PrepareError(str(exc)) from None
    # A node boots with isolcpus= to set CPUs aside for pinned work, and the shared pool
    # can only live on the others: a claim takes isolated CPUs when they can hold it, then
    # the balanced ones, and mixes the two only when neither alone can.
    isolated = candidates & topology.isolated
    if isolated:
        for subset in (isolated, candidates - isolated):
            if len(subset) >= count:
                try:
                    return take_cpus(topology, subset, count, options), _chosen(options)
                except AllocationError:
                    pass
    try:
        return take_cpus(topology, candidates, count, options), _chosen(options)
    except AllocationError as exc:
        raise PrepareError(str(exc)) from None


def _chosen(options: AllocationOptions) -> AllocationOptions | None:
    return None if options is DEFAULT_OPTIONS else options


def _pick_override(
    result: AllocationResult,
    count: int,
    *,
    configs: Sequence[DeviceConfig],
    store: AllocationStore,
    online: CPUSet,
    assigned: CPUSet,
) -> CPUSet:
    try:
        config = select_cpuset_override(configs, result.request)
        cpus = parse_cpuset_override(config, result.request)
        check_override(
            cpus,
            count=count,
            online=online,
            reserved=store.reserved,
            assigned=assigned,
            prepared=store.prepared,
        )
    except OpaqueConfigError as exc:
        raise PrepareError(str(exc)) from None
    return cpus


def _plan_grouped(
    claim: ClaimAllocation,
    ours: Sequence[AllocationResult],
    *,
    names: DeviceNames,
    topology: Topology,
    store: AllocationStore,
    online: CPUSet,
) -> ClaimPlan:
    stored = store.get(claim.uid)
    if stored is not None:
        return _again(claim, stored, ours)
    free = store.free
    assigned = CPUSet()
    options: dict[str, AllocationOptions] = {}
    for result in ours:
        count = _requested_count(result)
        if names.group_by == "machine":
            pick = _pick_override(
                result, count, configs=claim.configs, store=store, online=online, assigned=assigned
            )
        else:
            pick, chosen = _pick_from_group(
                result,
                count,
                configs=claim.configs,
                names=names,
                topology=topology,
                free=free - assigned,
            )
            if chosen is not None:
                options[result.request] = chosen
        assigned |= pick
    if not assigned:
        return ClaimPlan(record=_record(claim, assigned, ()))
    return ClaimPlan(record=_record(claim, assigned, ours, options))


def plan_claim(
    claim: ClaimAllocation,
    *,
    inventory: DeviceNames,
    topology: Topology,
    store: AllocationStore,
    online: CPUSet,
) -> ClaimPlan:
    """Decide one claim's CPUs and devices; PrepareError carries the claim's error text."""
    if not claim.allocated:
        raise PrepareError(f"claim {_claim_ref(claim)} has no allocation")
    ours = [r for r in claim.results if r.driver == DRIVER_NAME]
    if inventory.mode == "individual":
        return _plan_individual(claim, ours, inventory, store)
    return _plan_grouped(
        claim, ours, names=inventory, topology=topology, store=store, online=online
    )
