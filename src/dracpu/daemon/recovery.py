"""What the daemon trusts at start: the checkpoint, the CDI specs on disk, or nothing.

Upstream keeps no state and rebuilds claims from running containers at the first NRI
Synchronize, so a claim prepared before a driver restart whose container has not started
yet is forgotten (behavior.md §18). dracpu writes a checkpoint before every prepare and
unprepare reply and decides here, purely, what survives a restart:

1. A valid checkpoint from this boot (same ``boot_id``): its claims are prepared. Each one
   is kept when its CPUs are still allocatable and do not overlap a claim kept before it;
   a missing or different CDI spec is written again, and a spec of ours for a claim the
   checkpoint does not hold is removed (the kubelet never got a successful reply for it:
   the checkpoint is written before the reply, and unprepare removes the spec first).
2. A valid checkpoint from an earlier boot: the node rebooted, every container is gone and
   the kubelet prepares again what it still needs. Nothing is kept; leftover specs of ours
   are removed.
3. No checkpoint, or one that cannot be read: the CDI specs are the only record. They live
   in a tmpfs (``/var/run/cdi``) and so come from this boot; their claims are kept with the
   same checks as in case 1 (this is what upstream's Synchronize would trust).

A different configuration fingerprint (reserved CPUs, device mode) with the same boot is
case 1: the CPUs a container runs on do not change with the configuration, and claims
that no longer fit the allocatable set are dropped with a note.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import msgspec

from dracpu.allocation.checkpoint import Checkpoint
from dracpu.allocation.store import ClaimRecord
from dracpu.cpuset import CPUSet

__all__ = ["RecoveryPlan", "RecoverySource", "plan_recovery"]


class RecoverySource(StrEnum):
    CHECKPOINT = "checkpoint"
    REBOOT = "reboot"
    CDI = "cdi"


class RecoveryPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Claims to put back in the store, specs to (re)write and remove, and why."""

    source: RecoverySource
    claims: tuple[ClaimRecord, ...] = ()
    write_specs: tuple[str, ...] = ()
    remove_specs: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def _fitting(
    candidates: list[ClaimRecord], allocatable: CPUSet, notes: list[str]
) -> list[ClaimRecord]:
    kept: list[ClaimRecord] = []
    taken = CPUSet()
    for record in candidates:
        outside = record.cpus - allocatable
        if outside:
            notes.append(
                f'dropped claim "{record.uid}": CPUs {outside.format()} are not allocatable '
                f"on this node any more"
            )
            continue
        overlap = record.cpus & taken
        if overlap:
            notes.append(
                f'dropped claim "{record.uid}": CPUs {overlap.format()} are already held '
                f"by another recovered claim"
            )
            continue
        kept.append(record)
        taken |= record.cpus
    return kept


def plan_recovery(
    *,
    checkpoint: Checkpoint | None,
    checkpoint_problem: str | None,
    boot_id: str,
    config_fingerprint: str,
    cdi_claims: Mapping[str, CPUSet],
    allocatable: CPUSet,
) -> RecoveryPlan:
    """Decide the start-up state. Pure: the caller reads the files and applies the plan.

    ``checkpoint_problem`` is why a checkpoint file that exists could not be used;
    ``cdi_claims`` maps claim UID -> CPUs of the claim specs of ours found on disk.
    """
    notes: list[str] = []
    if checkpoint_problem:
        notes.append(f"checkpoint not used: {checkpoint_problem}")
    if checkpoint is not None and checkpoint.boot_id != boot_id:
        return RecoveryPlan(
            source=RecoverySource.REBOOT,
            remove_specs=tuple(sorted(cdi_claims)),
            notes=(
                *notes,
                f"node rebooted since the checkpoint (boot {checkpoint.boot_id} -> {boot_id}): "
                f"{len(checkpoint.claims)} claim(s) wait for the kubelet to prepare them again",
            ),
        )
    if checkpoint is not None:
        if checkpoint.config_fingerprint != config_fingerprint:
            notes.append(
                "configuration changed since the checkpoint: keeping the claims that still fit"
            )
        kept = _fitting(sorted(checkpoint.claims, key=lambda r: r.uid), allocatable, notes)
        kept_uids = {r.uid for r in kept}
        rewrite = [r.uid for r in kept if cdi_claims.get(r.uid) != r.cpus]
        orphans = sorted(uid for uid in cdi_claims if uid not in kept_uids)
        return RecoveryPlan(
            source=RecoverySource.CHECKPOINT,
            claims=tuple(kept),
            write_specs=tuple(rewrite),
            remove_specs=tuple(orphans),
            notes=tuple(notes),
        )
    from_specs = [ClaimRecord(uid=uid, cpus=cpus) for uid, cpus in sorted(cdi_claims.items())]
    kept = _fitting(from_specs, allocatable, notes)
    return RecoveryPlan(source=RecoverySource.CDI, claims=tuple(kept), notes=tuple(notes))
