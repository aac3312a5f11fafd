"""The shapes of the owner's transactions: what the caller injects (``ClaimSteps``), what
comes back (``PrepareOutcome``, ``UnprepareOutcome``, ``CreateDecision``) and the errors
(``StateFileError``, ``AdmissionError``). No I/O here."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec
import trio

from dracpu.allocation.prepare import ClaimPlan
from dracpu.allocation.store import ClaimRecord, StateError
from dracpu.cpuset import CPUSet
from dracpu.messages import ContainerIntent

__all__ = [
    "WRITER_NOT_RUNNING",
    "AdmissionError",
    "CheckpointOutcomeUnknown",
    "ClaimSteps",
    "CreateDecision",
    "FailedAt",
    "PrepareOutcome",
    "StateFileError",
    "UnprepareOutcome",
]


class StateFileError(Exception):
    """The checkpoint could not be written; the message names the file and the OS error."""


class CheckpointOutcomeUnknown(StateFileError):
    """A stop left the checkpoint write in its thread after waiting the stop bound: it may
    still land, with the change in it, or not. The daemon is exiting, so the caller undoes
    nothing (an undo could contradict what lands); the next start rebuilds the claims from
    the checkpoint and the CDI specs, and the kubelet retries the call."""


# What a prepare or an unprepare hears when no checkpoint writer runs, a stop included
# (the words dracpu has always used: logs and alerts may match them).
WRITER_NOT_RUNNING = "the checkpoint writer is not running"


class AdmissionError(StateError):
    """A container the owner refuses to admit; ``str(exc)`` is what the runtime reports."""


class ClaimSteps(Protocol):
    """What a prepare or an unprepare needs from the kubelet service around the owner.

    Ordering: ``claim_turn`` (one call per claim from planning to the checkpoint),
    ``lock`` (one call at a time for planning and the spec) and ``commit_scope`` (a
    cancel scope the owner shields once its first change is made). File I/O: the claim's
    CDI spec (``CDIError`` on failure) and the device metadata the kubelet plugin keeps.
    """

    def claim_turn(self, claim_uid: str) -> AbstractAsyncContextManager[None]: ...

    def lock(self) -> AbstractAsyncContextManager[Any]: ...

    def commit_scope(self) -> trio.CancelScope: ...

    async def write_spec(self, claim_uid: str, cpus: CPUSet) -> None: ...

    async def remove_spec(self, claim_uid: str) -> None: ...

    async def remove_metadata(self, namespace: str, name: str, claim_uid: str) -> None: ...


# Where a transaction failed: "plan" (the claim cannot be planned or its UID is unusable),
# "reserve" (the store refused the CPUs), "spec" (the CDI spec file), "record" (the
# checkpoint). Empty on success.
FailedAt = Literal["", "plan", "reserve", "spec", "record"]


class PrepareOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """One claim's prepare: the plan (None when the claim failed before one, or is empty
    for this driver), whether it reserved CPUs anew, or ``error`` and where it failed."""

    plan: ClaimPlan | None = None
    new: bool = False
    error: str = ""
    failed_at: FailedAt = ""


class UnprepareOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """One claim's unprepare: the released claim (None when it was not prepared), or
    ``error`` and where it failed."""

    released: ClaimRecord | None = None
    error: str = ""
    failed_at: FailedAt = ""


@dataclass(frozen=True, slots=True)
class CreateDecision:
    """The reply to CreateContainer: the new container's cpuset and other containers' updates."""

    cpus: CPUSet
    mems: str = ""
    updates: list[ContainerIntent] = field(default_factory=list)
    claim_uids: tuple[str, ...] = ()
