"""ResourceSlice reconciliation (behavior.md §6.4): the pure planner, the backoff schedule,
and SliceReconciler against the loopback API server through the real kubernetes client."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.k8s.client import KubeClient
from dracpu.k8s.slices import Plan, SliceReconciler, SliceUpdate, backoff_delay, plan_reconcile
from dracpu.sim.apiserver import SimAPIServer
from dracpu.topology import discover_from_root

FAKE = Path(__file__).parent.parent / "fake_sysfs"
NODE = "node-a"
UID = "0f6e7a1c-0000-4000-8000-00000000a001"
SELECTOR = f"spec.nodeName={NODE},spec.driver=dra.cpu"


@cache
def _desired(fixture: str, mode: str, group_by: str = "numanode") -> tuple[Any, ...]:
    topo = discover_from_root(FAKE / fixture)
    inv = build_inventory(topo, DeviceSettings(mode=mode, group_by=group_by))  # type: ignore[arg-type]
    return tuple(build_slices(inv, node_name=NODE, node_uid=UID, expose_pcie_roots=False))


def desired(fixture: str, mode: str, group_by: str = "numanode") -> list[dict[str, Any]]:
    return copy.deepcopy(list(_desired(fixture, mode, group_by)))


@pytest.fixture
async def sim(
    nursery: trio.Nursery, tmp_path: Path
) -> AsyncIterator[tuple[SimAPIServer, KubeClient]]:
    server = SimAPIServer(seed=5)
    await nursery.start(server.serve)
    kube = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    yield server, kube
    kube.close()


def published(server: SimAPIServer) -> list[dict[str, Any]]:
    return sorted(
        server.list("resourceslices", field_selector=SELECTOR),
        key=lambda s: s["metadata"]["name"],
    )


def reconciler(kube: KubeClient, want: list[dict[str, Any]], **kw: Any) -> SliceReconciler:
    kw.setdefault("backoff_base", 0.001)
    kw.setdefault("backoff_cap", 0.01)
    return SliceReconciler(kube, node_name=NODE, desired=want, resync_interval=3600, **kw)


def assert_matches(server: SimAPIServer, want: list[dict[str, Any]], generation: int) -> None:
    """The published pool is exactly ``want`` at ``generation``, one slice per index."""
    got = published(server)
    assert len(got) == len(want)
    for obj, wanted in zip(got, want, strict=True):
        assert obj["metadata"]["name"].startswith(wanted["metadata"]["generateName"])
        assert len(obj["metadata"]["name"]) == len(wanted["metadata"]["generateName"]) + 5
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": UID, "controller": True}
        ]
        spec = copy.deepcopy(wanted["spec"])
        spec["pool"]["generation"] = generation
        assert obj["spec"] == spec


# -- pure planner ----------------------------------------------------------------------------


def existing_from(want: list[dict[str, Any]], generation: int) -> list[dict[str, Any]]:
    out = []
    for i, d in enumerate(want):
        obj = copy.deepcopy(d)
        meta = obj["metadata"]
        meta["name"] = meta.pop("generateName") + "abcde"
        meta["resourceVersion"] = str(10 + i)
        meta["uid"] = f"uid-{i}"
        obj["spec"]["pool"]["generation"] = generation
        out.append(obj)
    return out


def test_plan_new_pool_creates_all_at_generation_1() -> None:
    want = desired("epyc-2s-768", "individual")
    plan = plan_reconcile(want, [], current_generation=None)
    assert plan.generation == 1
    assert plan.updates == [] and plan.deletes == []
    assert [c["metadata"]["generateName"] for c in plan.creates] == [
        f"0000{i}-dra.cpu-node-a-" for i in range(6)
    ]
    assert all(c["spec"]["pool"]["generation"] == 1 for c in plan.creates)


def test_plan_unchanged_pool_is_empty_and_keeps_generation() -> None:
    want = desired("xeon-2s-ht", "individual")
    plan = plan_reconcile(want, existing_from(want, 4), current_generation=None)
    assert plan == Plan(generation=4)
    assert plan.empty


def test_plan_one_changed_slice_is_updated_in_place() -> None:
    want = desired("epyc-2s-768", "individual")
    existing = existing_from(want, 3)
    existing[2]["spec"]["devices"] = existing[2]["spec"]["devices"][:5]
    plan = plan_reconcile(want, existing, current_generation=3)
    assert plan.generation == 3
    assert plan.creates == [] and plan.deletes == []
    body = copy.deepcopy(want[2])
    del body["metadata"]["generateName"]
    body["metadata"]["name"] = "00002-dra.cpu-node-a-abcde"
    body["metadata"]["resourceVersion"] = "12"
    body["spec"]["pool"]["generation"] = 3
    assert plan.updates == [SliceUpdate("00002-dra.cpu-node-a-abcde", "12", body)]


def test_plan_two_changed_slices_bump_and_rewrite_all() -> None:
    want = desired("epyc-2s-768", "individual")
    existing = existing_from(want, 3)
    existing[0]["spec"]["devices"] = []
    existing[1]["metadata"]["ownerReferences"][0]["uid"] = "old"
    plan = plan_reconcile(want, existing, current_generation=None)
    assert plan.generation == 4
    assert [u.name for u in plan.updates] == [f"0000{i}-dra.cpu-node-a-abcde" for i in range(6)]
    assert all(u.body["spec"]["pool"]["generation"] == 4 for u in plan.updates)
    assert plan.creates == [] and plan.deletes == []


def test_plan_missing_slice_bumps_generation() -> None:
    want = desired("epyc-2s-768", "individual")
    existing = existing_from(want, 2)
    del existing[4]
    plan = plan_reconcile(want, existing, current_generation=2)
    assert plan.generation == 3
    assert [c["metadata"]["generateName"] for c in plan.creates] == ["00004-dra.cpu-node-a-"]
    assert len(plan.updates) == 5
    assert plan.deletes == []


def test_plan_deletes_old_generation_unmatched_and_duplicates() -> None:
    want = desired("xeon-2s-ht", "individual")  # one slice
    existing = existing_from(want, 5)
    stale = copy.deepcopy(existing[0])
    stale["metadata"]["name"] = "00000-dra.cpu-node-a-zzzzz"
    stale["spec"]["pool"]["generation"] = 4
    extra = copy.deepcopy(existing[0])
    extra["metadata"]["name"] = "00001-dra.cpu-node-a-qqqqq"
    dup = copy.deepcopy(existing[0])
    dup["metadata"]["name"] = "00000-dra.cpu-node-a-bbbbb"
    plan = plan_reconcile(want, [extra, stale, dup, existing[0]], current_generation=5)
    assert plan.generation == 5
    assert sorted(plan.deletes) == [
        "00000-dra.cpu-node-a-bbbbb",
        "00000-dra.cpu-node-a-zzzzz",
        "00001-dra.cpu-node-a-qqqqq",
    ]
    assert plan.creates == [] and plan.updates == []


def test_plan_duplicate_keeps_the_one_with_wanted_content() -> None:
    want = desired("xeon-2s-ht", "individual")
    good = existing_from(want, 1)[0]
    bad = copy.deepcopy(good)
    bad["metadata"]["name"] = "00000-dra.cpu-node-a-aaaaa"  # sorts first
    bad["spec"]["devices"] = []
    plan = plan_reconcile(want, [good, bad], current_generation=1)
    assert plan == Plan(generation=1, deletes=["00000-dra.cpu-node-a-aaaaa"])


def test_plan_generation_never_goes_back_after_everything_was_deleted() -> None:
    want = desired("xeon-2s-ht", "individual")
    plan = plan_reconcile(want, [], current_generation=7)
    assert plan.generation == 8
    assert len(plan.creates) == 1 and plan.creates[0]["spec"]["pool"]["generation"] == 8


def test_plan_does_not_mutate_inputs() -> None:
    want = desired("epyc-2s-768", "individual")
    existing = existing_from(want, 1)
    existing[0]["spec"]["devices"] = []
    existing[1]["spec"]["devices"] = []
    snapshot = copy.deepcopy((want, existing))
    plan_reconcile(want, existing, current_generation=1)
    assert (want, existing) == snapshot


# -- backoff schedule ------------------------------------------------------------------------


def test_backoff_delay_grows_caps_and_jitters() -> None:
    top = [backoff_delay(a, base=0.5, cap=30.0, rand=lambda: 1.0) for a in range(9)]
    assert top == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert backoff_delay(3, base=0.5, cap=30.0, rand=lambda: 0.0) == 2.0
    assert backoff_delay(10_000, base=0.5, cap=30.0, rand=lambda: 0.5) == 22.5


def test_backoff_delay_rejects_negative_attempt() -> None:
    with pytest.raises(ValueError, match=r"^backoff attempt must be >= 0, got -1$"):
        backoff_delay(-1, base=0.5, cap=30.0)


class FlakyReconciler(SliceReconciler):
    """No API at all: ``sync_once`` fails ``failures`` times, recording when it ran."""

    def __init__(self, failures: int) -> None:
        super().__init__(None, node_name=NODE, desired=[], rand=lambda: 1.0)  # type: ignore[arg-type]
        self.failures = failures
        self.times: list[float] = []

    async def sync_once(self) -> Plan:
        from dracpu.k8s.client import ServerError

        self.times.append(trio.current_time())
        if len(self.times) <= self.failures:
            raise ServerError("boom", status=500)
        return Plan(generation=1)


async def test_retry_schedule_under_mock_clock() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def main() -> list[float]:
        r = FlakyReconciler(failures=8)
        async with trio.open_nursery() as nursery:
            await nursery.start(r.run)
            assert r.converged.is_set()
            assert r.errors == 8
            nursery.cancel_scope.cancel()
        start = r.times[0]
        return [round(t - start, 6) for t in r.times]

    times = await trio.to_thread.run_sync(lambda: trio.run(main, clock=clock))
    # waits 0.5, 1, 2, 4, 8, 16, 30, 30 (rand pinned to the top of the jitter range)
    assert times == [0.0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5, 61.5, 91.5]


# -- against the loopback server -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "mode", "group_by", "count"),
    [
        ("xeon-2s-ht", "individual", "numanode", 1),
        ("xeon-2s-ht", "grouped", "numanode", 1),
        ("epyc-nps4", "grouped", "socket", 1),
        ("epyc-2s-768", "individual", "numanode", 6),
        ("epyc-2s-768", "grouped", "machine", 1),
    ],
)
async def test_publishes_pool(
    sim: tuple[SimAPIServer, KubeClient],
    nursery: trio.Nursery,
    fixture: str,
    mode: str,
    group_by: str,
    count: int,
) -> None:
    server, kube = sim
    want = desired(fixture, mode, group_by)
    assert len(want) == count
    r = reconciler(kube, want)
    await nursery.start(r.run)
    assert r.converged.is_set()
    assert r.generation == 1
    assert_matches(server, want, 1)
    assert r.api_calls == 1 + count
    assert server.calls.get("create", "resourceslices") == count
    nursery.cancel_scope.cancel()


async def test_external_deletion_repaired_on_trigger(
    sim: tuple[SimAPIServer, KubeClient], nursery: trio.Nursery
) -> None:
    server, kube = sim
    want = desired("epyc-2s-768", "individual")
    r = reconciler(kube, want)
    await nursery.start(r.run)
    victim = published(server)[3]["metadata"]["name"]
    server.delete("resourceslices", victim)
    r.trigger()
    await r.wait_next_sync()
    # a missing slice means a new one: generation bumped, all rewritten
    assert r.generation == 2
    assert_matches(server, want, 2)
    assert victim not in {s["metadata"]["name"] for s in published(server)}
    nursery.cancel_scope.cancel()


async def test_periodic_resync_repairs_external_change(
    sim: tuple[SimAPIServer, KubeClient], nursery: trio.Nursery
) -> None:
    server, kube = sim
    want = desired("epyc-2s-768", "individual")
    r = SliceReconciler(kube, node_name=NODE, desired=want, resync_interval=0.05)
    await nursery.start(r.run)
    obj = published(server)[1]
    obj["spec"]["devices"] = obj["spec"]["devices"][:1]
    server.update("resourceslices", obj)
    stray = copy.deepcopy(want[0])
    stray["metadata"]["generateName"] = "00007-dra.cpu-node-a-"
    server.create("resourceslices", stray)
    await r.wait_next_sync()
    # one changed slice: fixed in place, generation kept; the stray is gone
    assert r.generation == 1
    assert_matches(server, want, 1)
    nursery.cancel_scope.cancel()


async def test_restart_changes_nothing(
    sim: tuple[SimAPIServer, KubeClient], nursery: trio.Nursery
) -> None:
    server, kube = sim
    want = desired("epyc-2s-768", "individual")
    async with trio.open_nursery() as inner:
        await inner.start(reconciler(kube, want).run)
        inner.cancel_scope.cancel()
    before = published(server)
    server.calls.reset()
    second = reconciler(kube, want)
    await nursery.start(second.run)
    assert second.generation == 1
    assert published(server) == before
    assert server.calls.snapshot() == {"list resourceslices": 1}
    assert second.api_calls == 1
    nursery.cancel_scope.cancel()


async def test_content_change_bumps_generation(
    sim: tuple[SimAPIServer, KubeClient], nursery: trio.Nursery
) -> None:
    server, kube = sim
    first = desired("epyc-2s-768", "individual")
    r = reconciler(kube, first)
    await nursery.start(r.run)
    names = [s["metadata"]["name"] for s in published(server)]
    topo = discover_from_root(FAKE / "epyc-2s-768")
    inv = build_inventory(topo, DeviceSettings(mode="individual", publish_node_allocatable=True))
    second = build_slices(inv, node_name=NODE, node_uid=UID, expose_pcie_roots=False)
    r.set_desired(second)
    await r.wait_next_sync()
    assert r.generation == 2
    assert_matches(server, second, 2)
    # rewritten in place: same objects, no delete/create churn
    assert [s["metadata"]["name"] for s in published(server)] == names
    nursery.cancel_scope.cancel()


async def test_shrinking_pool_deletes_extra_slices(
    sim: tuple[SimAPIServer, KubeClient], nursery: trio.Nursery
) -> None:
    server, kube = sim
    r = reconciler(kube, desired("epyc-2s-768", "individual"))
    await nursery.start(r.run)
    grouped = desired("epyc-2s-768", "grouped", "socket")
    r.set_desired(grouped)
    await r.wait_next_sync()
    # index 0 changed (1 slice): updated in place at the same generation, 5 deleted
    assert r.generation == 1
    assert_matches(server, grouped, 1)
    nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("verb", "status", "drop"),
    [
        ("create", 409, False),
        ("create", 500, False),
        ("list", 429, False),
        ("list", 503, False),
        ("create", 500, True),
        ("list", 500, True),
    ],
)
async def test_survives_fault_storm(
    sim: tuple[SimAPIServer, KubeClient],
    nursery: trio.Nursery,
    verb: str,
    status: int,
    drop: bool,
) -> None:
    server, kube = sim
    want = desired("epyc-2s-768", "individual")
    # (urllib3 itself retries a 429 up to 3 times, sleeping out Retry-After in the worker
    # thread; 5 faults get past that and reach our own backoff)
    server.faults.inject(verb, "resourceslices", 5, status=status, drop_connection=drop)
    r = reconciler(kube, want)
    await nursery.start(r.run)
    assert server.faults.pending() == 0
    assert r.errors >= 1
    assert r.generation is not None
    assert_matches(server, want, r.generation)
    nursery.cancel_scope.cancel()


async def test_update_conflict_is_retried(
    sim: tuple[SimAPIServer, KubeClient], nursery: trio.Nursery
) -> None:
    server, kube = sim
    want = desired("epyc-2s-768", "individual")
    r = reconciler(kube, want)
    await nursery.start(r.run)
    obj = published(server)[0]
    obj["spec"]["devices"] = []
    server.update("resourceslices", obj)
    server.faults.inject("update", "resourceslices", 3, status=409)
    r.trigger()
    await r.wait_next_sync()
    assert r.errors == 3
    assert r.generation == 1
    assert_matches(server, want, 1)
    nursery.cancel_scope.cancel()


class CountingReconciler(SliceReconciler):
    """Sets ``third_failure`` when the third sync has failed."""

    third_failure = trio.Event()

    async def sync_once(self) -> Plan:
        try:
            return await super().sync_once()
        except Exception:
            if self.errors == 2:
                self.third_failure.set()
            raise


async def test_unreachable_server_never_raises(nursery: trio.Nursery, tmp_path: Path) -> None:
    # a port nobody listens on: run keeps retrying and never raises
    server = SimAPIServer()
    server.port = 9  # discard port, closed on the loopback
    kube = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kc")))
    r = CountingReconciler(
        kube,
        node_name=NODE,
        desired=desired("xeon-2s-ht", "individual"),
        backoff_base=0.001,
        backoff_cap=0.01,
    )
    r.third_failure = trio.Event()
    nursery.start_soon(r.run)
    await r.third_failure.wait()
    assert not r.converged.is_set()
    assert r.generation is None
    nursery.cancel_scope.cancel()
    kube.close()
