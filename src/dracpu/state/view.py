"""``NodeView``: what the rest of the daemon may read of the node's state, and nothing more.

The owner (``state.owner.NodeState``) keeps its stores to itself; every other module reads
through this facade: the shared pool and online CPUs, a claim's CPUs, and above all the
cpuset dracpu intends for each container and pod sandbox (``ContainerIntent``), which the
NRI replies, the pool pusher and every cgroupfs writer act on. Nothing here changes state
or awaits, so a caller on the Trio thread sees one consistent instant.

The intent rules (behavior.md §13.3, §13.5 and dracpu's sandbox deviation): a shared
container and a pod sandbox follow the shared pool (none is listed while the pool is
empty); a claim holder runs on its claims' CPUs, plus the pool when one of its claims asked
for ``sharedPoolAccess``; a holder whose claims are all gone follows the pool.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from dracpu.allocation.store import ClaimRecord, ContainerRecord, Owner, SandboxRecord
from dracpu.cpuset import CPUSet
from dracpu.messages import ContainerIntent

if TYPE_CHECKING:
    from dracpu.state.owner import NodeState

__all__ = ["EMPTY_SHARED_POOL", "NodeView"]

# The NRI plugin's logger: these lines were the plugin's before the owner took the
# intents over, and -vmodule patterns or log searches may name it.
log = logging.getLogger("dracpu.nri.plugin")

EMPTY_SHARED_POOL = (
    "shared pool is empty: claims hold every allocatable CPU and the CPUs kept shared "
    "(reservedCPUs, or the core dracpu keeps) are offline"
)


class NodeView:
    """Read-only queries over one ``NodeState`` (always its current state, not a copy)."""

    __slots__ = ("_state",)

    def __init__(self, state: NodeState) -> None:
        self._state = state

    # -- CPUs -------------------------------------------------------------------------------
    @property
    def shared_pool(self) -> CPUSet:
        return self._state._store.shared_pool

    @property
    def online(self) -> CPUSet:
        """The CPUs online now (the last topology change the owner applied)."""
        return self._state.online

    @property
    def offline(self) -> CPUSet:
        """Allocatable CPUs that are offline now (claims keep theirs)."""
        return self._state._store.offline

    @property
    def free(self) -> CPUSet:
        """Allocatable CPUs no claim holds or keeps pending."""
        return self._state._store.free

    @property
    def allocatable(self) -> CPUSet:
        """CPUs a claim may ever get: the topology's, without the reserved CPUs and the
        shared pool's floor."""
        return self._state._store.available

    @property
    def reserved(self) -> CPUSet:
        """The configured reserved CPUs, as given."""
        return self._state._store.reserved

    @property
    def prepared(self) -> CPUSet:
        """The union of every prepared claim's CPUs (pending ones not included)."""
        return self._state._store.prepared

    @property
    def has_synchronized(self) -> bool:
        """Whether the runtime's first Synchronize was taken (until then running
        containers are unknown, not strangers)."""
        return self._state.has_synchronized

    # -- claims -----------------------------------------------------------------------------
    def claim(self, claim_uid: str) -> ClaimRecord | None:
        """A prepared claim (pending ones are not prepared yet)."""
        return self._state._store.get(claim_uid)

    def has_claim(self, claim_uid: str) -> bool:
        return claim_uid in self._state._store

    def cpus_of(self, claim_uid: str) -> CPUSet | None:
        """A prepared claim's CPUs, None when it is not prepared."""
        return self._state._store.cpus_of(claim_uid)

    def claims(self) -> list[ClaimRecord]:
        """Every prepared claim."""
        return self._state._store.records()

    def durable_claims(self) -> list[ClaimRecord]:
        """What the next checkpoint holds: prepared claims not being unprepared, then
        pending ones (their prepare waits for that write)."""
        return self._state._store.durable_records()

    def owner_of(self, claim_uid: str) -> Owner | None:
        """The container a claim is bound to (its first CreateContainer), if any."""
        return self._state._tracker.owner_of(claim_uid)

    def owners(self) -> dict[str, Owner]:
        """Claim UID -> the container it is bound to (a copy)."""
        return self._state._tracker.owners()

    def claims_cpus(self, claim_uids: Sequence[str]) -> CPUSet:
        """The union of the prepared CPUs of these claims (unknown ones add nothing)."""
        store = self._state._store
        if len(claim_uids) == 1:  # the usual holder: one claim, no union to build
            return store.cpus_of(claim_uids[0]) or CPUSet()
        cpus = CPUSet()
        for uid in claim_uids:
            held = store.cpus_of(uid)
            if held is not None:
                cpus |= held
        return cpus

    def follows_pool(self, claim_uids: Sequence[str]) -> bool:
        """Whether a claim holder also runs on the shared pool (``sharedPoolAccess``)."""
        store = self._state._store
        for uid in claim_uids:
            record = store.get(uid)
            if record is not None and record.shared_pool_access:
                return True
        return False

    def holder_cpus(self, claim_uids: Sequence[str]) -> CPUSet:
        """A claim holder's whole cpuset: its claims' CPUs, plus the shared pool when one
        of them asked for ``sharedPoolAccess``."""
        cpus = self.claims_cpus(claim_uids)
        if self.follows_pool(claim_uids):
            cpus |= self._state._store.shared_pool
        return cpus

    def mems(self, cpus: CPUSet) -> str:
        """The NUMA nodes of these CPUs when memory alignment is on, else empty."""
        mems_of = self._state.mems_of
        return mems_of(cpus) if mems_of is not None and cpus else ""

    def describe(self) -> dict[str, Any]:
        """The allocation part of ``/debug/state``: reserved CPUs, pool, claims and owners."""
        store = self._state._store
        owners = self._state._tracker.owners()
        return {
            "reserved": store.reserved.format(),
            "isolated": store.isolated.format(),
            "sharedFloor": store.floor.format(),
            "sharedPool": store.shared_pool.format(),
            "claims": [
                {
                    "uid": r.uid,
                    "namespace": r.namespace,
                    "name": r.name,
                    "cpus": r.cpus.format(),
                    "owner": (
                        {"podUID": owners[r.uid].pod_uid, "container": owners[r.uid].container_name}
                        if r.uid in owners
                        else None
                    ),
                }
                for r in sorted(store.records(), key=lambda r: r.uid)
            ],
        }

    # -- containers and sandboxes -----------------------------------------------------------
    def knows_container(self, container_id: str) -> bool:
        """Whether a container is tracked (created, not stopped or removed)."""
        return container_id in self._state._containers

    def container(self, container_id: str) -> ContainerRecord | None:
        return self._state._containers.by_id(container_id)

    def container_of(self, pod_uid: str, name: str) -> ContainerRecord | None:
        """The container of this pod with this name, if one is tracked."""
        return self._state._containers.get(pod_uid, name)

    def containers(self) -> list[ContainerRecord]:
        """Every tracked container (a copy of the list; the records are frozen)."""
        return list(self._state._containers)

    def shared_container_ids(self) -> list[str]:
        """The tracked containers without a claim, in the order they were created."""
        return self._state._containers.shared_container_ids()

    def sandbox_ids(self) -> list[str]:
        """The ids of the known pod sandboxes (RunPodSandbox, Synchronize's pods)."""
        return list(self._state._sandboxes)

    def sandbox_count(self) -> int:
        return len(self._state._sandboxes)

    def sandbox_intents(self) -> list[ContainerIntent]:
        """Every pod sandbox on the shared pool (none while the pool is empty). Only
        dracpu writes these: NRI has no update for a sandbox."""
        pool = self.shared_pool
        sandboxes = self._state._sandboxes
        if not pool:
            if sandboxes:
                log.error("cannot confine %d pod sandboxes: %s", len(sandboxes), EMPTY_SHARED_POOL)
            return []
        cpus = pool.format()
        return [sandbox_intent(s, cpus) for s in sandboxes.values()]

    def intents(self) -> list[ContainerIntent]:
        """What every known pod sandbox and container should run on, with its cgroups path
        (the rules in the module docstring)."""
        pool = self.shared_pool
        out: list[ContainerIntent] = self.sandbox_intents()
        for record in self._state._containers:
            intent = self._intent(record, pool)
            if intent is not None:
                out.append(intent)
        return out

    def intents_of(self, ids: Iterable[str]) -> dict[str, ContainerIntent]:
        """:meth:`intents` for these container or sandbox ids only (unknown ids and those
        with nothing to run on are left out): what a writer asks right before it writes,
        without building every container's intent each time."""
        state = self._state
        pool = self.shared_pool
        out: dict[str, ContainerIntent] = {}
        for cid in ids:
            record = state._containers.by_id(cid)
            if record is not None:
                intent = self._intent(record, pool)
            elif cid in state._sandboxes and pool:
                intent = sandbox_intent(state._sandboxes[cid], pool.format())
            else:
                intent = None
            if intent is not None:
                out[cid] = intent
        return out

    def still_wanted(self, intents: Iterable[ContainerIntent]) -> list[ContainerIntent]:
        """Those of ``intents`` dracpu still wants written: the container or sandbox is
        still known and its intent now has the same ``cpus`` (and the same ``mems``, when
        the intent sets them; empty ``mems`` leaves ``cpuset.mems`` alone). Any cgroupfs
        writer asks this right before it writes, so a set that a later change made stale
        (an unprepare grew the pool, the container stopped) is never written. Order kept.
        """
        asked = list(intents)
        current = self.intents_of([i.container_id for i in asked])
        return [i for i in asked if _same(current.get(i.container_id), i)]

    def is_wanted(self, intent: ContainerIntent) -> bool:
        """:meth:`still_wanted` for one intent."""
        return bool(self.still_wanted((intent,)))

    def shared_updates(self, exclude: str = "") -> list[ContainerIntent]:
        """Best-effort updates for every container that follows the shared pool: the
        shared ones, and claim holders whose claims asked for ``sharedPoolAccess`` (their
        claims' CPUs plus the pool). ``exclude`` is a container id to leave out."""
        containers = self._state._containers
        pool = self.shared_pool
        by_id = {r.container_id: r for r in containers if r.is_shared}
        records = [
            by_id[cid]
            for cid in containers.shared_container_ids()
            if cid in by_id and cid != exclude
        ]
        out: list[ContainerIntent] = []
        if records and not pool:
            log.error("cannot confine %d shared containers: %s", len(records), EMPTY_SHARED_POOL)
        elif records:
            cpus = pool.format()
            out = [best_effort_update(r, cpus) for r in records]
        for record in containers:
            claims = record.claim_uids
            if claims and record.container_id != exclude and self.follows_pool(claims):
                whole = self.holder_cpus(claims)
                out.append(best_effort_update(record, whole.format(), self.mems(whole)))
        return out

    def _intent(self, record: ContainerRecord, pool: CPUSet) -> ContainerIntent | None:
        cpus = self.holder_cpus(record.claim_uids) if record.claim_uids else CPUSet()
        mems = self.mems(cpus)
        if not cpus:
            cpus = pool
        if not cpus:
            return None
        return ContainerIntent(
            container_id=record.container_id,
            cgroups_path=record.cgroups_path,
            cpus=cpus.format(),
            mems=mems,
            pod_uid=record.pod_uid,
            name=record.name,
        )


def _same(current: ContainerIntent | None, intent: ContainerIntent) -> bool:
    return (
        current is not None
        and current.cpus == intent.cpus
        and (not intent.mems or current.mems == intent.mems)
    )


def sandbox_intent(record: SandboxRecord, cpus: str) -> ContainerIntent:
    """A pod sandbox's intent: the shared pool, marked as a sandbox."""
    return ContainerIntent(
        container_id=record.sandbox_id,
        cgroups_path=record.cgroups_path,
        cpus=cpus,
        pod_uid=record.pod_uid,
        sandbox=True,
    )


def best_effort_update(record: ContainerRecord, cpus: str, mems: str = "") -> ContainerIntent:
    """A best-effort update of another container (it may be exiting, protocols.md 6.6)."""
    return ContainerIntent(
        container_id=record.container_id,
        cpus=cpus,
        mems=mems,
        cgroups_path=record.cgroups_path,
        pod_uid=record.pod_uid,
        name=record.name,
        ignore_failure=True,
    )
