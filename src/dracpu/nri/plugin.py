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

from dracpu.allocation.store import ContainerRecord, SandboxRecord
from dracpu.cdi.env import DRA_ENV_KEY_PREFIX, DRAEnvError, parse_dra_env
from dracpu.cpuset import CPUSet
from dracpu.messages import ContainerIntent
from dracpu.nri.sync import SyncPass, cgroups_path_of
from dracpu.proto.nri import api_pb2
from dracpu.state.owner import NodeState
from dracpu.state.steps import AdmissionError, CreateDecision
from dracpu.state.view import EMPTY_SHARED_POOL, sandbox_intent

__all__ = [
    "EMPTY_SHARED_POOL",
    "CreateDecision",
    "NRIPlugin",
    "NRIPluginError",
]

log = logging.getLogger(__name__)


class NRIPluginError(Exception):
    """A runtime event the plugin refuses; ``str(exc)`` is the error the runtime reports."""


class NRIPlugin:
    """Event -> decision, over the daemon's allocation stores (see the module docstring)."""

    def __init__(self, state: NodeState) -> None:
        self._state = state
        self._view = state.view

    # -- queries (the owner's view) ---------------------------------------------------------
    @property
    def shared_pool(self) -> CPUSet:
        return self._view.shared_pool

    def knows(self, container_id: str) -> bool:
        """Whether the container is one this plugin still tracks (not stopped or removed)."""
        return self._view.knows_container(container_id)

    def needs_cdi_specs(self, containers: Sequence[api_pb2.Container]) -> bool:
        """Whether a container carries a claim the store lacks: then Synchronize checks it
        against the CDI specs on disk, which the caller reads (off the Trio thread) first."""
        view = self._view
        for container in containers:
            for entry in container.env:
                if not entry.startswith(DRA_ENV_KEY_PREFIX):
                    continue
                uid = entry.partition("=")[0][len(DRA_ENV_KEY_PREFIX) :]
                if not view.has_claim(uid):
                    return True
        return False

    def shared_pool_updates(self) -> list[ContainerIntent]:
        """Updates moving every shared container to the current shared pool.

        Send them (UpdateContainers, from a task of its own) after an unprepare grew the
        pool; empty when there is no shared container or the pool is empty (logged).
        """
        return self._view.shared_updates()

    def sandbox_intents(self) -> list[ContainerIntent]:
        """Every pod sandbox on the shared pool (``NodeView.sandbox_intents``)."""
        return self._view.sandbox_intents()

    def intents(self) -> list[ContainerIntent]:
        """What every known container and pod sandbox should run on (``NodeView.intents``)."""
        return self._view.intents()

    def intents_of(self, ids: Iterable[str]) -> dict[str, ContainerIntent]:
        """``NodeView.intents_of``: these container or sandbox ids only."""
        return self._view.intents_of(ids)

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
        record = ContainerRecord(
            pod_uid=pod.uid,
            name=container.name,
            container_id=container.id,
            cgroups_path=cgroups_path_of(container),
        )
        try:
            return self._state.admit(record, claims)
        except AdmissionError as exc:
            raise NRIPluginError(str(exc)) from None

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
        pool = self._view.shared_pool
        if not pool:
            log.error("cannot confine pod sandbox %s: %s", pod.id, EMPTY_SHARED_POOL)
            return None
        return sandbox_intent(record, pool.format())

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
        sync = SyncPass(self._view, cdi_claims or {})
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
        view = self._view
        holders = []
        for record, _ in sync.holders:
            cpus = view.holder_cpus(record.claim_uids)
            holders.append(
                ContainerIntent(
                    container_id=record.container_id,
                    cpus=cpus.format(),
                    mems=view.mems(cpus),
                    cgroups_path=record.cgroups_path,
                    pod_uid=record.pod_uid,
                    name=record.name,
                )
            )
        # Holders that follow the pool are in the holders' list already.
        holder_ids = {record.container_id for record, _ in sync.holders}
        return holders + [u for u in view.shared_updates() if u.container_id not in holder_ids]


def _sandbox_record(pod: api_pb2.PodSandbox) -> SandboxRecord | None:
    # containerd reports the sandbox's own cgroup in linux.cgroups_path (the pause
    # container's spec: internal/cri/server/podsandbox, getCgroupsPath), systemd
    # "slice:cri-containerd:<id>" or cgroupfs "<parent>/<id>".
    path = pod.linux.cgroups_path if pod.HasField("linux") else ""
    if not path:
        return None
    return SandboxRecord(pod_uid=pod.uid, sandbox_id=pod.id, cgroups_path=path)
