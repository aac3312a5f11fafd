"""Typed messages that travel between the daemon's services on Trio memory channels.

The allocation state has one owner, ``dracpu.state.NodeState``. What it publishes, and what
the NRI session hands to the cgroupfs writer, is one of these frozen msgspec Structs:

- ``ClaimsChanged``: from ``NodeState`` (prepare, unprepare, Synchronize adoption) to the
  checkpoint writer (``dracpu.state.durable``);
- ``CheckpointWritten``: from the checkpoint writer back to the caller waiting in
  ``NodeState.make_durable`` (the reply channel a ``ClaimsChanged`` carries);
- ``SharedPoolChanged``: from ``NodeState`` (a claim committed, released or adopted) to the
  pool pusher (``dracpu.nri.pusher``);
- ``CpusetUpdateFailed``: from the NRI session, for each update the runtime did not apply,
  to the cgroupfs fallback writer;
- ``VerifyCpusets``: from the pool pusher (updates the runtime called a success) and the
  NRI session (a claim holder just created) to the cgroupfs verifier, which reads each
  cgroup back and writes what differs.

``ContainerIntent`` is the payload of the last one and what every cpuset decision is made
of. Cpusets travel as Linux list strings so a message is plain data that can be logged,
encoded and compared without importing the allocator.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "CheckpointWritten",
    "ClaimsChanged",
    "ContainerIntent",
    "CpusetUpdateFailed",
    "SharedPoolChanged",
    "VerifyCpusets",
]


class ContainerIntent(msgspec.Struct, frozen=True, kw_only=True):
    """The cpuset dracpu intends a container to run on: an NRI update, a reply's adjustment
    of another container, or what the drift watcher enforces.

    ``cgroups_path`` is the runtime's ``linux.cgroups_path`` as NRI reports it (systemd
    ``slice:prefix:name`` or a cgroupfs path); ``mems`` is empty unless memory alignment
    is on (empty = leave ``cpuset.mems`` alone). ``ignore_failure`` is set on best-effort
    updates of other containers, which may be exiting (protocols.md 6.6). ``sandbox`` marks
    a pod sandbox (``container_id`` is the sandbox id): NRI cannot update one, so only
    dracpu's own cgroupfs writes keep it on the shared pool.
    """

    container_id: str
    cgroups_path: str
    cpus: str
    mems: str = ""
    pod_uid: str = ""
    name: str = ""
    ignore_failure: bool = False
    sandbox: bool = False


class CpusetUpdateFailed(msgspec.Struct, frozen=True, kw_only=True):
    """The runtime could not apply an update: the cgroupfs writer applies it instead.

    ``reason`` says why (the UpdateContainers error, ``listed as failed by the runtime``,
    ``timed out``, ``NRI session down``).
    """

    intent: ContainerIntent
    reason: str


class CheckpointWritten(msgspec.Struct, frozen=True, kw_only=True):
    """The checkpoint holding every change up to ``generation`` is on disk, or ``error``."""

    generation: int
    error: str = ""


class ClaimsChanged(msgspec.Struct, frozen=True, kw_only=True):
    """The set of claims to keep across a restart changed (``generation`` counts changes).

    ``reason`` is ``prepare``, ``unprepare`` or ``synchronize``. ``reply``, when set, is a
    ``trio.MemorySendChannel[CheckpointWritten]``: the sender waits for the write before it
    makes the change visible (a prepare) or answers the kubelet (an unprepare).
    """

    generation: int
    reason: str
    reply: Any = None


class SharedPoolChanged(msgspec.Struct, frozen=True, kw_only=True):
    """The shared pool is now ``cpus``: shared containers should follow it. ``at`` is the
    Trio clock when it changed (the start of ``dracpu_pool_convergence_seconds``)."""

    cpus: str
    at: float = 0.0


class VerifyCpusets(msgspec.Struct, frozen=True, kw_only=True):
    """Read these containers' cgroups back and write those that differ.

    ``cause`` is ``pool`` (a pushed pool update, with every pod sandbox) or ``create`` (a
    claim holder's adjustment, or a sandbox that just started or was synchronized; its
    cgroup may not exist yet when the message is sent). ``since`` is the Trio clock of
    the pool change for ``pool`` (0 otherwise).
    """

    intents: tuple[ContainerIntent, ...]
    cause: str
    since: float = 0.0
