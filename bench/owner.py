"""The state owner's transactions against the bare bookkeeping they carry out, in one
process, CPU time only.

- ``prepare_unprepare_pair_cpu_us``: one claim prepared and unprepared through
  ``NodeState.prepare`` / ``unprepare`` (planning, reservation, the injected spec steps,
  commit, release), with steps that do no I/O and no checkpoint writer (memory-only
  state), so what is timed is the owner's own work; median of the rounds' mean per pair.
- ``store_pair_cpu_us``: the peer, the same planning, injected steps and ordering over a
  bare ``AllocationStore`` of the same CPUs, with the store's own calls in the order the
  transaction makes them (reserve as pending, commit, begin release, release): everything
  but the owner's part (outcomes, gauges, messages, the writer check). Until the steps
  became private to ``dracpu.state`` the peer was those steps (``steps_pair_cpu_us``).
- ``transaction_vs_store``: their ratio (what the owner adds; 1.0 is nothing).
- ``admit_shared_cpu_us`` / ``admit_holder_cpu_us``: one CreateContainer decision
  (``NodeState.admit``) with 1,000 shared containers known, of a shared container and of
  a holder whose claim is bound to it already (a restarted container: no updates of
  others); median of the rounds' mean.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from dracpu.allocation.prepare import AllocationResult, ClaimAllocation, plan_claim
from dracpu.allocation.store import AllocationStore, ContainerRecord
from dracpu.cdi import check_claim_uid
from dracpu.cpuset import CPUSet
from dracpu.devices import DeviceSettings, build_inventory
from dracpu.state import NodeState
from dracpu.topology import discover_from_root

ROOT = Path(__file__).resolve().parent.parent / "tests" / "fake_sysfs" / "epyc-nps4"
CLAIMS = 40
ROUNDS = 60


class NoIOSteps:
    """ClaimSteps that order nothing and write nothing."""

    def __init__(self) -> None:
        self._lock = trio.Lock()

    @asynccontextmanager
    async def claim_turn(self, claim_uid: str) -> AsyncIterator[None]:
        yield

    def lock(self) -> trio.Lock:
        return self._lock

    def commit_scope(self) -> trio.CancelScope:
        return trio.CancelScope()

    async def write_spec(self, claim_uid: str, cpus: CPUSet) -> None:
        return None

    async def remove_spec(self, claim_uid: str) -> None:
        return None

    async def remove_metadata(self, namespace: str, name: str, claim_uid: str) -> None:
        return None


def make_state() -> NodeState:
    topo = discover_from_root(ROOT)
    inventory = build_inventory(topo, DeviceSettings(mode="grouped", group_by="numanode"))
    state = NodeState(AllocationStore(topo.all_cpus, CPUSet()))
    state.use_topology(topo, inventory, topo.online)
    return state


def claims() -> list[ClaimAllocation]:
    """One CPU each, spread over the four NUMA nodes' devices."""
    return [
        ClaimAllocation(
            uid=f"u{i}",
            namespace="default",
            name=f"c{i}",
            results=(
                AllocationResult(
                    request="cpus",
                    driver="dra.cpu",
                    pool="node-a",
                    device=f"cpudevnuma00{i % 4}",
                    consumed_capacity={"dra.cpu/cpu": "1"},
                ),
            ),
        )
        for i in range(CLAIMS)
    ]


async def transactions(state: NodeState, batch: list[ClaimAllocation]) -> None:
    steps = NoIOSteps()
    for claim in batch:
        outcome = await state.prepare(claim, steps)
        assert not outcome.error, outcome.error
    for claim in batch:
        outcome_u = await state.unprepare(claim.namespace, claim.name, claim.uid, steps)
        assert not outcome_u.error, outcome_u.error


async def bare_store(state: NodeState, batch: list[ClaimAllocation]) -> None:
    # The state plans the same way; the store is its own, so the owner's is never touched.
    store = AllocationStore(state.view.allocatable, CPUSet())
    steps = NoIOSteps()
    assert state.topology is not None and state.inventory is not None
    for claim in batch:
        async with steps.claim_turn(claim.uid):
            with steps.commit_scope():
                async with steps.lock():
                    check_claim_uid(claim.uid)
                    plan = plan_claim(
                        claim,
                        inventory=state.inventory,
                        topology=state.topology,
                        store=store,
                        online=state.online,
                    )
                    store.reserve(plan.record, pending=True)
                    await steps.write_spec(claim.uid, plan.cpus)
                await state.make_durable("prepare")  # memory-only: returns at once
                store.commit(claim.uid)
    for claim in batch:
        async with steps.claim_turn(claim.uid):
            with steps.commit_scope():
                async with steps.lock():
                    store.get(claim.uid)
                    check_claim_uid(claim.uid)
                    await steps.remove_spec(claim.uid)
                    store.begin_release(claim.uid)
                await state.make_durable("unprepare")
                store.release(claim.uid)
                await steps.remove_metadata(claim.namespace, claim.name, claim.uid)


def per_pair_us(run: Callable[[NodeState, list[ClaimAllocation]], object]) -> float:
    state, batch = make_state(), claims()
    means = []

    async def main() -> None:
        for _ in range(ROUNDS):
            started = time.process_time()
            await run(state, batch)  # type: ignore[misc]
            means.append((time.process_time() - started) / CLAIMS)

    trio.run(main)
    return statistics.median(means) * 1e6


def admit_us(holder: bool) -> float:
    state = make_state()
    for i in range(1000):
        state.put_container(
            ContainerRecord(pod_uid=f"p{i}", name="c", container_id=f"c{i}", cgroups_path="/x")
        )
    claim = claims()[0]

    async def prepare() -> CPUSet:
        await state.prepare(claim, NoIOSteps())
        cpus = state.view.cpus_of(claim.uid)
        assert cpus is not None
        return cpus

    cpus = trio.run(prepare)
    means = []
    for _ in range(ROUNDS):
        started = time.process_time()
        for n in range(200):
            record = ContainerRecord(pod_uid="new", name="c", container_id=f"n{n}")
            state.admit(record, {claim.uid: cpus} if holder else {})
        means.append((time.process_time() - started) / 200)
    return statistics.median(means) * 1e6


def main() -> None:
    # Alternated so both see the same machine load.
    tx, bare = [], []
    for _ in range(3):
        tx.append(per_pair_us(transactions))
        bare.append(per_pair_us(bare_store))
    t, b = statistics.median(tx), statistics.median(bare)
    print(f"prepare_unprepare_pair_cpu_us: {t:.1f} us")
    print(f"store_pair_cpu_us: {b:.1f} us")
    print(f"transaction_vs_store: {t / b:.2f}")
    print(f"admit_shared_cpu_us: {admit_us(holder=False):.1f} us")
    print(f"admit_holder_cpu_us: {admit_us(holder=True):.1f} us")


if __name__ == "__main__":
    main()
