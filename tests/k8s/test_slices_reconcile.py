"""ResourceSlice reconciliation (behavior.md §6.4): the pure planner and cache check, the
backoff schedule, and SliceReconciler against the loopback API server through the real
kubernetes client.

Every test with a retry or backoff runs under ``MockClock(autojump_threshold=0)`` (the
``autojump_clock`` fixture): the reconciler's waits are Trio's, so the schedule is checked
through the recorded delays and nothing really sleeps. The API calls themselves are real
HTTP in worker threads, so no test asserts on the virtual time they take."""

from __future__ import annotations

import copy
import io
import json
import logging
import math
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from functools import cache, partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.k8s.client import KubeClient
from dracpu.k8s.slices import (
    Plan,
    SliceReconciler,
    SliceUpdate,
    cache_in_sync,
    plan_reconcile,
    slice_digest,
)
from dracpu.logs import setup_logging
from dracpu.topology import discover_from_root
from dracpu_sim.apiserver import SimAPIServer

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
    # No server-side timers: under the autojump clock a 60 s bookmark tick would fire
    # every time Trio waits for a worker thread.
    server = SimAPIServer(seed=5, bookmark_interval=math.inf, max_watch_seconds=math.inf)
    await nursery.start(server.serve)
    kube = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    yield server, kube
    kube.close()


def published(server: SimAPIServer) -> list[dict[str, Any]]:
    return sorted(
        server.list("resourceslices", field_selector=SELECTOR),
        key=lambda s: s["metadata"]["name"],
    )


class Sleeps:
    """The reconciler's ``sleep``: records each delay, then sleeps on Trio's clock."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await trio.sleep(seconds)


def reconciler(kube: KubeClient, want: list[dict[str, Any]], **kw: Any) -> SliceReconciler:
    """Resync off (only the watch or a trigger re-converges), no watch timeout, jitter
    pinned to the top of its range: delays are 0.5, 1, 2, 4, ... capped at 30."""
    kw.setdefault("resync_interval", math.inf)
    kw.setdefault("watch_timeout", None)
    kw.setdefault("rand", lambda: 1.0)
    return SliceReconciler(kube, node_name=NODE, desired=want, **kw)


class Loopback:
    """The loopback API server and its client, and reconcilers started on them in the
    test's nursery; ``sleeps`` records what those reconcilers waited."""

    def __init__(self, server: SimAPIServer, kube: KubeClient, nursery: trio.Nursery) -> None:
        self.server = server
        self.kube = kube
        self.nursery = nursery
        self.sleeps = Sleeps()

    def reconciler(self, want: list[dict[str, Any]], **kw: Any) -> SliceReconciler:
        """``reconciler(...)`` on this server, sleeping through ``sleeps``."""
        return reconciler(self.kube, want, sleep=self.sleeps, **kw)

    async def start(self, want: list[dict[str, Any]], **kw: Any) -> SliceReconciler:
        """A new ``reconciler``, running until the test ends; returns once its first sync
        succeeded."""
        r = self.reconciler(want, **kw)
        await self.nursery.start(r.run)
        return r


@pytest.fixture
async def loopback(
    sim: tuple[SimAPIServer, KubeClient], nursery: trio.Nursery
) -> AsyncIterator[Loopback]:
    server, kube = sim
    yield Loopback(server, kube, nursery)
    # Stop the reconcilers now: ``sim`` closes the client next.
    nursery.cancel_scope.cancel()


async def until(
    condition: Callable[[], bool],
    what: str,
    *,
    steps: int = 20_000,
    step: float = 0.05,
    real_seconds: float = 30.0,
) -> None:
    """Poll ``condition`` on Trio's clock (virtual under autojump: no real sleeping).

    Under autojump the polls take almost no real time, while the API calls they wait for
    run in worker threads in real time: on a loaded machine (a whole CI run on 2 cores)
    20,000 polls can end before one call does. So the polling also lasts ``real_seconds``.
    """
    deadline = time.monotonic() + real_seconds
    polls = 0
    while not condition():
        polls += 1
        if polls > steps and time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await trio.sleep(step)


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


# -- the cache check agrees with the planner ---------------------------------------------------


def _cases() -> list[tuple[str, list[dict[str, Any]], list[dict[str, Any]], int | None]]:
    want = desired("epyc-2s-768", "individual")
    same = existing_from(want, 3)
    changed = existing_from(want, 3)
    changed[2]["spec"]["devices"] = changed[2]["spec"]["devices"][:5]
    owner = existing_from(want, 3)
    owner[1]["metadata"]["ownerReferences"][0]["uid"] = "old"
    missing = existing_from(want, 3)[:-1]
    mixed = existing_from(want, 3)
    mixed[0]["spec"]["pool"]["generation"] = 2
    dup = [*existing_from(want, 3), copy.deepcopy(existing_from(want, 3)[0])]
    dup[-1]["metadata"]["name"] = "00000-dra.cpu-node-a-zzzzz"
    stray = [*existing_from(want, 3), copy.deepcopy(existing_from(want, 3)[0])]
    stray[-1]["metadata"]["name"] = "00009-dra.cpu-node-a-zzzzz"
    grouped = desired("epyc-2s-768", "grouped")
    return [
        ("unchanged", want, same, 3),
        ("unchanged, nothing written yet", want, same, None),
        ("older than the generation written", want, same, 4),
        ("content changed", want, changed, 3),
        ("owner changed", want, owner, 3),
        ("slice missing", want, missing, 3),
        ("two generations", want, mixed, 3),
        ("duplicate", want, dup, 3),
        ("stray index", want, stray, 3),
        ("nothing exists", want, [], None),
        ("other pool shape", grouped, same, 3),
        ("nothing desired, nothing there", [], [], 3),
        ("nothing desired, slices there", [], same, 3),
    ]


@pytest.mark.parametrize(("case", "want", "existing", "generation"), _cases())
def test_cache_in_sync_is_an_empty_plan(
    case: str, want: list[dict[str, Any]], existing: list[dict[str, Any]], generation: int | None
) -> None:
    digests = [d for d in (slice_digest(e) for e in existing) if d is not None]
    plan = plan_reconcile(want, existing, current_generation=generation)
    assert cache_in_sync(want, digests, current_generation=generation) == plan.empty, case


def test_slice_digest_ignores_server_metadata_and_generation() -> None:
    want = desired("xeon-2s-ht", "grouped")
    a, b = existing_from(want, 1)[0], existing_from(want, 7)[0]
    b["metadata"]["resourceVersion"] = "99"
    b["metadata"]["managedFields"] = [{"manager": "x"}]
    da, db = slice_digest(a), slice_digest(b)
    assert da is not None and db is not None
    assert da.content == db.content
    assert (da.generation, db.generation, db.resource_version) == (1, 7, "99")
    b["spec"]["devices"] = []
    assert slice_digest(b).content != da.content  # type: ignore[union-attr]
    assert slice_digest({"spec": {}}) is None


# -- backoff schedule ------------------------------------------------------------------------


def test_retry_delays_are_the_shared_backoff_and_honour_retry_after() -> None:
    def delays(rand: float, retry_after: float | None, attempts: int = 9) -> list[float]:
        r = SliceReconciler(None, node_name=NODE, desired=[], rand=lambda: rand)  # type: ignore[arg-type]
        return [r._retry_delay(a, retry_after) for a in range(attempts)]

    assert delays(1.0, None) == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert delays(0.0, None, 4)[3] == 2.0
    assert delays(0.5, None, 10_001)[10_000] == 22.5
    # Retry-After: never sooner than asked, spread over one more interval, capped at 30 s
    assert delays(0.0, 1.0, 3) == [1.0, 1.0, 1.0]
    assert delays(0.5, 1.0, 4) == [1.5, 1.5, 1.5, 3.0]
    assert delays(0.5, 600.0, 1) == [45.0]


class FlakyReconciler(SliceReconciler):
    """No API at all: ``sync_once`` fails ``failures`` times, recording when it ran."""

    def __init__(self, failures: int) -> None:
        super().__init__(None, node_name=NODE, desired=[], rand=lambda: 1.0, watch=False)  # type: ignore[arg-type]
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


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"resync_interval": 0}, "resync interval must be > 0 seconds, got 0"),
        (
            {"backoff_base": 2.0, "backoff_cap": 1.0},
            "backoff must satisfy 0 < base <= cap, got base 2.0, cap 1.0",
        ),
        ({"watch_timeout": 0.5}, "watch timeout must be >= 1 second, got 0.5"),
        ({"watch_idle_timeout": 0.5}, "watch idle timeout must be >= 1 second, got 0.5"),
        ({"reconnect_spread": -1}, "reconnect spread must be >= 0 seconds, got -1"),
    ],
)
def test_constructor_rejects_bad_settings(settings: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError) as info:
        SliceReconciler(None, node_name=NODE, desired=[], **settings)  # type: ignore[arg-type]
    assert str(info.value) == message


# -- publication against the loopback server -------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "mode", "group_by", "count"),
    [
        ("xeon-2s-ht", "individual", "numanode", 1),
        ("xeon-2s-ht", "grouped", "numanode", 1),
        ("xeon-snc", "grouped", "numanode", 1),
        ("epyc-nps4", "grouped", "socket", 1),
        ("epyc-nps1", "individual", "numanode", 1),
        ("intel-hybrid", "individual", "numanode", 1),
        ("arm-server", "grouped", "numanode", 1),
        ("offline-holes", "individual", "numanode", 1),
        ("vm-1cpu", "grouped", "machine", 1),
        ("epyc-2s-768", "individual", "numanode", 6),
        ("epyc-2s-768", "grouped", "machine", 1),
    ],
)
async def test_publishes_pool(
    loopback: Loopback, fixture: str, mode: str, group_by: str, count: int
) -> None:
    server = loopback.server
    want = desired(fixture, mode, group_by)
    assert len(want) == count
    r = loopback.reconciler(want, watch=False)
    assert not r.is_published
    await loopback.nursery.start(r.run)
    assert r.is_published
    assert r.generation == 1
    assert_matches(server, want, 1)
    assert r.api_calls == 1 + count
    assert server.calls.get("create", "resourceslices") == count


async def test_768cpu_individual_with_pcie_roots_is_twelve_slices(loopback: Loopback) -> None:
    server = loopback.server
    topo = discover_from_root(FAKE / "epyc-2s-768")
    inv = build_inventory(topo, DeviceSettings(mode="individual"))
    want = build_slices(inv, node_name=NODE, node_uid=UID, expose_pcie_roots=True)
    await loopback.start(want, watch=False)
    assert len(published(server)) == 12
    assert all(len(s["spec"]["devices"]) == 64 for s in published(server))
    assert_matches(server, want, 1)


async def test_restart_changes_nothing(loopback: Loopback) -> None:
    server = loopback.server
    want = desired("epyc-2s-768", "individual")
    async with trio.open_nursery() as inner:
        await inner.start(loopback.reconciler(want, watch=False).run)
        inner.cancel_scope.cancel()
    before = published(server)
    server.calls.reset()
    second = await loopback.start(want, watch=False)
    assert second.generation == 1
    assert published(server) == before
    assert server.calls.snapshot() == {"list resourceslices": 1}
    assert second.api_calls == 1


async def test_content_change_bumps_generation(loopback: Loopback) -> None:
    server = loopback.server
    first = desired("epyc-2s-768", "individual")
    r = await loopback.start(first)
    names = [s["metadata"]["name"] for s in published(server)]
    topo = discover_from_root(FAKE / "epyc-2s-768")
    inv = build_inventory(topo, DeviceSettings(mode="individual", publish_node_allocatable=True))
    second = build_slices(inv, node_name=NODE, node_uid=UID, expose_pcie_roots=False)
    r.set_desired(second)
    await r.wait_next_sync()
    assert r.generation == 2
    assert r.sync_reasons["desired"] == 1
    assert_matches(server, second, 2)
    # rewritten in place: same objects, no delete/create churn
    assert [s["metadata"]["name"] for s in published(server)] == names


async def test_shrinking_pool_deletes_extra_slices(loopback: Loopback) -> None:
    server = loopback.server
    r = await loopback.start(desired("epyc-2s-768", "individual"))
    grouped = desired("epyc-2s-768", "grouped", "socket")
    r.set_desired(grouped)
    await r.wait_next_sync()
    # index 0 changed (1 slice): updated in place at the same generation, 5 deleted
    assert r.generation == 1
    assert_matches(server, grouped, 1)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
async def test_kubectl_sees_the_published_pool(loopback: Loopback, tmp_path: Path) -> None:
    server = loopback.server
    await loopback.start(desired("epyc-2s-768", "individual"), watch=False)
    kubeconfig = server.write_kubeconfig(tmp_path / "kc-kubectl")
    env = {**os.environ, "HOME": str(tmp_path), "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    command = [
        "kubectl",
        "--kubeconfig",
        str(kubeconfig),
        "--cache-dir",
        str(tmp_path / "cache"),
        "get",
        "resourceslices",
        "--field-selector",
        f"spec.nodeName={NODE}",
        "-o",
        "json",
    ]
    result = await trio.to_thread.run_sync(
        lambda: subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    )
    assert result.returncode == 0, result.stderr
    items = json.loads(result.stdout)["items"]
    assert sorted(i["metadata"]["name"] for i in items) == [
        s["metadata"]["name"] for s in published(server)
    ]
    assert {i["spec"]["pool"]["generation"] for i in items} == {1}
    assert sum(len(i["spec"]["devices"]) for i in items) == 768


# -- retries, under the autojump clock -------------------------------------------------------


@pytest.mark.parametrize(
    ("verb", "status", "drop", "errors", "delays", "calls"),
    [
        # each failed create fails the whole sync, which lists again and starts over
        ("create", 409, False, 5, [0.5, 1.0, 2.0, 4.0, 8.0], 11),
        ("create", 500, False, 5, [0.5, 1.0, 2.0, 4.0, 8.0], 11),
        # Retry-After: 1, spread into [1, 2) s, is honoured when longer than the backoff
        ("list", 429, False, 5, [2.0, 2.0, 2.0, 4.0, 8.0], 6),
        ("list", 503, False, 5, [0.5, 1.0, 2.0, 4.0, 8.0], 6),
        # a POST whose connection drops is not retried by urllib3 (it may have happened)
        ("create", 0, True, 5, [0.5, 1.0, 2.0, 4.0, 8.0], 11),
        # a GET is: the first sync uses up 4 drops (1 + 3 immediate urllib3 retries)
        ("list", 0, True, 1, [0.5], 6),
    ],
)
async def test_survives_fault_storm(
    autojump_clock: trio.testing.MockClock,
    loopback: Loopback,
    verb: str,
    status: int,
    drop: bool,
    errors: int,
    delays: list[float],
    calls: int,
) -> None:
    server = loopback.server
    want = desired("epyc-2s-768", "individual")
    server.faults.inject(verb, "resourceslices", 5, status=status or 500, drop_connection=drop)
    r = await loopback.start(want, watch=False)
    assert server.faults.pending() == 0
    assert (r.errors, loopback.sleeps.delays) == (errors, delays)
    assert server.calls.get(verb, "resourceslices") == calls
    assert r.last_error is None
    assert r.generation == 1
    assert_matches(server, want, 1)


async def test_update_conflict_is_retried(
    autojump_clock: trio.testing.MockClock, loopback: Loopback
) -> None:
    server = loopback.server
    want = desired("epyc-2s-768", "individual")
    r = await loopback.start(want, watch=False)
    obj = published(server)[0]
    obj["spec"]["devices"] = []
    server.update("resourceslices", obj)
    server.faults.inject("update", "resourceslices", 3, status=409)
    r.trigger()
    await r.wait_next_sync()
    assert (r.errors, loopback.sleeps.delays) == (3, [0.5, 1.0, 2.0])
    assert server.calls.get("update", "resourceslices") == 4
    assert r.sync_reasons == {"start": 1, "trigger": 1}
    assert r.generation == 1
    assert_matches(server, want, 1)


async def test_delete_failures_are_retried_and_the_stray_removed(
    autojump_clock: trio.testing.MockClock, loopback: Loopback
) -> None:
    server = loopback.server
    want = desired("xeon-2s-ht", "individual")
    stray = copy.deepcopy(want[0])
    stray["metadata"]["generateName"] = "00003-dra.cpu-node-a-"
    server.create("resourceslices", stray)
    server.faults.inject("delete", "resourceslices", 2, status=500)
    r = await loopback.start(want, watch=False)
    assert (r.errors, loopback.sleeps.delays) == (2, [0.5, 1.0])
    # the stray held generation 1 of the pool, so the new slice is generation 2
    assert_matches(server, want, 2)


async def test_backoff_reaches_the_cap_and_readiness_waits(
    autojump_clock: trio.testing.MockClock, loopback: Loopback
) -> None:
    loopback.server.faults.inject("list", "resourceslices", 9, status=500)
    r = loopback.reconciler(desired("xeon-2s-ht", "individual"), watch=False)
    loopback.nursery.start_soon(r.run)  # started only once published
    await until(lambda: r.errors == 3, "three failed syncs")
    assert not r.is_published
    assert r.last_error == "Internal error occurred: injected fault"
    assert r.status()["published"] is False
    await r.wait_published()
    assert loopback.sleeps.delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert r.status()["failedSyncs"] == 9


async def test_unreachable_server_never_raises(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path
) -> None:
    # a port nobody listens on: run keeps retrying and never raises
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = SimAPIServer()
    server.port = port
    kube = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kc")))
    sleeps = Sleeps()
    r = reconciler(kube, desired("xeon-2s-ht", "individual"), sleep=sleeps)
    nursery.start_soon(r.run)
    await until(lambda: r.errors >= 4, "four failed syncs")
    assert sleeps.delays[:3] == [0.5, 1.0, 2.0]
    assert r.last_error is not None
    assert r.last_error.startswith("connection to the API server failed: ")
    assert not r.is_published
    assert r.generation is None
    nursery.cancel_scope.cancel()
    kube.close()


# -- re-converging from the watch ------------------------------------------------------------


async def watching(server: SimAPIServer, r: SliceReconciler) -> None:
    await until(lambda: r.watch_connected and len(server.connections.watches) == 1, "a watch")


async def test_own_writes_do_not_wake_the_reconciler(
    autojump_clock: trio.testing.MockClock, loopback: Loopback
) -> None:
    server = loopback.server
    # pre-existing stale pool: the first sync deletes 1, creates 6; every event is ours
    old = copy.deepcopy(desired("xeon-2s-ht", "individual")[0])
    old["spec"]["pool"]["generation"] = 1
    old["metadata"]["generateName"] = "00009-dra.cpu-node-a-"
    server.create("resourceslices", old)
    r = await loopback.start(desired("epyc-2s-768", "individual"))
    await watching(server, r)
    # the watch started from the list's version and so sees all 7 writes
    await until(lambda: r.watch_events == 7, "our 7 writes seen")
    await trio.testing.wait_all_tasks_blocked()
    assert r.sync_reasons == {"start": 1}
    assert r.external_changes == 0
    assert r.api_calls == 8


def _delete_one(server: SimAPIServer, want: list[dict[str, Any]]) -> None:
    server.delete("resourceslices", published(server)[3]["metadata"]["name"])


def _edit_one(server: SimAPIServer, want: list[dict[str, Any]]) -> None:
    obj = published(server)[1]
    obj["spec"]["devices"] = obj["spec"]["devices"][:1]
    server.update("resourceslices", obj)


def _add_stray(server: SimAPIServer, want: list[dict[str, Any]]) -> None:
    stray = copy.deepcopy(want[0])
    stray["metadata"]["generateName"] = "00007-dra.cpu-node-a-"
    server.create("resourceslices", stray)


@pytest.mark.parametrize(
    ("change", "generation", "repair_writes"),
    [
        # a missing slice means a new one: generation bumped, all 6 rewritten
        pytest.param(_delete_one, 2, 6, id="a slice deleted"),
        # fixed in place at the same generation
        pytest.param(_edit_one, 1, 1, id="a slice edited"),
        # a slice added into our pool: deleted
        pytest.param(_add_stray, 1, 1, id="a stray slice added"),
    ],
)
async def test_an_external_change_is_repaired_by_the_watch(
    autojump_clock: trio.testing.MockClock,
    loopback: Loopback,
    change: Callable[[SimAPIServer, list[dict[str, Any]]], None],
    generation: int,
    repair_writes: int,
) -> None:
    server = loopback.server
    want = desired("epyc-2s-768", "individual")
    # no periodic resync at all: only the watch can notice the change
    r = await loopback.start(want)
    await watching(server, r)
    await until(lambda: r.watch_events == 6, "our creates seen")
    before = {s["metadata"]["name"] for s in published(server)}
    change(server, want)
    await r.wait_next_sync()
    assert r.sync_reasons == {"start": 1, "watch": 1}
    assert r.external_changes == 1
    assert r.generation == generation
    assert_matches(server, want, generation)
    if generation == 1:  # repaired in place: the same objects
        assert {s["metadata"]["name"] for s in published(server)} == before
    # the repair's own writes come back on the watch and change nothing
    await until(lambda: r.watch_events == 6 + 1 + repair_writes, "the repair's events")
    await trio.testing.wait_all_tasks_blocked()
    assert r.sync_reasons == {"start": 1, "watch": 1}
    assert r.external_changes == 1


async def test_kubelet_wipe_repaired_by_watch(
    autojump_clock: trio.testing.MockClock, loopback: Loopback
) -> None:
    server = loopback.server
    want = desired("epyc-2s-768", "individual")
    r = await loopback.start(want)
    await watching(server, r)
    # the kubelet wipes the node's slices (plugin gone, or kubelet restart)
    for s in published(server):
        server.delete("resourceslices", s["metadata"]["name"])
    await until(lambda: len(published(server)) == 6 and r.generation == 2, "the pool republished")
    assert_matches(server, want, 2)
    assert r.sync_reasons["watch"] >= 1


async def test_watch_410_in_the_stream_relists(
    autojump_clock: trio.testing.MockClock, loopback: Loopback
) -> None:
    server = loopback.server
    want = desired("epyc-2s-768", "individual")
    r = await loopback.start(want)
    await watching(server, r)
    await until(lambda: r.watch_events == 6, "our creates seen")
    # history compacted while the watch is down: resuming from its version is 410
    for _ in range(3):
        server.create(
            "resourceslices",
            copy.deepcopy(desired("xeon-2s-ht", "individual")[0])
            | {
                "metadata": {"generateName": "other-"},
                "spec": {
                    **want[0]["spec"],
                    "nodeName": "node-b",
                    "pool": {"name": "node-b", "generation": 1, "resourceSliceCount": 1},
                },
            },
        )
    server.store.compact()
    assert server.end_watches() == 1
    await until(lambda: r.relists == 1 and r.sync_reasons["relist"] == 1, "a relist")
    await watching(server, r)
    assert r.generation == 1
    # the new watch works: a deletion is still repaired without any resync
    server.delete("resourceslices", published(server)[0]["metadata"]["name"])
    await until(lambda: r.sync_reasons["watch"] == 1 and len(published(server)) == 6, "repair")
    await trio.testing.wait_all_tasks_blocked()
    assert_matches(server, want, 2)


@pytest.mark.parametrize(
    ("refusals", "spread", "delays", "watch_errors", "relists", "sync_reasons"),
    [
        # 410 Gone: the version is too old; relist after a random part of the spread
        ([(410, 1)], 3.0, [3.0], 0, 1, {"start": 1, "relist": 1}),
        # Retry-After: 1 spread to the top of [1, 2); the backoff alone would be 0.5, 1.0
        ([(429, 2)], 5.0, [2.0, 2.0], 2, 0, {"start": 1}),
        # server errors back off, whatever the code
        ([(500, 3), (503, 1)], 5.0, [0.5, 1.0, 2.0, 4.0], 4, 0, {"start": 1}),
    ],
    ids=["410 relists", "429 waits for Retry-After", "5xx back off"],
)
async def test_a_refused_watch_request(
    autojump_clock: trio.testing.MockClock,
    loopback: Loopback,
    refusals: list[tuple[int, int]],
    spread: float,
    delays: list[float],
    watch_errors: int,
    relists: int,
    sync_reasons: dict[str, int],
) -> None:
    server = loopback.server
    for status, count in refusals:
        server.faults.inject("watch", "resourceslices", count, status=status)
    r = await loopback.start(desired("xeon-2s-ht", "individual"), reconnect_spread=spread)
    requests = 1 + sum(count for _, count in refusals)
    await until(lambda: r.watch_requests == requests, "the watch opened again")
    await watching(server, r)
    assert loopback.sleeps.delays == delays
    assert (r.watch_errors, r.relists, r.sync_reasons) == (watch_errors, relists, sync_reasons)
    assert server.calls.get("list", "resourceslices") == 1 + relists


async def test_periodic_resync_answers_from_the_cache_while_watching(
    autojump_clock: trio.testing.MockClock, loopback: Loopback
) -> None:
    """As an informer's resync: no API call at rest, whatever the interval."""
    server = loopback.server
    want = desired("epyc-2s-768", "individual")
    r = await loopback.start(want, resync_interval=5.0)
    await until(lambda: r.watch_streaming and r.watch_events == 6, "our creates seen")
    lists, resyncs = server.calls.get("list", "resourceslices"), r.cache_resyncs
    await trio.sleep(120)
    assert r.cache_resyncs >= resyncs + 20
    assert server.calls.get("list", "resourceslices") == lists
    assert server.calls.get("watch", "resourceslices") == 1
    # an external change still converges, through the watch, and the cache follows
    server.delete("resourceslices", published(server)[1]["metadata"]["name"])
    await until(lambda: r.generation == 2 and r.cache_in_sync(), "repaired, cache current")
    assert r.sync_reasons["watch"] == 1
    assert_matches(server, want, 2)


async def test_periodic_resync_lists_without_a_watch(
    autojump_clock: trio.testing.MockClock, loopback: Loopback
) -> None:
    server = loopback.server
    r = await loopback.start(desired("xeon-2s-ht", "grouped"), resync_interval=5.0, watch=False)
    await until(lambda: server.calls.get("list", "resourceslices") >= 5, "four resyncs")
    assert r.cache_resyncs == 0
    assert r.sync_reasons["resync"] >= 4


async def test_a_failed_resync_is_not_retried_until_the_next_interval(
    autojump_clock: trio.testing.MockClock, loopback: Loopback
) -> None:
    server = loopback.server
    r = await loopback.start(desired("xeon-2s-ht", "grouped"), resync_interval=10.0, watch=False)
    server.faults.inject("list", "resourceslices", 1, status=503)
    await until(lambda: r.sync_reasons["resync"] == 2, "two resyncs")
    await until(lambda: r.last_error is None, "the second one succeeded")
    assert (r.errors, loopback.sleeps.delays) == (1, [])


async def test_dropped_watch_resumes_without_losing_events(
    autojump_clock: trio.testing.MockClock, loopback: Loopback
) -> None:
    server = loopback.server
    want = desired("epyc-2s-768", "individual")
    r = await loopback.start(want)
    await watching(server, r)
    await until(lambda: r.watch_events == 6, "our creates seen")
    # The next 4 watch requests are dropped too: urllib3 retries the GET 3 times at
    # once, so one reconnect fails.
    server.faults.inject("watch", "resourceslices", 4, drop_connection=True)
    assert server.end_watches(drop=True) == 1
    await until(lambda: r.watch_errors == 1, "the dropped stream noticed")
    assert not r.watch_connected
    # deleted while no watch is open: resuming from the last version replays it
    server.delete("resourceslices", published(server)[2]["metadata"]["name"])
    await until(lambda: r.sync_reasons["watch"] == 1, "the repair")
    await until(lambda: len(published(server)) == 6, "6 slices")
    assert r.watch_errors == 2  # the dropped stream, then the dropped reconnect
    # the open stream broke: reconnect within the spread (5 s, rand pinned to the top);
    # that reconnect failed before any answer: the backoff
    assert loopback.sleeps.delays == [5.0, 0.5]
    assert r.relists == 0
    assert server.faults.pending() == 0
    await trio.testing.wait_all_tasks_blocked()
    assert_matches(server, want, 2)


async def test_resync_converges_when_the_watch_is_unavailable(
    autojump_clock: trio.testing.MockClock, loopback: Loopback
) -> None:
    server = loopback.server
    server.faults.inject("watch", "resourceslices", 10_000, status=403)
    want = desired("epyc-2s-768", "individual")
    r = await loopback.start(want, resync_interval=5.0)
    await until(lambda: r.watch_errors >= 3, "watch failures")
    server.delete("resourceslices", published(server)[0]["metadata"]["name"])
    await until(lambda: len(published(server)) == 6, "the periodic resync repairs")
    assert r.sync_reasons["resync"] >= 1
    assert "watch" not in r.sync_reasons
    assert r.status()["watch"]["connected"] is False
    assert r.status()["watch"]["state"] == "refused"
    assert_matches(server, want, 2)


async def test_clean_shutdown_leaves_slices_and_ends_the_watch_thread(
    autojump_clock: trio.testing.MockClock, loopback: Loopback
) -> None:
    server = loopback.server
    want = desired("epyc-2s-768", "individual")
    r = loopback.reconciler(want)
    async with trio.open_nursery() as inner:
        await inner.start(r.run)
        await watching(server, r)
        assert r.watch_stream is not None
        assert not r.watch_stream.exited.is_set()
        # no server-side timeout on this watch: only the cancellation can end it
        inner.cancel_scope.cancel()
    assert await trio.to_thread.run_sync(r.watch_stream.exited.wait, 10)
    await until(lambda: server.store.watcher_count == 0, "the server sees the close")
    assert server.calls.get("delete", "resourceslices") == 0
    assert_matches(server, want, 1)


async def test_server_ended_watches_are_renewed_at_once(
    autojump_clock: trio.testing.MockClock, loopback: Loopback
) -> None:
    server = loopback.server
    want = desired("epyc-2s-768", "individual")
    # timeoutSeconds = watch_timeout * (1 + rand) = 60: the server ends each watch then
    r = await loopback.start(want, watch_timeout=30.0)
    await until(lambda: r.watch_requests >= 3, "two renewals", step=1.0)
    assert (r.watch_errors, loopback.sleeps.delays, r.relists) == (0, [], 0)
    await watching(server, r)
    server.delete("resourceslices", published(server)[5]["metadata"]["name"])
    await until(lambda: r.sync_reasons["watch"] == 1 and r.generation == 2, "the repair")
    assert_matches(server, want, 2)


async def test_each_publication_carries_one_operation_id(
    sim: tuple[SimAPIServer, KubeClient],
) -> None:
    """behavior.md §16.1: every line of one PublishResources shares an opID, first line
    `begin: ...`, last line `end: ...`."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    out = io.StringIO()
    setup_logging("json", 4, out)
    try:
        _, kube = sim
        await reconciler(kube, desired("xeon-2s-ht", "grouped")).sync_once()
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    ours = [line for line in lines if "opID" in line]
    assert ours[0]["msg"] == "begin: PublishResources"
    assert ours[-1]["msg"] == "end: PublishResources"
    assert any(x["msg"].startswith("resourceslices: generation 1, 1 created") for x in ours)
    assert len({x["opID"] for x in ours}) == 1


async def test_a_silent_watch_ends_after_the_idle_timeout(loopback: Loopback) -> None:
    """No bookmark, no event: after ``watch_idle_timeout`` the watch is assumed dead and
    opened again from its version (real clock: the read timeout is the socket's)."""
    r = await loopback.start(
        desired("xeon-2s-ht", "grouped"), watch_idle_timeout=1.0, reconnect_spread=0
    )
    with trio.fail_after(20):
        while r.watch_requests < 3:
            await trio.sleep(0.05)
    assert r.watch_errors >= 2
    assert r.relists == 0
    assert loopback.server.calls.get("list", "resourceslices") == 1


async def test_api_server_restart_costs_one_relist_and_no_resync(
    autojump_clock: trio.testing.MockClock, loopback: Loopback
) -> None:
    """Down for a minute (longer than two resync intervals): the resync leaves the
    recovery to the watch, which relists once when the server is back."""
    server = loopback.server
    want = desired("epyc-2s-768", "individual")
    r = await loopback.start(want, resync_interval=20.0, reconnect_spread=2.0)
    await until(lambda: r.watch_streaming, "watching")
    port = server.port or 0
    server.stop()
    server.delete("resourceslices", published(server)[3]["metadata"]["name"])
    server.store.compact()  # the restarted server's watch cache starts now
    await until(lambda: r.watch_errors >= 2, "the broken stream and a refused reconnect")
    await trio.sleep(60)
    assert "resync" not in r.sync_reasons
    assert r.status()["watch"]["state"] == "unreachable"
    await loopback.nursery.start(partial(server.serve, port=port))
    await until(lambda: r.watch_streaming and r.generation == 2, "relisted, repaired, watching")
    assert r.relists == 1
    assert r.sync_reasons == {"start": 1, "relist": 1}
    assert server.calls.get("list", "resourceslices") == 2
    assert_matches(server, want, 2)
