"""Driving the state owner from tests through its public transactions only.

The owner's stores and the steps of its transactions are private to ``dracpu.state``
(tests/state/test_owner_boundary.py); a test that needs a prepared claim prepares it
(``prepare``), one that needs it gone unprepares it (``unprepare``), and one that needs
claims in place before anything runs restores them as start-up does (``NodeState.restore``).
``MemorySteps`` is the ``ClaimSteps`` the kubelet service would inject, over memory: no
file is written, nothing is ordered beyond one lock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from builders import DeviceNames, claim, result

from dracpu.allocation.prepare import ClaimAllocation
from dracpu.cdi import CDIError
from dracpu.cpuset import CPUSet
from dracpu.state import NodeState, PrepareOutcome, UnprepareOutcome
from dracpu.topology.model import Topology

__all__ = ["MemorySteps", "exact_devices", "prepare", "prepare_cpus", "unprepare"]


class MemorySteps:
    """``ClaimSteps`` over memory; ``fail`` names file steps that raise ``CDIError``."""

    def __init__(self, *fail: str) -> None:
        self.fail = set(fail)
        self.calls: list[tuple[str, str]] = []
        self._lock = trio.Lock()

    @asynccontextmanager
    async def claim_turn(self, claim_uid: str) -> AsyncIterator[None]:
        yield

    def lock(self) -> trio.Lock:
        return self._lock

    def commit_scope(self) -> trio.CancelScope:
        return trio.CancelScope()

    async def _step(self, name: str, uid: str) -> None:
        self.calls.append((name, uid))
        if name in self.fail:
            raise CDIError(f"{name} failed for {uid}")

    async def write_spec(self, claim_uid: str, cpus: CPUSet) -> None:
        await self._step("write_spec", claim_uid)

    async def remove_spec(self, claim_uid: str) -> None:
        await self._step("remove_spec", claim_uid)

    async def remove_metadata(self, namespace: str, name: str, claim_uid: str) -> None:
        await self._step("remove_metadata", claim_uid)


async def prepare(state: NodeState, claim: ClaimAllocation) -> PrepareOutcome:
    """Prepare ``claim`` (the state must have a topology); fails the test on an error."""
    outcome = await state.prepare(claim, MemorySteps())
    assert outcome.error == "", outcome.error
    return outcome


async def unprepare(
    state: NodeState, claim_uid: str, namespace: str = "default", name: str = ""
) -> UnprepareOutcome:
    """Unprepare a claim; fails the test on an error."""
    outcome = await state.unprepare(
        namespace, name or f"claim-{claim_uid}", claim_uid, MemorySteps()
    )
    assert outcome.error == "", outcome.error
    return outcome


def exact_devices(state: NodeState, topo: Topology) -> None:
    """Let ``state`` plan with ``topo`` and one device per CPU named after it
    (``cpudev<cpu>``, individual mode), so ``prepare_cpus`` takes exactly the CPUs asked."""
    names = DeviceNames(mode="individual", cpu_of_device={f"cpudev{c:03d}": c for c in topo.cpus})
    state.use_topology(topo, names, topo.online)


async def prepare_cpus(
    state: NodeState, uid: str, cpus: str, *, namespace: str = "default", name: str = ""
) -> CPUSet:
    """Prepare claim ``uid`` holding exactly ``cpus`` (a state set up by ``exact_devices``),
    through the whole transaction: the claim is committed, ``SharedPoolChanged`` sent."""
    wanted = CPUSet.parse(cpus)
    results = [result(f"cpudev{c:03d}") for c in wanted]
    outcome = await prepare(state, claim(uid, *results, namespace=namespace, name=name or None))
    assert outcome.plan is not None and outcome.plan.cpus == wanted
    return wanted
