"""The kubelet's transactions over the owner: prepare and unprepare one claim.

``NodeState.prepare`` and ``NodeState.unprepare`` run these. The kubelet service injects
``ClaimSteps``: its call ordering (one call per claim, one lock for planning and the spec,
a shield for the commit) and its file I/O (the CDI spec, device metadata). The owner does
the rest: plan (pure), reserve as pending, spec, checkpoint, commit or undo.

Reserving before any file I/O, with the store re-checking overlap itself, is what keeps a
CPU from ever being handed out twice (§8.7); committing only after both files are on disk
is what keeps NRI from pinning a container to CPUs a failed prepare takes back.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from dracpu.allocation.prepare import ClaimAllocation, ClaimPlan, PrepareError, plan_claim
from dracpu.cdi import CDIError, check_claim_uid
from dracpu.state.steps import (
    CheckpointOutcomeUnknown,
    ClaimSteps,
    PrepareOutcome,
    StateFileError,
    UnprepareOutcome,
)

if TYPE_CHECKING:
    from dracpu.state.owner import NodeState

__all__ = ["prepare", "unprepare"]

# The kubelet service's logger: these lines were its own before the owner ran the
# transactions, and log searches name it.
kubelet_log = logging.getLogger("dracpu.kubelet.dra")


async def prepare(state: NodeState, claim: ClaimAllocation, steps: ClaimSteps) -> PrepareOutcome:
    """Plan, reserve as pending and write the spec (under ``steps.lock``), wait for the
    checkpoint (calls waiting together share one write), commit. Every claim-level
    failure leaves the state as §8.6 says: a new claim is dropped again (its spec
    removed), an already prepared one keeps its CPUs."""
    # Shielded from the first change of state (the reservation) to the commit or undo;
    # a call cancelled while it waits for its turn or the lock changes nothing.
    async with steps.claim_turn(claim.uid):
        with steps.commit_scope() as commit:
            async with steps.lock():
                staged = await _stage_prepare(state, claim, steps, commit)
            if isinstance(staged, PrepareOutcome):
                return staged
            plan, new = staged
            error = await _commit_prepare(state, claim, plan, new, steps)
    if error:
        return PrepareOutcome(plan=plan, error=error, failed_at="record")
    return PrepareOutcome(plan=plan, new=new)


async def _stage_prepare(
    state: NodeState, claim: ClaimAllocation, steps: ClaimSteps, commit: trio.CancelScope
) -> PrepareOutcome | tuple[ClaimPlan, bool]:
    try:
        check_claim_uid(claim.uid)
        if state.topology is None or state.inventory is None:
            raise PrepareError("the driver has no CPU topology to plan with yet")
        plan = plan_claim(
            claim,
            inventory=state.inventory,
            topology=state.topology,
            store=state._store,
            online=state.online,
        )
    except (PrepareError, CDIError) as exc:
        return PrepareOutcome(error=str(exc), failed_at="plan")
    if plan.is_empty:
        return PrepareOutcome(plan=plan)
    commit.shield = True
    try:
        new = state._begin_prepare(plan)
    except PrepareError as exc:
        return PrepareOutcome(plan=plan, error=str(exc), failed_at="reserve")
    try:
        await steps.write_spec(claim.uid, plan.cpus)
    except CDIError as exc:
        state._abort_prepare(plan)
        return PrepareOutcome(plan=plan, error=str(exc), failed_at="spec")
    return plan, new


async def _commit_prepare(
    state: NodeState, claim: ClaimAllocation, plan: ClaimPlan, new: bool, steps: ClaimSteps
) -> str:
    """Wait for the checkpoint, then commit; on failure undo and return the error. A
    new claim stays pending (invisible) until both files are on disk, so nothing can
    have used its CPUs when it is dropped."""
    if not new:
        state._repeat_prepare(claim)
        return ""
    try:
        await state.make_durable("prepare")
    except CheckpointOutcomeUnknown as exc:
        # A stop left the write running: it may land with this claim in it, so neither
        # drop the claim nor remove its spec (recovery rebuilds from both files).
        return f"failed to record claim {claim.namespace}/{claim.name}: {exc}"
    except StateFileError as exc:
        state._abort_prepare(plan)
        try:
            await steps.remove_spec(claim.uid)
        except CDIError as rm_exc:
            kubelet_log.warning("cannot remove the CDI spec of a rolled back claim: %s", rm_exc)
        return f"failed to record claim {claim.namespace}/{claim.name}: {exc}"
    state._finish_prepare(plan, claim)
    return ""


async def unprepare(
    state: NodeState, namespace: str, name: str, claim_uid: str, steps: ClaimSteps
) -> UnprepareOutcome:
    """Remove the spec and leave the claim out of the next checkpoint (under
    ``steps.lock``), wait for that checkpoint (shared with other calls waiting), then
    release the claim; a failed write puts everything back (the claim stays prepared,
    its spec is written again) and the kubelet retries. Unknown claims succeed."""
    async with steps.claim_turn(claim_uid):
        with steps.commit_scope() as commit:
            # Shielded from the spec's removal on; a call cancelled while it waits for
            # the lock changes nothing.
            async with steps.lock():
                commit.shield = True
                record = state._store.get(claim_uid)
                try:
                    check_claim_uid(claim_uid)
                except CDIError as exc:
                    # No spec can exist under such a name; a claim we never had is done.
                    if record is None:
                        return UnprepareOutcome()
                    return UnprepareOutcome(error=str(exc), failed_at="plan")
                try:
                    await steps.remove_spec(claim_uid)
                except CDIError as exc:
                    return UnprepareOutcome(error=str(exc), failed_at="spec")
                if record is not None:
                    state._begin_unprepare(claim_uid)
            if record is None:
                # A claim we do not hold: its metadata (if any) goes after the lock, like
                # a known claim's, so slow metadata I/O never holds every other call;
                # the claim's turn still keeps its own next call behind this one.
                await steps.remove_metadata(namespace, name, claim_uid)
                return UnprepareOutcome()
            try:
                await state.make_durable("unprepare")
            except CheckpointOutcomeUnknown as exc:
                # A stop left the write running: the claim may be gone from the checkpoint
                # or not. Putting it back could contradict what lands; recovery decides.
                return UnprepareOutcome(
                    error=f"failed to record claim {namespace}/{name}: {exc}",
                    failed_at="record",
                )
            except StateFileError as exc:
                # Keep memory, disk and checkpoint in agreement.
                state._abort_unprepare(claim_uid)
                try:
                    await steps.write_spec(claim_uid, record.cpus)
                except CDIError as write_exc:
                    kubelet_log.warning(
                        "cannot restore the CDI spec of claim %s: %s", claim_uid, write_exc
                    )
                return UnprepareOutcome(
                    error=f"failed to record claim {namespace}/{name}: {exc}",
                    failed_at="record",
                )
            state._finish_unprepare(claim_uid, namespace, name)
            await steps.remove_metadata(namespace, name, claim_uid)
    return UnprepareOutcome(released=record)
