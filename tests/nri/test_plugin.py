"""NRIPlugin decisions (behavior.md §13.3-§13.5) and dracpu's stricter Synchronize."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
from builders import cs, nri_container, nri_pod
from owner_steps import unprepare

from dracpu.allocation.options import AllocationOptions
from dracpu.allocation.store import AllocationStore, ClaimRecord, Owner
from dracpu.cpuset import CPUSet
from dracpu.messages import ContainerIntent
from dracpu.nri.plugin import EMPTY_SHARED_POOL, NRIPlugin, NRIPluginError
from dracpu.proto.nri import api_pb2
from dracpu.state import NodeState

ALL = CPUSet.parse("0-7")
NONE = CPUSet()


def ctr(pod_uid: str, name: str, cid: str, *env: str) -> api_pb2.Container:
    """A container as the runtime sends it: ``PATH`` first, then ``env``."""
    return nri_container(pod_uid, cid, "PATH=/bin", *env, name=name)


class Node:
    """One plugin over a fresh state owner, with a CDI view tests can fill."""

    def __init__(
        self,
        available: CPUSet = ALL,
        reserved: CPUSet = NONE,
        mems_of: Callable[[CPUSet], str] | None = None,
    ):
        self.state = NodeState(AllocationStore(available, reserved), mems_of=mems_of)
        self.view = self.state.view
        self.cdi: dict[str, CPUSet] = {}
        self.cdi_reads = 0
        self.plugin = NRIPlugin(self.state)

    def synchronize(
        self, pods: list[api_pb2.PodSandbox], containers: list[api_pb2.Container]
    ) -> list[ContainerIntent]:
        """As the session does: read the CDI specs only when the plugin needs them."""
        cdi: Mapping[str, CPUSet] = {}
        if self.plugin.needs_cdi_specs(containers):
            self.cdi_reads += 1
            cdi = dict(self.cdi)
        return self.plugin.synchronize(pods, containers, cdi)

    def prepare(self, uid: str, cpus: str) -> None:
        self.state.restore([ClaimRecord(uid=uid, cpus=cs(cpus))])


def pairs(updates: list[ContainerIntent]) -> list[tuple[str, str]]:
    return [(u.container_id, u.cpus) for u in updates]


# -- §13.3 table ----------------------------------------------------------------------------


def test_row1_nothing_prepared_shared_container_gets_all_cpus() -> None:
    node = Node()
    decision = node.plugin.create_container(nri_pod("p1"), ctr("p1", "app", "c1"))
    assert decision.cpus == ALL
    assert decision.updates == []
    assert node.view.shared_container_ids() == ["c1"]


def test_row2_shared_container_gets_pool_without_claimed_cpus() -> None:
    node = Node()
    node.prepare("A", "0-3")
    decision = node.plugin.create_container(nri_pod("p1"), ctr("p1", "app", "c1"))
    assert decision.cpus == cs("4-7")
    assert decision.updates == []


def test_row3_guaranteed_container_alone() -> None:
    node = Node()
    node.prepare("A", "0-3")
    decision = node.plugin.create_container(
        nri_pod("p1"), ctr("p1", "app", "c1", "DRA_CPUSET_A=0-3")
    )
    assert decision.cpus == cs("0-3")
    assert decision.updates == []
    assert decision.mems == ""
    assert node.view.owner_of("A") == Owner("p1", "app")


def test_row4_guaranteed_container_shrinks_shared_containers() -> None:
    node = Node()
    node.plugin.create_container(nri_pod("p0"), ctr("p0", "s1", "s1"))
    node.plugin.create_container(nri_pod("p0"), ctr("p0", "s2", "s2"))
    node.prepare("A", "2-3")
    decision = node.plugin.create_container(
        nri_pod("p1"), ctr("p1", "app", "g1", "DRA_CPUSET_A=2-3")
    )
    assert decision.cpus == cs("2-3")
    assert pairs(decision.updates) == [("s1", "0-1,4-7"), ("s2", "0-1,4-7")]
    assert all(u.ignore_failure for u in decision.updates)
    assert decision.updates[0].cgroups_path == "/kubepods/podp0/s1"
    assert decision.updates[0] == ContainerIntent(
        container_id="s1",
        cgroups_path="/kubepods/podp0/s1",
        cpus="0-1,4-7",
        pod_uid="p0",
        name="s1",
        ignore_failure=True,
    )


def test_row5_claim_not_prepared() -> None:
    node = Node()
    with pytest.raises(NRIPluginError) as err:
        node.plugin.create_container(nri_pod("p1"), ctr("p1", "app", "c1", "DRA_CPUSET_A=0-3"))
    assert str(err.value) == 'claim "A" is not prepared by this driver'
    # The owner bound before validation is released again; nothing is recorded.
    assert node.view.owner_of("A") is None
    assert len(node.view.containers()) == 0


def test_row6_cpuset_mismatch_is_refused() -> None:
    node = Node()
    node.prepare("A", "0-1")
    with pytest.raises(NRIPluginError) as err:
        node.plugin.create_container(nri_pod("p1"), ctr("p1", "app", "c1", "DRA_CPUSET_A=0-3"))
    assert str(err.value) == (
        'validation failed for claim "A": cpuset mismatch (expected "0-1", got "0-3")'
    )
    assert node.view.owner_of("A") is None


# -- env and security -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("DRA_CPUSET_A", 'malformed DRA env entry "DRA_CPUSET_A"'),
        (
            "DRA_CPUSET_A=a-b",
            'failed to parse cpuset value "a-b" from env "DRA_CPUSET_A=a-b": ',
        ),
    ],
)
def test_malformed_env_fails_creation_of_any_container(entry: str, message: str) -> None:
    node = Node()
    node.prepare("A", "0-1")
    with pytest.raises(NRIPluginError) as err:
        node.plugin.create_container(nri_pod("p1"), ctr("p1", "besteffort", "c1", entry))
    assert str(err.value).startswith(message)
    assert len(node.view.containers()) == 0


def test_dra_cpusetx_key_is_not_a_claim() -> None:
    node = Node()
    decision = node.plugin.create_container(
        nri_pod("p1"), ctr("p1", "app", "c1", "DRA_CPUSETX=0-3")
    )
    assert decision.cpus == ALL


def test_forged_env_matching_another_pods_claim_is_refused() -> None:
    node = Node()
    node.prepare("A", "0-1")
    node.plugin.create_container(nri_pod("p1"), ctr("p1", "app", "g1", "DRA_CPUSET_A=0-1"))
    with pytest.raises(NRIPluginError) as err:
        node.plugin.create_container(nri_pod("evil"), ctr("evil", "x", "e1", "DRA_CPUSET_A=0-1"))
    assert str(err.value) == 'claimUID "A" already bound to pod "p1" container "app"'


def test_empty_shared_pool_fails_closed_for_shared_containers() -> None:
    node = Node()
    node.prepare("A", "0-7")
    with pytest.raises(NRIPluginError) as err:
        node.plugin.create_container(nri_pod("p1"), ctr("p1", "app", "c1"))
    assert str(err.value) == EMPTY_SHARED_POOL
    assert len(node.view.containers()) == 0
    # The claim holder itself is still created.
    decision = node.plugin.create_container(
        nri_pod("p2"), ctr("p2", "app", "g1", "DRA_CPUSET_A=0-7")
    )
    assert decision.cpus == ALL
    assert node.plugin.intents()[0].cpus == "0-7"


def test_claim_taking_the_last_cpus_sends_no_empty_updates() -> None:
    node = Node()
    node.plugin.create_container(nri_pod("p0"), ctr("p0", "s1", "s1"))
    node.prepare("A", "0-7")
    decision = node.plugin.create_container(
        nri_pod("p1"), ctr("p1", "app", "g1", "DRA_CPUSET_A=0-7")
    )
    assert decision.updates == []
    assert node.plugin.intents() == [
        ContainerIntent(
            container_id="g1",
            cgroups_path="/kubepods/podp1/g1",
            cpus="0-7",
            pod_uid="p1",
            name="app",
        )
    ]


def test_two_claims_union_and_align_memory() -> None:
    node = Node(mems_of=lambda cpus: "0" if cpus.max() < 4 else "0-1")
    node.prepare("A", "0-1")
    node.prepare("B", "4")
    decision = node.plugin.create_container(
        nri_pod("p1"), ctr("p1", "app", "g1", "DRA_CPUSET_A=0-1", "DRA_CPUSET_B=4")
    )
    assert decision.cpus == cs("0-1,4")
    assert decision.mems == "0-1"
    assert decision.claim_uids == ("A", "B")


# -- §13.4 stop / remove ------------------------------------------------------------------


def test_restarted_container_keeps_its_claim_and_sends_no_updates() -> None:
    node = Node()
    node.plugin.create_container(nri_pod("p0"), ctr("p0", "s1", "s1"))
    node.prepare("A", "0-1")
    first = node.plugin.create_container(nri_pod("p1"), ctr("p1", "app", "g1", "DRA_CPUSET_A=0-1"))
    assert pairs(first.updates) == [("s1", "2-7")]
    assert node.plugin.stop_container(nri_pod("p1"), ctr("p1", "app", "g1")) is not None
    assert node.view.owner_of("A") == Owner("p1", "app")
    again = node.plugin.create_container(nri_pod("p1"), ctr("p1", "app", "g2", "DRA_CPUSET_A=0-1"))
    assert again.cpus == cs("0-1")
    assert again.updates == []


def test_stale_stop_and_remove_after_new_create_are_ignored() -> None:
    node = Node()
    node.prepare("A", "0-1")
    node.plugin.create_container(nri_pod("p1"), ctr("p1", "app", "g1", "DRA_CPUSET_A=0-1"))
    node.plugin.create_container(nri_pod("p1"), ctr("p1", "app", "g2", "DRA_CPUSET_A=0-1"))
    assert node.plugin.stop_container(nri_pod("p1"), ctr("p1", "app", "g1")) is None
    assert node.plugin.remove_container(nri_pod("p1"), ctr("p1", "app", "g1")) is None
    record = node.view.container_of("p1", "app")
    assert record is not None and record.container_id == "g2"
    removed = node.plugin.remove_container(nri_pod("p1"), ctr("p1", "app", "g2"))
    assert removed is not None and removed.claim_uids == ("A",)
    assert node.view.cpus_of("A") == cs("0-1")  # only Unprepare releases CPUs


def test_shared_container_replaced_by_new_id_leaves_shared_set() -> None:
    node = Node()
    node.plugin.create_container(nri_pod("p1"), ctr("p1", "app", "c1"))
    node.plugin.create_container(nri_pod("p1"), ctr("p1", "app", "c2"))
    assert node.view.shared_container_ids() == ["c2"]


async def test_shared_pool_updates_after_unprepare() -> None:
    node = Node()
    node.prepare("A", "0-3")
    node.plugin.create_container(nri_pod("p0"), ctr("p0", "s1", "s1"))
    node.plugin.create_container(nri_pod("p0"), ctr("p0", "s2", "s2"))
    await unprepare(node.state, "A")
    assert pairs(node.plugin.shared_pool_updates()) == [("s1", "0-7"), ("s2", "0-7")]
    node.prepare("B", "0-7")
    assert node.plugin.shared_pool_updates() == []


# -- §13.5 synchronize --------------------------------------------------------------------


def test_sync_example_rebuilds_from_cdi() -> None:
    node = Node()
    node.cdi = {"A": cs("0-1")}
    pods = [nri_pod("p1"), nri_pod("p2")]
    containers = [
        ctr("p1", "g", "p1-g", "DRA_CPUSET_A=0,1"),
        ctr("p1", "s", "p1-s"),
        ctr("p2", "s", "p2-s"),
    ]
    updates = node.synchronize(pods, containers)
    assert pairs(updates) == [("p1-g", "0-1"), ("p1-s", "2-7"), ("p2-s", "2-7")]
    assert node.view.cpus_of("A") == cs("0-1")
    assert node.view.owner_of("A") == Owner("p1", "g")
    assert node.cdi_reads == 1
    assert not updates[0].ignore_failure


def test_sync_claim_without_cdi_spec_is_shared() -> None:
    node = Node()
    updates = node.synchronize([nri_pod("p1")], [ctr("p1", "g", "c1", "DRA_CPUSET_A=0-1")])
    assert pairs(updates) == [("c1", "0-7")]
    assert not node.view.has_claim("A")
    assert node.view.shared_container_ids() == ["c1"]


def test_sync_malformed_env_gets_no_update() -> None:
    node = Node()
    updates = node.synchronize(
        [nri_pod("p1")], [ctr("p1", "g", "c1", "DRA_CPUSET_A=a-b"), ctr("p1", "s", "c2")]
    )
    assert pairs(updates) == [("c2", "0-7")]
    assert node.view.container_of("p1", "g") is None


def test_sync_ignores_containers_of_unknown_pods() -> None:
    node = Node()
    assert node.synchronize([nri_pod("p1")], [ctr("p9", "s", "c9")]) == []


def test_sync_keeps_prepared_claims_not_yet_running() -> None:
    node = Node()
    node.prepare("A", "0-1")  # prepared by the kubelet, its container not created yet
    node.plugin.create_container(nri_pod("p0"), ctr("p0", "old", "gone"))
    updates = node.synchronize([nri_pod("p1")], [ctr("p1", "s", "c1")])
    assert pairs(updates) == [("c1", "2-7")]
    assert node.view.cpus_of("A") == cs("0-1")
    assert [r.container_id for r in node.view.containers()] == ["c1"]  # rebuilt from the runtime
    decision = node.plugin.create_container(nri_pod("p2"), ctr("p2", "g", "g1", "DRA_CPUSET_A=0-1"))
    assert decision.cpus == cs("0-1")


def test_sync_env_disagreeing_with_store_is_forged_and_confined() -> None:
    node = Node()
    node.prepare("A", "0-1")
    node.cdi = {"A": cs("0-3")}
    updates = node.synchronize([nri_pod("p1")], [ctr("p1", "g", "c1", "DRA_CPUSET_A=0-3")])
    assert pairs(updates) == [("c1", "2-7")]
    assert node.view.owner_of("A") is None
    assert node.view.cpus_of("A") == cs("0-1")


def test_sync_env_disagreeing_with_cdi_is_confined() -> None:
    node = Node()
    node.cdi = {"A": cs("0-1")}
    updates = node.synchronize(
        [nri_pod("p1")], [ctr("p1", "g", "c1", "DRA_CPUSET_A=0-3", "DRA_CPUSET_B=4")]
    )
    assert pairs(updates) == [("c1", "0-7")]
    assert not node.view.has_claim("A")


def test_sync_same_claim_in_two_containers_confines_the_second() -> None:
    node = Node()
    node.prepare("A", "0-1")
    updates = node.synchronize(
        [nri_pod("p1"), nri_pod("p2")],
        [ctr("p1", "g", "c1", "DRA_CPUSET_A=0-1"), ctr("p2", "x", "c2", "DRA_CPUSET_A=0-1")],
    )
    assert pairs(updates) == [("c1", "0-1"), ("c2", "2-7")]
    assert node.view.owner_of("A") == Owner("p1", "g")


def test_sync_cdi_claim_overlapping_held_cpus_is_confined() -> None:
    node = Node()
    node.prepare("A", "0-1")
    node.cdi = {"B": cs("1-2")}
    updates = node.synchronize([nri_pod("p1")], [ctr("p1", "g", "c1", "DRA_CPUSET_B=1-2")])
    assert pairs(updates) == [("c1", "2-7")]
    assert not node.view.has_claim("B")


def test_sync_two_cdi_claims_of_one_container_that_overlap_are_refused() -> None:
    node = Node()
    node.cdi = {"A": cs("0-1"), "B": cs("1-2")}
    updates = node.synchronize(
        [nri_pod("p1")], [ctr("p1", "g", "c1", "DRA_CPUSET_A=0-1", "DRA_CPUSET_B=1-2")]
    )
    assert pairs(updates) == [("c1", "0-7")]
    assert len(node.view.claims()) == 0


def test_sync_rebuilds_owners_of_stopped_claim_holders() -> None:
    node = Node()
    node.prepare("A", "0-1")
    node.plugin.create_container(nri_pod("p1"), ctr("p1", "g", "g1", "DRA_CPUSET_A=0-1"))
    node.synchronize([nri_pod("p1")], [])
    assert node.view.owners() == {}
    assert len(node.view.containers()) == 0
    assert node.view.cpus_of("A") == cs("0-1")


async def test_intents_cover_every_container() -> None:
    node = Node()
    node.prepare("A", "0-1")
    node.plugin.create_container(nri_pod("p1"), ctr("p1", "g", "g1", "DRA_CPUSET_A=0-1"))
    node.plugin.create_container(nri_pod("p1"), ctr("p1", "s", "s1"))
    assert [(i.container_id, i.cpus, i.cgroups_path) for i in node.plugin.intents()] == [
        ("g1", "0-1", "/kubepods/podp1/g1"),
        ("s1", "2-7", "/kubepods/podp1/s1"),
    ]
    await unprepare(node.state, "A")  # claim holder whose claim is gone follows the pool
    assert [i.cpus for i in node.plugin.intents()] == ["0-7", "0-7"]


def test_has_synchronized_after_the_first_synchronize() -> None:
    node = Node()
    node.plugin.create_container(nri_pod("p1"), ctr("p1", "a", "c1"))
    assert node.state.has_synchronized is False
    node.synchronize([], [])
    assert node.state.has_synchronized is True


def test_knows_tracks_containers_until_stopped() -> None:
    node = Node()
    node.plugin.create_container(nri_pod("p1"), ctr("p1", "a", "c1"))
    assert node.plugin.knows("c1") and not node.plugin.knows("c2")
    node.plugin.stop_container(nri_pod("p1"), ctr("p1", "a", "c1"))
    assert not node.plugin.knows("c1")


# -- sharedPoolAccess (issue #16) -----------------------------------------------------------


def prepare_with_pool_access(node: Node, uid: str, cpus: str) -> None:
    options = {"req": AllocationOptions(shared_pool_access=True)}
    node.state.restore([ClaimRecord(uid=uid, cpus=cs(cpus), options=options)])


async def test_pool_access_holder_runs_on_its_cpus_plus_the_pool_and_follows_it() -> None:
    node = Node()
    node.plugin.create_container(nri_pod("p0"), ctr("p0", "s1", "s1"))
    prepare_with_pool_access(node, "A", "0-1")
    node.prepare("B", "6-7")
    decision = node.plugin.create_container(
        nri_pod("p1"), ctr("p1", "app", "g1", "DRA_CPUSET_A=0-1")
    )
    assert decision.cpus == cs("0-5")  # its two exclusive CPUs and the pool 2-5
    assert pairs(decision.updates) == [("s1", "2-5")]
    # The pool grows: the shared container and the pool-access holder both follow it.
    await unprepare(node.state, "B")
    assert pairs(node.plugin.shared_pool_updates()) == [("s1", "2-7"), ("g1", "0-7")]
    assert {i.container_id: i.cpus for i in node.plugin.intents()} == {"s1": "2-7", "g1": "0-7"}


def test_pool_access_holder_keeps_its_own_cpus_when_the_pool_is_empty() -> None:
    node = Node(available=cs("0-3"))
    prepare_with_pool_access(node, "A", "0-1")
    node.plugin.create_container(nri_pod("p1"), ctr("p1", "app", "g1", "DRA_CPUSET_A=0-1"))
    node.prepare("B", "2-3")  # the pool is empty now
    assert pairs(node.plugin.shared_pool_updates()) == [("g1", "0-1")]


def test_pool_access_env_still_names_only_the_exclusive_cpus() -> None:
    node = Node()
    prepare_with_pool_access(node, "A", "0-1")
    # The env must carry the claim's own CPUs; the pool is not part of DRA_CPUSET_A.
    with pytest.raises(NRIPluginError, match="cpuset mismatch"):
        node.plugin.create_container(nri_pod("p1"), ctr("p1", "app", "g1", "DRA_CPUSET_A=0-7"))


def test_synchronize_gives_a_pool_access_holder_its_cpus_and_the_pool_once() -> None:
    node = Node()
    prepare_with_pool_access(node, "A", "0-1")
    updates = node.synchronize(
        [nri_pod("p1")], [ctr("p1", "g", "g1", "DRA_CPUSET_A=0-1"), ctr("p1", "s", "s1")]
    )
    assert pairs(updates) == [("g1", "0-7"), ("s1", "2-7")]
