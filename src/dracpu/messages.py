"""Typed messages that travel between the daemon's services on Trio memory channels.

The allocation state has one owner, ``dracpu.state.NodeState``. What it publishes, and what
the NRI session hands to the cgroupfs writer, is one of these frozen msgspec Structs:

- ``ClaimsChanged``: from ``NodeState`` (prepare, unprepare, Synchronize adoption) to the
  checkpoint writer (``dracpu.state.durable``);
- ``ClaimPrepared`` / ``ClaimUnprepared`` (``ClaimEvent``): from ``NodeState`` once a
  prepare or an unprepare committed, to each subscriber of ``NodeState.claim_events``;
- ``TopologyChanged``: from the hotplug watcher (``dracpu.daemon.hotplug``) to the task
  that applies it to the owner, the devices and the slices;
- ``CheckpointWritten``: from the checkpoint writer back to the caller waiting in
  ``NodeState.make_durable`` (the reply channel a ``ClaimsChanged`` carries);
- ``SharedPoolChanged``: from ``NodeState`` (a claim committed, released or adopted) to the
  pool pusher (``dracpu.nri.pusher``);
- ``CpusetUpdateFailed``: returned by the NRI session for each update the runtime did not
  apply; the pool pusher hands them to the cgroupfs writer inside the change's
  ``VerifyCpusets``;
- ``VerifyCpusets``: from the pool pusher (every update of a pool change, failed or not,
  and every pod sandbox) and the NRI session (a claim holder just created) to the one
  cgroupfs writer task, which reads each cgroup back and writes what differs and is still
  wanted.

``ContainerIntent`` is the payload of the last one and what every cpuset decision is made
of. Cpusets travel as Linux list strings so a message is plain data that can be logged,
encoded and compared without importing the allocator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeAlias

import msgspec

if TYPE_CHECKING:
    import trio

    from dracpu.topology.model import Topology

__all__ = [
    "CheckpointWritten",
    "ClaimDevice",
    "ClaimEvent",
    "ClaimPrepared",
    "ClaimUnprepared",
    "ClaimsChangeReason",
    "ClaimsChanged",
    "ContainerIntent",
    "CpusetUpdateFailed",
    "SharedPoolChanged",
    "TopologyChanged",
    "UpdateFailure",
    "VerifyCause",
    "VerifyCpusets",
]

# Why an UpdateContainers did not apply an update: the session was down (or not
# synchronized), the call timed out, the runtime listed the container as failed, answered
# with an error status, or sent a reply that does not decode.
UpdateFailure: TypeAlias = Literal[
    "NRI session down",
    "timed out",
    "listed as failed by the runtime",
    "UpdateContainers failed",
    "undecodable UpdateContainers reply",
]
# Why the claims to keep changed: a prepare or an unprepare on its way to commit, or claims
# adopted from running containers at Synchronize.
ClaimsChangeReason: TypeAlias = Literal["prepare", "unprepare", "synchronize"]
# Why cgroups are read back: a pushed pool change (with every pod sandbox), or what one
# CreateContainer reply, RunPodSandbox or Synchronize just produced.
VerifyCause: TypeAlias = Literal["pool", "create"]


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

    ``reason`` says why; ``detail`` is the runtime's error message (``UpdateContainers
    failed``) or the decoder's (``undecodable UpdateContainers reply``), else empty.
    ``why`` is both as one line, as the logs show it.
    """

    intent: ContainerIntent
    reason: UpdateFailure
    detail: str = ""

    @property
    def why(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


class CheckpointWritten(msgspec.Struct, frozen=True, kw_only=True):
    """The checkpoint holding every change up to ``generation`` is on disk, or ``error``.

    ``outcome_unknown`` (with ``error``): a stop left the write in its thread, which may
    still land it; the waiter must not undo its change as if it were not written."""

    generation: int
    error: str = ""
    outcome_unknown: bool = False


class ClaimsChanged(msgspec.Struct, frozen=True, kw_only=True):
    """The set of claims to keep across a restart changed (``generation`` counts changes).

    ``reply``, when set, is where the writer answers: the sender waits for the write
    before it makes the change visible (a prepare) or answers the kubelet (an unprepare).
    It is the one field that is not plain data (the message never leaves the process).
    """

    generation: int
    reason: ClaimsChangeReason
    reply: trio.MemorySendChannel[CheckpointWritten] | None = None


class ClaimDevice(msgspec.Struct, frozen=True, kw_only=True):
    """One prepared device of a claim as its allocation result names it: the pool, the
    device and, for a device shared through consumable capacity, the result's share ID
    (what ``status.devices`` entries are keyed on)."""

    pool: str
    device: str
    share_id: str = ""


class ClaimPrepared(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A prepare committed: the claim is prepared for everyone now (its spec and the
    checkpoint holding it are on disk). ``devices`` are its devices of this driver, in the
    order of its allocation results; ``shared_pool_access`` whether a request asked for the
    shared pool too. ``repeated``: the kubelet prepared a claim already prepared (nothing
    changed on the node); only subscribers that asked hear those."""

    uid: str
    namespace: str = ""
    name: str = ""
    cpus: str
    devices: tuple[ClaimDevice, ...] = ()
    shared_pool_access: bool = False
    repeated: bool = False


class ClaimUnprepared(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """An unprepare committed: the claim and its CPUs are released (the checkpoint without
    it is on disk). ``namespace`` and ``name`` are the kubelet's for the claim (a claim
    adopted at Synchronize has no others); ``cpus`` are those it held."""

    uid: str
    namespace: str = ""
    name: str = ""
    cpus: str


ClaimEvent: TypeAlias = ClaimPrepared | ClaimUnprepared


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
    the pool change for ``pool`` (0 otherwise). ``failed`` are the updates of ``intents``
    the runtime reported it could not apply (``pool`` only): the same pass writes them,
    once, counted as ``runtime-reported``.
    """

    intents: tuple[ContainerIntent, ...]
    cause: VerifyCause
    since: float = 0.0
    failed: tuple[CpusetUpdateFailed, ...] = ()


class TopologyChanged(msgspec.Struct, frozen=True, kw_only=True):
    """The online CPUs changed (CPU hotplug) and the topology was discovered again.

    ``topology`` is the new one (the other field that is not plain data: the message never
    leaves the process); ``went`` and ``came`` are the CPUs that went offline and came
    online, as Linux lists."""

    topology: Topology
    went: str = ""
    came: str = ""
