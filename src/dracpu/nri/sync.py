"""One Synchronize pass (behavior.md §13.5 with dracpu's deviation; see `nri.plugin`).

`SyncPass` walks the runtime's containers once, pure: for each it decides which of its
claims are valid (prepared with these CPUs, or adopted from a driver-owned CDI spec whose
CPUs are still free), binds them to it, or confines it to the shared pool when a claim is
forged, overlaps or belongs to another container. The caller hands the result to the state
owner (`NodeState.synchronized`) in one step.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from dracpu.allocation.store import ClaimTracker, ContainerRecord, OwnerError
from dracpu.cdi.env import DRAEnvError, parse_dra_env
from dracpu.cpuset import CPUSet
from dracpu.gofmt import go_quote
from dracpu.proto.nri import api_pb2

__all__ = ["PreparedClaims", "SyncPass", "cgroups_path_of"]

log = logging.getLogger("dracpu.nri.plugin")


def cgroups_path_of(container: api_pb2.Container) -> str:
    return container.linux.cgroups_path if container.HasField("linux") else ""


def _union(sets: Mapping[str, CPUSet]) -> CPUSet:
    out = CPUSet()
    for cpus in sets.values():
        out |= cpus
    return out


class PreparedClaims(Protocol):
    """What a pass reads of the prepared claims (``state.NodeView`` is one)."""

    def cpus_of(self, claim_uid: str) -> CPUSet | None: ...

    @property
    def free(self) -> CPUSet: ...


class SyncPass:
    """The runtime's containers -> claim owners, container records, adopted claims."""

    def __init__(self, store: PreparedClaims, cdi_claims: Mapping[str, CPUSet]) -> None:
        self._store = store
        self._cdi_claims = cdi_claims
        self.owners = ClaimTracker()
        self.records: list[ContainerRecord] = []
        self.adopted: dict[str, CPUSet] = {}
        self.holders: list[tuple[ContainerRecord, CPUSet]] = []
        self._free = store.free

    def add(self, pod: api_pb2.PodSandbox, container: api_pb2.Container) -> None:
        """Take one running container into the pass."""
        try:
            env_claims = parse_dra_env(container.env)
        except DRAEnvError as exc:
            log.warning(
                "ignoring container with malformed DRA env during synchronize: %s",
                exc,
                extra={"container_id": container.id},
            )
            return
        checked = self._check_claims(container.id, env_claims)
        if checked is not None:
            valid, adopting = checked
            if valid and self._bind(pod, container, valid):
                self.adopted.update(adopting)
                self._free -= _union(adopting)
                record = self._record(pod, container, tuple(valid))
                self.records.append(record)
                self.holders.append((record, _union(valid)))
                return
        self.records.append(self._record(pod, container, ()))

    def _record(
        self, pod: api_pb2.PodSandbox, container: api_pb2.Container, claim_uids: tuple[str, ...]
    ) -> ContainerRecord:
        return ContainerRecord(
            pod_uid=pod.uid,
            name=container.name,
            container_id=container.id,
            claim_uids=claim_uids,
            cgroups_path=cgroups_path_of(container),
        )

    def _bind(
        self, pod: api_pb2.PodSandbox, container: api_pb2.Container, valid: Mapping[str, CPUSet]
    ) -> bool:
        try:
            self.owners.set_owner(pod.uid, container.name, tuple(valid))
        except OwnerError as exc:
            log.warning(
                "confining container %s to the shared pool during synchronize: %s",
                container.id,
                exc,
            )
            return False
        return True

    def _check_claims(
        self, container_id: str, env_claims: Mapping[str, CPUSet]
    ) -> tuple[dict[str, CPUSet], dict[str, CPUSet]] | None:
        """The container's valid claims and those of them to adopt from CDI specs; None
        when one claim is forged or overlaps (the container is confined)."""
        valid: dict[str, CPUSet] = {}
        adopting: dict[str, CPUSet] = {}
        for uid, cpus in env_claims.items():
            known = self._store.cpus_of(uid)
            if known is None:
                known = self.adopted.get(uid)
            if known is None:
                known = self._cdi_claims.get(uid)
                if known is None:
                    log.warning(
                        "ignoring claim %s of container %s during synchronize: no "
                        "driver-owned CDI spec for it",
                        go_quote(uid),
                        container_id,
                    )
                    continue
                if known == cpus:
                    if not cpus <= self._free - _union(adopting):
                        log.warning(
                            "confining container %s to the shared pool: claim %s from its "
                            "CDI spec overlaps CPUs already held (%s)",
                            container_id,
                            go_quote(uid),
                            cpus.format(),
                        )
                        return None
                    adopting[uid] = cpus
            if known != cpus:
                log.warning(
                    "confining container %s to the shared pool: validation failed for "
                    "claim %s during synchronize: cpuset mismatch (expected %s, got %s "
                    "from runtime)",
                    container_id,
                    go_quote(uid),
                    go_quote(known.format()),
                    go_quote(cpus.format()),
                )
                return None
            valid[uid] = cpus
        return valid, adopting
