"""Allocation state: which claim holds which CPUs, who uses each claim, which containers run.

Three small pure stores (behavior.md §12), owned by one task and never shared across awaits:

- ``AllocationStore``: claim UID -> ``ClaimRecord`` (its exclusive CPUs); the shared pool is
  the allocatable CPUs no claim holds. Reserved CPUs are in neither: they are not
  allocatable, so no claim can get them and no shared container runs on them. A claim
  being prepared is *pending* until its CDI spec and checkpoint are on disk: its CPUs are
  kept from every other reservation but it is not prepared yet for anyone who asks
  (``get``, ``validate``, the shared pool). A claim being unprepared is *releasing*: still
  prepared, but left out of the next checkpoint.
- ``ClaimTracker``: claim UID -> the one container that uses it.
- ``ContainerState``: pod UID -> container name -> runtime id and claims, plus the ids of
  the shared containers (those without claims) that follow the shared pool.

Messages are the claim-facing errors of §8.7, §12 and §13.3, word for word.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import msgspec

from dracpu.allocation.options import AllocationOptions
from dracpu.cpuset import CPUSet
from dracpu.gofmt import go_quote

__all__ = [
    "AllocationStore",
    "ClaimRecord",
    "ClaimTracker",
    "ContainerRecord",
    "ContainerState",
    "Owner",
    "OwnerError",
    "PreparedDevice",
    "StateError",
    "StoreError",
    "StoreSnapshot",
]


class StateError(Exception):
    """Base of the allocation-state errors; ``str(exc)`` is the user-facing message."""


class StoreError(StateError):
    """A reservation or validation the allocation store refuses."""


class OwnerError(StateError):
    """A claim cannot be bound to a container."""


class PreparedDevice(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One prepared device of a claim (§8.5): one per allocation result of this driver.

    ``request_names`` holds the result's request as the claim names it (``main/sub`` kept;
    the kubelet reply strips the sub-request). ``allocated_num_cpus`` is the result's
    ``dra.cpu/cpu`` consumed capacity when it had one, for the device metadata.
    """

    pool_name: str
    device_name: str
    request_names: tuple[str, ...] = ()
    allocated_num_cpus: int | None = None


class ClaimRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A prepared claim. ``options`` maps request name -> the AllocationOptions its config set.

    Synchronize learns a claim from a container's env only, so it records the UID and CPUs
    and leaves the rest empty.
    """

    uid: str
    cpus: CPUSet
    namespace: str = ""
    name: str = ""
    devices: tuple[PreparedDevice, ...] = ()
    options: dict[str, AllocationOptions] = msgspec.field(default_factory=dict)

    @property
    def shared_pool_access(self) -> bool:
        """A request of the claim asked for the shared pool beside its exclusive CPUs."""
        return any(o.shared_pool_access for o in self.options.values())


class StoreSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Gauge values (§15): sizes of the prepared CPUs, the shared pool, the configured
    reserved set (CPUs outside the topology included), and the number of claims."""

    allocated: int
    available: int
    reserved: int
    active: int


class AllocationStore:
    """Claims and their exclusive CPUs. ``available`` is fixed at construction."""

    def __init__(
        self,
        available: CPUSet,
        reserved: CPUSet,
        isolated: CPUSet | None = None,
        *,
        floor: CPUSet | None = None,
    ) -> None:
        # The caller passes topology CPUs minus reserved; subtracting again keeps the
        # "reserved is never handed out" promise even when a caller forgets.
        # ``floor``: CPUs that stay in the shared pool whatever is claimed (the daemon
        # passes the reserved CPUs of this machine, or the core it keeps when there are
        # none), so containers without a claim always have somewhere to run, as the
        # kubelet's CPU Manager keeps its reserved CPUs in its shared pool.
        self._floor = floor or CPUSet()
        self._available = available - reserved - self._floor
        self._reserved = reserved
        # Isolated CPUs (isolcpus=) can be claimed, but the kernel does not balance load
        # onto them: no shared container ever runs there.
        self._isolated = (isolated or CPUSet()) & self._available
        # Present CPUs the kernel has offline now (hotplug): claims keep them, nothing new
        # gets them, no shared container runs there.
        self._offline = CPUSet()
        self._claims: dict[str, ClaimRecord] = {}
        self._prepared = CPUSet()
        self._pending: dict[str, ClaimRecord] = {}
        self._pending_cpus = CPUSet()
        self._releasing: set[str] = set()

    # -- queries ------------------------------------------------------------------------
    @property
    def available(self) -> CPUSet:
        """Allocatable CPUs: the topology without the reserved ones."""
        return self._available

    @property
    def reserved(self) -> CPUSet:
        """The configured reserved set, as given."""
        return self._reserved

    @property
    def prepared(self) -> CPUSet:
        """Union of every claim's CPUs."""
        return self._prepared

    @property
    def isolated(self) -> CPUSet:
        """Allocatable CPUs the kernel isolates; never in the shared pool."""
        return self._isolated

    @property
    def offline(self) -> CPUSet:
        return self._offline

    @property
    def floor(self) -> CPUSet:
        """CPUs that are always shared and never claimed (see the constructor)."""
        return self._floor

    def set_offline(self, cpus: CPUSet) -> bool:
        """The allocatable and floor CPUs that are offline now; True when that changed."""
        cpus &= self._available | self._floor
        changed = cpus != self._offline
        self._offline = cpus
        return changed

    @property
    def shared_pool(self) -> CPUSet:
        return (self._available | self._floor) - (self._prepared | self._isolated | self._offline)

    @property
    def free(self) -> CPUSet:
        """CPUs a new reservation may take: unclaimed, not pending, online (isolated
        included)."""
        return self._available - self._prepared - self._pending_cpus - self._offline

    def get(self, claim_uid: str) -> ClaimRecord | None:
        return self._claims.get(claim_uid)

    def cpus_of(self, claim_uid: str) -> CPUSet | None:
        record = self._claims.get(claim_uid)
        return None if record is None else record.cpus

    def __contains__(self, claim_uid: object) -> bool:
        return claim_uid in self._claims

    def __len__(self) -> int:
        return len(self._claims)

    def records(self) -> list[ClaimRecord]:
        """Every claim, in the order they were reserved."""
        return list(self._claims.values())

    def durable_records(self) -> list[ClaimRecord]:
        """What the checkpoint must hold: prepared claims not being released, and pending
        ones (their prepare is waiting for exactly that write)."""
        kept = [r for r in self._claims.values() if r.uid not in self._releasing]
        return kept + list(self._pending.values())

    def snapshot(self) -> StoreSnapshot:
        return StoreSnapshot(
            allocated=len(self._prepared),
            available=len(self._available - self._prepared - self._offline),
            reserved=len(self._reserved),
            active=len(self._claims),
        )

    # -- changes ------------------------------------------------------------------------
    def reserve(self, record: ClaimRecord, *, pending: bool = False) -> bool:
        """Record a claim's CPUs. False when the same CPUs were already recorded (no-op).

        Raises StoreError when the claim holds other CPUs, or when the CPUs are not all
        free (held by another claim, pending, reserved, or outside the machine). With
        ``pending`` the claim waits for ``commit`` (or ``discard``) before it is prepared.
        """
        uid = record.uid
        old = self._claims.get(uid) or self._pending.get(uid)
        if old is not None:
            if old.cpus == record.cpus:
                return False
            raise StoreError(
                f"claim {go_quote(uid)} is already prepared with CPUs "
                f"{go_quote(old.cpus.format())} (requested {go_quote(record.cpus.format())})"
            )
        if not record.cpus <= self.free:
            raise StoreError(
                f"claim {go_quote(uid)} has overlapping CPU assignment "
                f"{go_quote(record.cpus.format())}"
            )
        if pending:
            self._keep_pool_for(record)
            self._pending[uid] = record
            self._pending_cpus |= record.cpus
        else:
            self._claims[uid] = record
            self._prepared |= record.cpus
        return True

    def _keep_pool_for(self, record: ClaimRecord) -> None:
        """Refuse a new claim that would leave no online CPU to containers without one.

        Pending claims count as taken: two prepares in flight must not empty it together.
        Claims learnt from the checkpoint or the runtime are not refused (they already run).
        """
        shared = self.shared_pool - self._pending_cpus
        if not record.cpus & shared or shared - record.cpus:
            return  # takes no shared CPU (an isolated one, say), or leaves one
        where = f"{record.namespace}/{record.name}" if record.name else record.uid
        raise StoreError(
            f"prepare of claim {where} would empty the shared pool: it takes "
            f"{len(record.cpus & shared)} of the {len(shared)} shared CPUs and containers "
            "without a claim need at least one (reservedCPUs, or the core dracpu keeps when "
            "reservedCPUs holds no CPU of this node, stays shared)"
        )

    def commit(self, claim_uid: str) -> ClaimRecord | None:
        """A pending claim becomes prepared; returns it (None when it was not pending)."""
        record = self._pending.pop(claim_uid, None)
        if record is None:
            return None
        self._pending_cpus -= record.cpus
        self._claims[claim_uid] = record
        self._prepared |= record.cpus
        return record

    def discard(self, claim_uid: str) -> None:
        """Drop a pending claim (its prepare failed); nobody ever saw it."""
        record = self._pending.pop(claim_uid, None)
        if record is not None:
            self._pending_cpus -= record.cpus

    def begin_release(self, claim_uid: str) -> ClaimRecord | None:
        """Leave a prepared claim out of the next checkpoint; it stays prepared meanwhile."""
        record = self._claims.get(claim_uid)
        if record is not None:
            self._releasing.add(claim_uid)
        return record

    def cancel_release(self, claim_uid: str) -> None:
        """The checkpoint without the claim could not be written: keep it as it was."""
        self._releasing.discard(claim_uid)

    def release(self, claim_uid: str) -> CPUSet:
        """Forget a claim; returns the CPUs it held (empty for an unknown claim)."""
        self._releasing.discard(claim_uid)
        record = self._claims.pop(claim_uid, None)
        if record is None:
            return CPUSet()
        self._prepared -= record.cpus
        return record.cpus

    def validate(self, claims: Mapping[str, CPUSet]) -> None:
        """Check that each claim is recorded with exactly these CPUs (§12, §13.3)."""
        for uid, cpus in claims.items():
            record = self._claims.get(uid)
            if record is None:
                raise StoreError(f"claim {go_quote(uid)} is not prepared by this driver")
            if record.cpus != cpus:
                raise StoreError(
                    f"validation failed for claim {go_quote(uid)}: cpuset mismatch "
                    f"(expected {go_quote(record.cpus.format())}, got {go_quote(cpus.format())})"
                )


class Owner(msgspec.Struct, frozen=True):
    """The container that uses a claim."""

    pod_uid: str
    container_name: str


class ClaimTracker:
    """One claim <-> one container. Owners go away only with the claim (Unprepare)."""

    def __init__(self) -> None:
        self._owners: dict[str, Owner] = {}

    def owner_of(self, claim_uid: str) -> Owner | None:
        return self._owners.get(claim_uid)

    def owners(self) -> dict[str, Owner]:
        return dict(self._owners)

    def set_owner(self, pod_uid: str, container_name: str, claim_uids: Sequence[str]) -> list[str]:
        """Bind the claims to the container; returns the ones bound now ("newly bound").

        All or nothing: when one claim belongs to another container nothing is bound.
        """
        if not claim_uids:
            raise OwnerError("no claims to bind")
        owner = Owner(pod_uid, container_name)
        for uid in claim_uids:
            current = self._owners.get(uid)
            if current is not None and current != owner:
                raise OwnerError(
                    f"claimUID {go_quote(uid)} already bound to pod "
                    f"{go_quote(current.pod_uid)} container {go_quote(current.container_name)}"
                )
        newly_bound: list[str] = []
        for uid in claim_uids:
            if uid not in self._owners:
                self._owners[uid] = owner
                newly_bound.append(uid)
        return newly_bound

    def release(self, claim_uids: Iterable[str]) -> None:
        """Drop the owners of these claims (unknown ones are ignored)."""
        for uid in claim_uids:
            self._owners.pop(uid, None)


class ContainerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the plugin knows of one container; ``claim_uids`` empty means shared.

    ``cgroups_path`` is the runtime's ``linux.cgroups_path`` (empty when unknown): the
    cgroupfs fallback and drift watcher find the container's cpuset through it.
    """

    pod_uid: str
    name: str
    container_id: str
    claim_uids: tuple[str, ...] = ()
    cgroups_path: str = ""

    @property
    def is_shared(self) -> bool:
        return not self.claim_uids


class SandboxRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A pod sandbox (the pause container) the runtime reported, with its cgroup.

    NRI cannot update a sandbox, and runc starts its cgroup on every CPU of the parent
    (cgroup v1 copies the parent's cpuset; v2 inherits the parent's effective set), so
    dracpu keeps each sandbox on the shared pool by writing its cgroup itself.
    """

    pod_uid: str
    sandbox_id: str
    cgroups_path: str


class ContainerState:
    """Pod UID -> container name -> record, and the shared containers in arrival order."""

    def __init__(self) -> None:
        self._pods: dict[str, dict[str, ContainerRecord]] = {}
        # Used as an ordered set: updates to shared containers go out in a stable order.
        self._shared: dict[str, None] = {}
        self._by_id: dict[str, ContainerRecord] = {}

    def get(self, pod_uid: str, name: str) -> ContainerRecord | None:
        return self._pods.get(pod_uid, {}).get(name)

    def by_id(self, container_id: str) -> ContainerRecord | None:
        """The container with this runtime id, if known."""
        return self._by_id.get(container_id)

    def set(self, record: ContainerRecord) -> ContainerRecord | None:
        """Record a container, replacing an older one of the same (pod, name); returns it."""
        containers = self._pods.setdefault(record.pod_uid, {})
        old = containers.get(record.name)
        if old is not None:
            self._shared.pop(old.container_id, None)
            self._by_id.pop(old.container_id, None)
        containers[record.name] = record
        self._by_id[record.container_id] = record
        if record.is_shared:
            self._shared[record.container_id] = None
        return old

    def remove(self, pod_uid: str, name: str, container_id: str) -> ContainerRecord | None:
        """Forget a container when the runtime id matches; None for stale or unknown events."""
        containers = self._pods.get(pod_uid)
        if containers is None:
            return None
        record = containers.get(name)
        if record is None or record.container_id != container_id:
            return None
        del containers[name]
        if not containers:
            del self._pods[pod_uid]
        self._shared.pop(container_id, None)
        self._by_id.pop(container_id, None)
        return record

    def __contains__(self, container_id: object) -> bool:
        """Whether a container with this runtime id is known."""
        return container_id in self._by_id

    def shared_container_ids(self) -> list[str]:
        return list(self._shared)

    def __iter__(self) -> Iterator[ContainerRecord]:
        for containers in self._pods.values():
            yield from containers.values()

    def __len__(self) -> int:
        return sum(len(c) for c in self._pods.values())
