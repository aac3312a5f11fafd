"""The NRI plugin's event handling under hypothesis: random pods, containers and env.

Env vars are the pod author's to write, so every ``DRA_CPUSET_*`` entry here may be forged,
malformed or aimed at another pod's claim. Whatever arrives, an event either gives a decision
or raises ``NRIPluginError``, and no decision ever grants CPUs the prepared claims do not
hold: a claim holder runs on exactly its claims' prepared CPUs, anyone else on the shared
pool, which never overlaps a claim.
"""

from __future__ import annotations

from fuzzing import bounded, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from dracpu.allocation.store import AllocationStore, ClaimRecord
from dracpu.cdi.env import parse_dra_env
from dracpu.cpuset import CPUSet
from dracpu.messages import ContainerIntent
from dracpu.nri.plugin import CreateDecision, NRIPlugin, NRIPluginError
from dracpu.proto.nri import api_pb2
from dracpu.state import NodeState

AVAILABLE = CPUSet.parse("0-15")
PREPARED = {"uid-a": CPUSet.parse("0-1"), "uid-b": CPUSet.parse("2-5")}
# Specs on disk: one claim the store lost (may be re-adopted), one overlapping uid-a.
ON_DISK = {**PREPARED, "uid-c": CPUSet.parse("8-9"), "uid-d": CPUSet.parse("1-2")}
UIDS = [*ON_DISK, "uid-unknown", "", "../x"]

cpus_text = st.one_of(
    st.sampled_from([c.format() for c in ON_DISK.values()]),
    st.sampled_from(["", "0-15", "0", "99999999", "1-0", "a", "0-1\n", " 1", "0,,1"]),
    st.text(alphabet="0123456789-,", max_size=8),
)
env_entries = st.one_of(
    st.builds(lambda uid, cpus: f"DRA_CPUSET_{uid}={cpus}", st.sampled_from(UIDS), cpus_text),
    st.builds(
        lambda uid: f"DRA_CPUSET_{uid}={ON_DISK[uid].format()}", st.sampled_from(list(ON_DISK))
    ),
    st.sampled_from(
        ["DRA_CPUSET", "DRA_CPUSETX=1", "DRA_CPUSET_=0", "PATH=/bin", "dra_cpuset_a=0"]
    ),
    st.text(max_size=20),
)
pod_uids = st.sampled_from(["p1", "p2", "p3"])
containers = st.builds(
    lambda pod, name, generation, env, path: (
        pod,
        api_pb2.Container(
            # Ids come from the runtime (trusted): unique per pod, name and restart.
            id=f"{pod}.{name}.{generation}",
            pod_sandbox_id=f"sb-{pod}",
            name=name,
            env=env,
            linux=api_pb2.LinuxContainer(cgroups_path=path),
        ),
    ),
    pod_uids,
    st.sampled_from(["app", "side", ""]),
    st.integers(0, 1),
    st.lists(env_entries, max_size=4),
    st.sampled_from(["/kubepods/x", "../../etc", ""]),
)
events = st.lists(
    st.tuples(st.sampled_from(["create", "create", "stop", "remove", "sync"]), containers),
    max_size=12,
)


def pod(uid: str) -> api_pb2.PodSandbox:
    return api_pb2.PodSandbox(id=f"sb-{uid}", uid=uid, name=uid, namespace="default")


class Node:
    def __init__(self) -> None:
        self.runtime: dict[str, api_pb2.Container] = {}  # id -> container, as created
        self.store = AllocationStore(AVAILABLE, CPUSet())
        for uid, cpus in PREPARED.items():
            self.store.reserve(ClaimRecord(uid=uid, cpus=cpus))
        self.plugin = NRIPlugin(NodeState(self.store))

    def claims_cpus(self, uids: tuple[str, ...]) -> CPUSet:
        out = CPUSet()
        for uid in uids:
            held = self.store.cpus_of(uid)
            assert held is not None, f"decision names claim {uid!r} the store does not hold"
            assert held == ON_DISK[uid]
            out |= held
        return out

    def check_store(self) -> None:
        seen = CPUSet()
        for record in self.store.records():
            assert record.cpus <= AVAILABLE
            assert seen.isdisjoint(record.cpus), "a CPU is in two claims"
            seen |= record.cpus
        assert self.store.shared_pool.isdisjoint(seen)

    def check_decision(self, decision: CreateDecision) -> None:
        if decision.claim_uids:
            assert decision.cpus == self.claims_cpus(decision.claim_uids)
        else:
            assert decision.cpus == self.store.shared_pool
        self.check_updates(decision.updates, self.runtime)

    def check_updates(
        self, updates: list[ContainerIntent], runtime: dict[str, api_pb2.Container]
    ) -> None:
        """Each update is the shared pool, or exactly the prepared CPUs of the claims its
        container's env names; every such claim's env value matches the store (Synchronize
        skips claims with no spec, as upstream does, and confines mismatches)."""
        for update in updates:
            update_cpus = CPUSet.parse(update.cpus)
            assert update_cpus and update_cpus <= AVAILABLE
            if update_cpus == self.store.shared_pool:
                continue
            claims = parse_dra_env(runtime[update.container_id].env)
            held = {uid: cpus for uid, cpus in claims.items() if uid in self.store}
            assert held, f"update {update} for a container without prepared claims"
            for uid, cpus in held.items():
                assert self.store.cpus_of(uid) == cpus
            assert update_cpus == self.claims_cpus(tuple(held))


@fuzz_settings(300)
@given(events)
def test_random_events_never_grant_unprepared_cpus(
    steps: list[tuple[str, tuple[str, api_pb2.Container]]],
) -> None:
    node = Node()
    with bounded():
        for kind, (pod_uid, generated) in steps:
            # One id, one container: the runtime never changes a container's env.
            container = node.runtime.setdefault(generated.id, generated)
            if kind == "create":
                try:
                    decision = node.plugin.create_container(pod(pod_uid), container)
                except NRIPluginError as exc:
                    assert str(exc)
                else:
                    node.check_decision(decision)
            elif kind == "stop":
                node.plugin.stop_container(pod(pod_uid), container)
            elif kind == "remove":
                node.plugin.remove_container(pod(pod_uid), container)
            else:
                # The runtime lists every container it knows of, in any state.
                pods = [pod(p) for p in ("p1", "p2", "p3")]
                updates = node.plugin.synchronize(pods, list(node.runtime.values()), ON_DISK)
                node.check_updates(updates, node.runtime)
            node.check_store()
            for intent in node.plugin.intents():
                assert CPUSet.parse(intent.cpus) <= AVAILABLE
