"""What the NRI plugin decides for each runtime event (behavior.md §13), without I/O.

`NRIPlugin` turns a runtime event into a decision: the cpuset of a container being created
and the updates other containers need. It reads the daemon's state owner (`NodeState`),
changes it only through the owner's methods, and never awaits, so the NRI handlers can call
it from inside a runtime request.

Inputs are the NRI protobuf messages themselves (`api_pb2.PodSandbox`, `api_pb2.Container`):
the plugin reads only `pod.id`, `pod.uid`, `container.id`, `container.pod_sandbox_id`,
`container.name`, `container.env` and `container.linux.cgroups_path`.

Security rules (dracpu's, on top of upstream's):

- A ``DRA_CPUSET_<claim>`` value is trusted only when it equals the CPUs the claim was
  prepared with; a pod can write such env vars by hand. At CreateContainer a mismatch fails
  the creation with §12's validation error; a malformed value fails it with §13.2's error.
- An empty shared pool fails closed: a shared container cannot be created (``shared pool is
  empty: ...``) rather than being left on CPUs that claims hold.

Deviation from upstream, on purpose (behavior.md §13.5, §18, §19.7): upstream's Synchronize
wipes the allocation store and rebuilds it from container env, so a claim prepared but not yet
running is forgotten and its container later fails with "not prepared by this driver".
dracpu keeps every claim already in the store (they come from kubelet prepares or from the
daemon's checkpoint) and only *adds* claims that running containers carry and the store lacks,
after checking them against the CDI specs on disk (read by the caller off the Trio thread
when ``needs_cdi_specs`` says so). A container whose
env disagrees with the prepared CPUs of one of its claims (store or CDI) is treated as forged:
its claims are ignored and it is confined to the shared pool (logged). Synchronize never
aborts: a claim found in a second container, or a CDI claim overlapping CPUs already held, is
logged and that container is confined to the shared pool, where upstream would fail the whole
Synchronize and get dropped by the runtime in a loop. Container state and claim owners are
rebuilt from the runtime's list, as upstream does. A container with malformed DRA env is
skipped during Synchronize (no state, no update), exactly as upstream.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dracpu.allocation.store import ContainerRecord, OwnerError, SandboxRecord, StoreError
from dracpu.cdi.env import DRA_ENV_KEY_PREFIX, DRAEnvError, parse_dra_env
from dracpu.cpuset import CPUSet
from dracpu.messages import ContainerIntent
from dracpu.nri.sync import SyncPass, cgroups_path_of
from dracpu.proto.nri import api_pb2
from dracpu.state.owner import NodeState

__all__ = [
    "EMPTY_SHARED_POOL",
    "CreateDecision",
    "NRIPlugin",
    "NRIPluginError",
]

log = logging.getLogger(__name__)

EMPTY_SHARED_POOL = (
    "shared pool is empty: claims hold every allocatable CPU and the CPUs kept shared "
    "(reservedCPUs, or the core dracpu keeps) are offline"
)


class NRIPluginError(Exception):
    """A runtime event the plugin refuses; ``str(exc)`` is the error the runtime reports."""


@dataclass(frozen=True, slots=True)
class CreateDecision:
    """The reply to CreateContainer: the new container's cpuset and other containers' updates."""

    cpus: CPUSet
    mems: str = ""
    updates: list[ContainerIntent] = field(default_factory=list)
    claim_uids: tuple[str, ...] = ()


class NRIPlugin:
    """Event -> decision, over the daemon's allocation stores (see the module docstring)."""

    def __init__(self, state: NodeState) -> None:
        self._state = state

    # -- queries ----------------------------------------------------------------------------
    @property
    def shared_pool(self) -> CPUSet:
        return self._state.shared_pool

    def knows(self, container_id: str) -> bool:
        """Whether the container is one this plugin still tracks (not stopped or removed)."""
        return container_id in self._state.containers

    def needs_cdi_specs(self, containers: Sequence[api_pb2.Container]) -> bool:
        """Whether a container carries a claim the store lacks: then Synchronize checks it
        against the CDI specs on disk, which the caller reads (off the Trio thread) first."""
        store = self._state.store
        for container in containers:
            for entry in container.env:
                if not entry.startswith(DRA_ENV_KEY_PREFIX):
                    continue
                uid = entry.partition("=")[0][len(DRA_ENV_KEY_PREFIX) :]
                if uid not in store:
                    return True
        return False

    def _shared_records(self) -> list[ContainerRecord]:
        containers = self._state.containers
        by_id = {r.container_id: r for r in containers if r.is_shared}
        return [by_id[cid] for cid in containers.shared_container_ids() if cid in by_id]

    def _shared_updates(self, exclude: str = "") -> list[ContainerIntent]:
        """Updates for every container that follows the shared pool: the shared ones, and
        claim holders whose claims asked for ``sharedPoolAccess`` (their claims' CPUs plus
        the pool)."""
        state = self._state
        pool = state.shared_pool
        records = [r for r in self._shared_records() if r.container_id != exclude]
        out: list[ContainerIntent] = []
        if records and not pool:
            log.error("cannot confine %d shared containers: %s", len(records), EMPTY_SHARED_POOL)
        elif records:
            cpus = pool.format()
            out = [_update(r, cpus) for r in records]
        for record in state.containers:
            claims = record.claim_uids
            if claims and record.container_id != exclude and state.follows_pool(claims):
                whole = state.holder_cpus(claims)
                out.append(_update(record, whole.format(), state.mems(whole)))
        return out

    def shared_pool_updates(self) -> list[ContainerIntent]:
        """Updates moving every shared container to the current shared pool.

        Send them (UpdateContainers, from a task of its own) after an unprepare grew the
        pool; empty when there is no shared container or the pool is empty (logged).
        """
        return self._shared_updates()

    def sandbox_intents(self) -> list[ContainerIntent]:
        """Every pod sandbox on the shared pool (none while the pool is empty). Only
        dracpu writes these: NRI has no update for a sandbox."""
        pool = self._state.shared_pool
        sandboxes = self._state.sandboxes
        if not pool:
            if sandboxes:
                log.error("cannot confine %d pod sandboxes: %s", len(sandboxes), EMPTY_SHARED_POOL)
            return []
        cpus = pool.format()
        return [_sandbox_intent(s, cpus) for s in sandboxes.values()]

    def intents(self) -> list[ContainerIntent]:
        """What every known container and pod sandbox should run on, with its cgroups path.

        A shared container and a sandbox follow the shared pool (none is listed while the
        pool is empty); a claim holder runs on its claims' CPUs (a holder whose claims are
        all gone from the store follows the shared pool).
        """
        pool = self._state.shared_pool
        out: list[ContainerIntent] = self.sandbox_intents()
        for record in self._state.containers:
            intent = self._intent(record, pool)
            if intent is not None:
                out.append(intent)
        return out

    def intents_of(self, ids: Iterable[str]) -> dict[str, ContainerIntent]:
        """:meth:`intents` for these container or sandbox ids only (unknown ids and those
        with nothing to run on are left out): what a writer asks right before it writes,
        without building every container's intent each time."""
        state = self._state
        pool = state.shared_pool
        out: dict[str, ContainerIntent] = {}
        for cid in ids:
            record = state.containers.by_id(cid)
            if record is not None:
                intent = self._intent(record, pool)
            elif cid in state.sandboxes and pool:
                intent = _sandbox_intent(state.sandboxes[cid], pool.format())
            else:
                intent = None
            if intent is not None:
                out[cid] = intent
        return out

    def _intent(self, record: ContainerRecord, pool: CPUSet) -> ContainerIntent | None:
        state = self._state
        cpus = state.holder_cpus(record.claim_uids) if record.claim_uids else CPUSet()
        mems = state.mems(cpus)
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

    # -- events -----------------------------------------------------------------------------
    def create_container(
        self, pod: api_pb2.PodSandbox, container: api_pb2.Container
    ) -> CreateDecision:
        """§13.3: pin a claim holder to its claims' CPUs, anyone else to the shared pool.

        Raises `NRIPluginError` (the container is not created) for malformed DRA env, a
        claim that is not prepared or whose CPUs differ, a claim bound to another
        container, and a shared container while the shared pool is empty.
        """
        try:
            claims = parse_dra_env(container.env)
        except DRAEnvError as exc:
            raise NRIPluginError(str(exc)) from None
        # Each protobuf field read builds a new object: read each once.
        pod_uid, name = pod.uid, container.name
        cgroups_path = cgroups_path_of(container)
        if not claims:
            pool = self._state.shared_pool
            if not pool:
                raise NRIPluginError(EMPTY_SHARED_POOL)
            self._state.put_container(
                ContainerRecord(
                    pod_uid=pod_uid,
                    name=name,
                    container_id=container.id,
                    cgroups_path=cgroups_path,
                )
            )
            return CreateDecision(cpus=pool)

        claim_uids = tuple(claims)
        try:
            newly_bound = self._state.bind(pod_uid, name, claim_uids)
        except OwnerError as exc:
            raise NRIPluginError(str(exc)) from None
        try:
            self._state.store.validate(claims)
        except StoreError as exc:
            self._state.unbind(newly_bound)
            raise NRIPluginError(str(exc)) from None
        # The env's CPUs equal the claims' (validated); sharedPoolAccess adds the pool.
        guaranteed = self._state.holder_cpus(claim_uids)
        self._state.put_container(
            ContainerRecord(
                pod_uid=pod_uid,
                name=name,
                container_id=container.id,
                claim_uids=claim_uids,
                cgroups_path=cgroups_path,
            )
        )
        updates = self._shared_updates(exclude=container.id) if newly_bound else []
        return CreateDecision(
            cpus=guaranteed,
            mems=self._state.mems(guaranteed),
            updates=updates,
            claim_uids=claim_uids,
        )

    def stop_container(
        self, pod: api_pb2.PodSandbox, container: api_pb2.Container
    ) -> ContainerRecord | None:
        """§13.4: forget the container if it is the one we know; claims stay bound.

        Returns the forgotten record, or None for a stale or unknown event.
        """
        removed = self._state.drop_container(pod.uid, container.name, container.id)
        if removed is None:
            log.debug(
                "ignoring stale or unknown StopContainer event",
                extra={"container_id": container.id, "pod_uid": pod.uid},
            )
        return removed

    def remove_container(
        self, pod: api_pb2.PodSandbox, container: api_pb2.Container
    ) -> ContainerRecord | None:
        """§13.4: like Stop (usually stale by now); nothing is sent either way."""
        removed = self._state.drop_container(pod.uid, container.name, container.id)
        if removed is None:
            log.debug(
                "ignoring stale or unknown RemoveContainer event",
                extra={"container_id": container.id, "pod_uid": pod.uid},
            )
        elif removed.claim_uids:
            log.info(
                "removed container %s still held claims %s; its CPUs return to the shared "
                "pool only when the claims are unprepared",
                container.id,
                ",".join(removed.claim_uids),
            )
        return removed

    def run_pod_sandbox(self, pod: api_pb2.PodSandbox) -> ContainerIntent | None:
        """A pod sandbox started: remember it; returns what its cgroup should hold (None
        when the runtime gave no cgroups path, or the pool is empty)."""
        record = _sandbox_record(pod)
        if record is None:
            log.info(
                "pod sandbox %s reported without a cgroups path: it cannot be kept off "
                "claimed CPUs",
                pod.id,
                extra={"pod_uid": pod.uid},
            )
            return None
        self._state.put_sandbox(record)
        pool = self._state.shared_pool
        if not pool:
            log.error("cannot confine pod sandbox %s: %s", pod.id, EMPTY_SHARED_POOL)
            return None
        return _sandbox_intent(record, pool.format())

    def forget_pod_sandbox(self, pod: api_pb2.PodSandbox) -> None:
        """StopPodSandbox or RemovePodSandbox: the sandbox no longer needs its cpuset."""
        self._state.drop_sandbox(pod.id)

    def synchronize(
        self,
        pods: Sequence[api_pb2.PodSandbox],
        containers: Sequence[api_pb2.Container],
        cdi_claims: Mapping[str, CPUSet] | None = None,
    ) -> list[ContainerIntent]:
        """§13.5 with dracpu's deviation (module docstring): rebuild owners and container
        state from the runtime's list, add claims the store lacks, return the updates
        (claim holders first, then every shared container). ``cdi_claims`` are the claims
        of the driver's CDI specs on disk (needed when ``needs_cdi_specs``)."""
        pods_by_id = {pod.id: pod for pod in pods}
        sync = SyncPass(self._state.store, cdi_claims or {})
        for container in containers:
            pod = pods_by_id.get(container.pod_sandbox_id)
            if pod is not None:
                sync.add(pod, container)
        sandboxes = [r for r in map(_sandbox_record, pods) if r is not None]
        if len(sandboxes) < len(pods):
            log.info(
                "%d of %d pod sandboxes reported without a cgroups path: they cannot be kept "
                "off claimed CPUs",
                len(pods) - len(sandboxes),
                len(pods),
            )
        self._state.synchronized(sync.adopted, sync.owners, sync.records, sandboxes)
        holders = []
        for record, _ in sync.holders:
            cpus = self._state.holder_cpus(record.claim_uids)
            holders.append(
                ContainerIntent(
                    container_id=record.container_id,
                    cpus=cpus.format(),
                    mems=self._state.mems(cpus),
                    cgroups_path=record.cgroups_path,
                    pod_uid=record.pod_uid,
                    name=record.name,
                )
            )
        # Holders that follow the pool are in the holders' list already.
        holder_ids = {record.container_id for record, _ in sync.holders}
        return holders + [u for u in self._shared_updates() if u.container_id not in holder_ids]


def _sandbox_record(pod: api_pb2.PodSandbox) -> SandboxRecord | None:
    # containerd reports the sandbox's own cgroup in linux.cgroups_path (the pause
    # container's spec: internal/cri/server/podsandbox, getCgroupsPath), systemd
    # "slice:cri-containerd:<id>" or cgroupfs "<parent>/<id>".
    path = pod.linux.cgroups_path if pod.HasField("linux") else ""
    if not path:
        return None
    return SandboxRecord(pod_uid=pod.uid, sandbox_id=pod.id, cgroups_path=path)


def _sandbox_intent(record: SandboxRecord, cpus: str) -> ContainerIntent:
    return ContainerIntent(
        container_id=record.sandbox_id,
        cgroups_path=record.cgroups_path,
        cpus=cpus,
        pod_uid=record.pod_uid,
        sandbox=True,
    )


def _update(record: ContainerRecord, cpus: str, mems: str = "") -> ContainerIntent:
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
