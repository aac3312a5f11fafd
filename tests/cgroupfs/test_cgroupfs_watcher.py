"""The drift watcher on fake trees: compare, repair, confine unknowns, timers and inotify."""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable
from pathlib import Path

import msgspec
import pytest
import trio
import trio.testing
from cgroup_trees import FakeView, check, intent, make_cgroup, read, v1_root, v2_root
from prometheus_client import CollectorRegistry

from dracpu.cgroupfs.drift import DriftReport, container_id_of, find_drift, is_container_dir
from dracpu.cgroupfs.inotify import IN_CREATE, IN_MODIFY, decode_events, open_inotify
from dracpu.cgroupfs.watcher import DriftWatcher
from dracpu.cgroupfs.writer import CgroupWriter, DriftRepair, RepairResults
from dracpu.cpuset import CPUSet
from dracpu.messages import ContainerIntent
from dracpu.metrics import DriverMetrics


class TreeView(FakeView):
    """The owner's view of a ``Tree``: its ``intents`` and ``pool`` as they are now."""

    def __init__(self, tree: Tree) -> None:
        super().__init__()
        self.tree = tree

    def intents(self) -> list[ContainerIntent]:
        self.set(self.tree.intents)
        return super().intents()

    def intents_of(self, ids: Iterable[str]) -> dict[str, ContainerIntent]:
        self.set(self.tree.intents)
        return super().intents_of(ids)

    @property
    def shared_pool(self) -> CPUSet:
        return CPUSet.parse(self.tree.pool)


class Tree:
    """A v1 cgroupfs-driver tree with containers c0..c{n-1}, each in its own pod."""

    def __init__(self, tmp: Path, n: int = 3, cpus: str = "0-1") -> None:
        self.root = v1_root(tmp)
        self.h = self.root / "cpuset"
        make_cgroup(self.h, "kubepods")
        self.intents = [intent(f"c{i}", pod=f"u{i}", cpus=cpus) for i in range(n)]
        for it in self.intents:
            make_cgroup(self.h, it.cgroups_path, cpus=cpus)
        self.pool = "2-7"
        self.registry = CollectorRegistry()
        self.metrics = DriverMetrics(self.registry)
        self.view = TreeView(self)

    def leaf(self, i: int) -> Path:
        return self.h / self.intents[i].cgroups_path.lstrip("/")

    def watcher(self, *, offload: bool = True, **kwargs: object) -> DriftWatcher:
        return DriftWatcher(
            CgroupWriter(str(self.root), offload=offload),
            self.view,
            metrics=self.metrics,
            offload=offload,
            **kwargs,  # type: ignore[arg-type]
        )

    def check(self, watcher: DriftWatcher) -> DriftReport:
        return check(watcher, self.view)

    def sample(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        assert value is not None
        return value


# -- pure parts ---------------------------------------------------------------------------
def test_find_drift_compares_sets_not_strings() -> None:
    a = intent("a", cpus="0,1")
    b = intent("b", cpus="2")
    gone = intent("gone", cpus="3")
    eff = {"a": CPUSet.parse("0-1"), "b": CPUSet.parse("2-3")}
    assert find_drift([a, b, gone], eff) == [b]


@pytest.mark.parametrize(
    ("parent", "name", "expected"),
    [
        ("poduid", "abcd", True),
        ("kubepods-burstable-podx.slice", "cri-containerd-abcd.scope", True),
        ("kubepods", "poduid", False),
        ("kubepods", "besteffort", False),
        ("kubepods-burstable.slice", "kubepods-burstable-podx.slice", False),
        ("poduid", "nested.slice", False),
    ],
)
def test_is_container_dir(parent: str, name: str, expected: bool) -> None:
    assert is_container_dir(parent, name) is expected


@pytest.mark.parametrize(
    ("leaf", "cid"),
    [("abc123", "abc123"), ("cri-containerd-abc123.scope", "abc123"), ("crio-ff.scope", "ff")],
)
def test_container_id_of(leaf: str, cid: str) -> None:
    assert container_id_of(leaf) == cid


def test_decode_inotify_events() -> None:
    buf = struct.pack("iIII", 1, IN_MODIFY, 0, 16) + b"cpuset.cpus\0\0\0\0\0"
    buf += struct.pack("iIII", 2, IN_CREATE, 0, 0)
    events = decode_events(buf)
    assert [(e.wd, e.mask, e.name) for e in events] == [
        (1, IN_MODIFY, "cpuset.cpus"),
        (2, IN_CREATE, ""),
    ]


def test_interval_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="drift check interval must be positive, got 0"):
        Tree(tmp_path).watcher(interval=0)


# -- one check -----------------------------------------------------------------------------
def test_clean_tree_has_no_drift(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    w = tree.watcher()
    report = tree.check(w)
    assert report == DriftReport(checked=3)
    assert w.last_report is report
    assert tree.sample("dracpu_cgroup_drifted_containers") == 0


def test_drift_is_repaired_and_counted(tmp_path: Path) -> None:
    tree = Tree(tmp_path, n=4)
    (tree.leaf(1) / "cpuset.cpus").write_text("0-7\n")
    (tree.leaf(3) / "cpuset.cpus").write_text("5\n")
    w = tree.watcher()
    report = tree.check(w)
    assert (report.checked, report.drifted, report.repaired, report.errors) == (4, 2, 2, 0)
    assert read(tree.leaf(1) / "cpuset.cpus") == "0-1"
    assert read(tree.leaf(3) / "cpuset.cpus") == "0-1"
    assert tree.sample("dracpu_cgroup_drifted_containers") == 2
    assert tree.sample("dracpu_cgroup_drift_repairs_total", result="success") == 2
    fallback = "dracpu_cgroup_fallback_writes_total"
    assert tree.sample(fallback, result="success", cause="drift") == 2
    assert tree.sample(fallback, result="success", cause="verify-mismatch") == 0
    again = tree.check(w)
    assert (again.drifted, again.repaired) == (0, 0)
    assert tree.sample("dracpu_cgroup_drifted_containers") == 0


def test_intent_change_is_applied_as_drift(tmp_path: Path) -> None:
    tree = Tree(tmp_path, n=2)
    w = tree.watcher()
    tree.intents[0] = intent("c0", pod="u0", cpus="6-7")
    report = tree.check(w)
    assert (report.drifted, report.repaired) == (1, 1)
    assert read(tree.leaf(0) / "cpuset.cpus") == "6-7"


def test_vanished_container_is_missing_not_an_error(tmp_path: Path) -> None:
    tree = Tree(tmp_path, n=2)
    for f in tree.leaf(1).iterdir():
        f.unlink()
    tree.leaf(1).rmdir()
    report = tree.check(tree.watcher())
    assert (report.checked, report.missing, report.errors) == (1, 1, 0)


def test_failed_repair_is_an_error_and_others_continue(tmp_path: Path) -> None:
    tree = Tree(tmp_path, n=3)
    (tree.leaf(0) / "cpuset.cpus").write_text("7\n")
    (tree.leaf(1) / "cpuset.effective_cpus").write_text("0-7\n")  # stuck effective set
    (tree.leaf(2) / "cpuset.cpus").write_text("7\n")
    report = tree.check(tree.watcher())
    assert (report.drifted, report.repaired, report.errors) == (3, 2, 1)
    assert report.error_messages == (
        f"container c1: {tree.leaf(1)}: effective cpus '0-7' differ from intended '0-1'",
    )
    assert tree.sample("dracpu_cgroup_drift_repairs_total", result="error") == 1


def test_unparsable_state_is_reported(tmp_path: Path) -> None:
    tree = Tree(tmp_path, n=2)
    (tree.leaf(0) / "cpuset.cpus").write_text("zz\n")
    tree.intents.append(ContainerIntent(container_id="x", cgroups_path="/../up", cpus="1"))
    report = tree.check(tree.watcher())
    assert report.errors == 2
    assert report.error_messages[0].startswith(
        f"container c0: {tree.leaf(0)}/cpuset.cpus: EINVAL (unparsable content"
    )
    assert report.error_messages[1] == (
        "container x: cgroups path '/../up' escapes the cgroup root through '..'"
    )


# -- unknown containers -------------------------------------------------------------------
def test_unknown_containers_are_confined_to_the_shared_pool(tmp_path: Path) -> None:
    tree = Tree(tmp_path, n=2)
    new_cgroupfs = make_cgroup(tree.h, "kubepods/burstable/podnew/n1", cpus="0-7")
    on_pool = make_cgroup(tree.h, "kubepods/burstable/podnew/n2", cpus="2-7")
    systemd = make_cgroup(
        tree.h, "kubepods.slice/kubepods-podq.slice/cri-containerd-q1.scope", cpus="0-7"
    )
    empty_pod = make_cgroup(tree.h, "kubepods/besteffort/podempty", cpus="0-7")
    qos = make_cgroup(tree.h, "kubepods/guaranteed", cpus="0-7")
    w = tree.watcher()
    report = tree.check(w)
    assert (report.checked, report.drifted) == (2, 0)
    assert (report.unknown_found, report.unknown_confined) == (2, 2)
    assert read(new_cgroupfs / "cpuset.cpus") == "2-7"
    assert read(systemd / "cpuset.cpus") == "2-7"
    assert read(on_pool / "cpuset.cpus") == "2-7"
    assert read(empty_pod / "cpuset.cpus") == "0-7"  # a pod level, not a container
    assert read(qos / "cpuset.cpus") == "0-7"
    for i in range(2):
        assert read(tree.leaf(i) / "cpuset.cpus") == "0-1"  # known: left to their intent
    assert tree.sample("dracpu_cgroup_drift_repairs_total", result="success") == 2
    assert tree.check(w).unknown_found == 0


def test_known_sandboxes_are_kept_and_unknown_ones_confined(tmp_path: Path) -> None:
    # Sandboxes the runtime reported are intents (kept on the pool under their own cause);
    # a sandbox nobody reported is a stranger like any other container cgroup.
    tree = Tree(tmp_path, n=1)
    known = make_cgroup(tree.h, "kubepods/podu0/sb0", cpus="0-7")
    tree.intents.append(
        msgspec.structs.replace(
            intent("sb0", pod="u0", cpus=tree.pool),
            cgroups_path="/kubepods/podu0/sb0",
            sandbox=True,
        )
    )
    unreported = make_cgroup(
        tree.h, "kubepods.slice/kubepods-podq.slice/cri-containerd-sb1.scope", cpus="0-7"
    )
    report = tree.check(tree.watcher())
    assert (report.unknown_confined, report.repaired) == (1, 0)
    assert read(known / "cpuset.cpus") == read(unreported / "cpuset.cpus") == "2-7"
    assert tree.sample("dracpu_cgroup_fallback_writes_total", result="success", cause="sandbox")


def test_unknown_follow_the_pool_when_it_changes(tmp_path: Path) -> None:
    tree = Tree(tmp_path, n=1)
    new = make_cgroup(tree.h, "kubepods/podnew/n1", cpus="0-7")
    w = tree.watcher()
    tree.check(w)
    tree.pool = "4-7"
    assert tree.check(w).unknown_confined == 1
    assert read(new / "cpuset.cpus") == "4-7"


def test_empty_pool_confines_nothing_and_says_why(tmp_path: Path) -> None:
    tree = Tree(tmp_path, n=1)
    tree.pool = ""
    new = make_cgroup(tree.h, "kubepods/podnew/n1", cpus="0-7")
    report = tree.check(tree.watcher())
    assert report.unknown_confined == 0
    assert report.error_messages == (
        f"{new}: unknown container not confined: shared pool is empty",
    )


def test_v2_systemd_tree(tmp_path: Path) -> None:
    root = v2_root(tmp_path / "cg")
    rel = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podz.slice"
    known = make_cgroup(root, f"{rel}/crio-k1.scope", cpus="0-7", mems=None)
    unknown = make_cgroup(root, f"{rel}/crio-u1.scope", cpus="", mems=None)
    target = ContainerIntent(
        container_id="k1", cgroups_path="kubepods-besteffort-podz.slice:crio:k1", cpus="0-3"
    )
    view = FakeView([target], "4-7")
    report = check(DriftWatcher(CgroupWriter(str(root)), view), view)
    assert (report.drifted, report.repaired, report.unknown_confined) == (1, 1, 1)
    assert read(known / "cpuset.cpus") == "0-3"
    assert read(unknown / "cpuset.cpus") == "4-7"


def test_unusable_root_is_one_clear_error(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    view = FakeView([intent("c1")], "0")
    w = DriftWatcher(CgroupWriter(str(tmp_path / "nope")), view, metrics=DriverMetrics(registry))
    report = check(w, view)
    assert report.errors == 1
    assert report.error_messages[0].startswith(f"cannot read cgroup root '{tmp_path}/nope'")
    assert w.checks == 1


def test_report_is_encodable_for_debug_state(tmp_path: Path) -> None:
    tree = Tree(tmp_path, n=1)
    w = tree.watcher()
    tree.check(w)
    doc = msgspec.json.decode(msgspec.json.encode(w.state()))
    assert doc["checks"] == 1
    assert doc["inotify"] is False
    assert doc["last_report"]["checked"] == 1
    assert doc["last_report"]["unknown_confined"] == 0


# -- the Trio loop ------------------------------------------------------------------------
async def test_checks_every_interval_under_mock_clock(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    tree = Tree(tmp_path, n=2)
    w = tree.watcher(interval=10.0, offload=False, use_inotify=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.writer.run, tree.view)
        await nursery.start(w.run)
        assert w.checks == 1  # a check right at start
        await trio.sleep(5)
        (tree.leaf(0) / "cpuset.cpus").write_text("7\n")
        await trio.sleep(4.5)
        assert w.checks == 1
        assert read(tree.leaf(0) / "cpuset.cpus") == "7"
        await trio.sleep(1)  # t = 10.5
        assert w.checks == 2
        assert read(tree.leaf(0) / "cpuset.cpus") == "0-1"
        assert w.last_report is not None and w.last_report.repaired == 1
        await trio.sleep(20)  # t = 30.5
        assert w.checks == 4
        nursery.cancel_scope.cancel()


async def test_poke_checks_sooner(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    tree = Tree(tmp_path, n=1)
    w = tree.watcher(interval=10.0, offload=False, use_inotify=False, settle=0.5)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.writer.run, tree.view)
        await nursery.start(w.run)
        await trio.sleep(2)
        w.poke()
        await trio.sleep(0.4)
        assert w.checks == 1  # still settling
        await trio.sleep(0.2)
        assert w.checks == 2
        # The interval restarts from the poked check: next at 2.5 + 10.
        await trio.sleep(9.8)
        assert w.checks == 2
        await trio.sleep(0.2)
        assert w.checks == 3
        nursery.cancel_scope.cancel()


async def test_inotify_wakes_the_watcher(tmp_path: Path) -> None:
    # Real clock: the wake-up comes from the kernel, not from a timer.
    if open_inotify() is None:
        pytest.skip("no inotify on this platform")
    tree = Tree(tmp_path, n=2)
    w = tree.watcher(interval=3600.0, offload=True, use_inotify=True, settle=0.01)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.writer.run, tree.view)
        await nursery.start(w.run)
        while w.state().watched_dirs == 0:  # first check done, watches set
            await trio.sleep(0.01)
        (tree.leaf(1) / "cpuset.cpus").write_text("7\n")
        with trio.fail_after(10):
            while read(tree.leaf(1) / "cpuset.cpus") != "0-1":
                await trio.sleep(0.01)
        # A new container cgroup (a directory created in a watched pod) wakes it too.
        with trio.fail_after(10):
            new = make_cgroup(tree.h, "kubepods/podu0/fresh", cpus="0-7")
            while read(new / "cpuset.cpus") != "2-7":
                await trio.sleep(0.01)
        assert w.checks >= 3
        state = w.state()
        assert state.inotify
        assert state.watched_dirs >= 5  # kubepods, two pods, their two containers
        nursery.cancel_scope.cancel()
    assert not w.state().inotify


async def test_offloaded_check_runs_in_a_thread(tmp_path: Path) -> None:
    tree = Tree(tmp_path, n=2)
    (tree.leaf(0) / "cpuset.cpus").write_text("7\n")
    w = tree.watcher(offload=True, use_inotify=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.writer.run, tree.view)
        await nursery.start(w.run)
        while w.checks < 1:
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert w.last_report is not None and w.last_report.repaired == 1


async def test_change_during_a_check_triggers_another(tmp_path: Path) -> None:
    # Real clock: the wake-up comes from the kernel.
    if open_inotify() is None:
        pytest.skip("no inotify on this platform")
    tree = Tree(tmp_path, n=2)
    w = tree.watcher(interval=3600.0, settle=0.01)
    reader = w._reader
    real_read = reader.read_effective_cpus
    reads = 0

    def read_effective_cpus(directory: str) -> CPUSet:
        # The second check (the poked one) reads c0, then c1: a write to c0 behind its
        # back in between is news for a third.
        nonlocal reads
        if directory == str(tree.leaf(1)):
            reads += 1
            if reads == 2:
                (tree.leaf(0) / "cpuset.cpus").write_text("7\n")
        return real_read(directory)

    reader.read_effective_cpus = read_effective_cpus  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(w.writer.run, tree.view)
        await nursery.start(w.run)
        while w.state().watched_dirs == 0:
            await trio.sleep(0.01)
        w.poke()
        with trio.fail_after(10):
            while w.checks < 3 or read(tree.leaf(0) / "cpuset.cpus") != "0-1":
                await trio.sleep(0.01)
        assert w.last_report is not None and w.last_report.repaired == 1
        # Its own repair echoes back through inotify but starts no further check.
        await trio.sleep(0.3)
        assert w.checks == 3
        nursery.cancel_scope.cancel()


def test_container_created_during_the_walk_is_not_confined(tmp_path: Path) -> None:
    # The owner learns of a claim holder (CreateContainer) after the check took its
    # intents, and the runtime creates its cgroup before the walk: it looks unknown, but
    # the owner knows it by the time of writing, so it keeps its claim's CPUs.
    tree = Tree(tmp_path, n=1)
    holder = make_cgroup(tree.h, "kubepods/podnew/h1", cpus="0-1")
    late = ContainerIntent(container_id="h1", cgroups_path="/kubepods/podnew/h1", cpus="0-1")
    stray = make_cgroup(tree.h, "kubepods/podnew/s1", cpus="0-7")
    view = FakeView(tree.intents, tree.pool)
    view.on_list = lambda: view.set([*tree.intents, late])
    report = check(DriftWatcher(CgroupWriter(str(tree.root)), view), view)
    assert report.unknown_found == 2 and report.unknown_confined == 1
    assert read(holder / "cpuset.cpus") == "0-1"
    assert read(stray / "cpuset.cpus") == "2-7"


def test_drift_whose_intent_moved_on_is_left_to_the_next_check(tmp_path: Path) -> None:
    # A prepare shrank the pool after the check read: the read cpuset is already the
    # new one (pushed by UpdateContainers), and the old intent must not be written back.
    tree = Tree(tmp_path, n=2)
    old = list(tree.intents)
    new = [msgspec.structs.replace(old[0], cpus="0"), old[1]]
    (tree.leaf(0) / "cpuset.cpus").write_text("0\n")
    (tree.leaf(1) / "cpuset.cpus").write_text("5\n")
    view = FakeView(old, tree.pool)
    view.on_list = lambda: view.set(new)
    report = check(DriftWatcher(CgroupWriter(str(tree.root)), view), view)
    assert report.drifted == 2 and report.repaired == 1
    assert read(tree.leaf(0) / "cpuset.cpus") == "0"
    assert read(tree.leaf(1) / "cpuset.cpus") == "0-1"


def test_pool_changed_during_the_check_confines_nothing_this_time(tmp_path: Path) -> None:
    tree = Tree(tmp_path, n=1)
    stray = make_cgroup(tree.h, "kubepods/podnew/s1", cpus="0-7")
    view = FakeView(tree.intents, "2-7")

    def shrink() -> None:
        view.pool = "3-7"  # a prepare, while the check reads

    view.on_list = shrink
    w = DriftWatcher(CgroupWriter(str(tree.root)), view)
    assert check(w, view).unknown_confined == 0
    assert read(stray / "cpuset.cpus") == "0-7"
    view.on_list = None
    assert check(w, view).unknown_confined == 1
    assert read(stray / "cpuset.cpus") == "3-7"


def test_nothing_is_confined_until_the_owner_knows_every_container(tmp_path: Path) -> None:
    # A daemon restarted under running pods knows none of them until the runtime's first
    # Synchronize: a claim holder's cgroup must keep its CPUs meanwhile.
    tree = Tree(tmp_path, n=1)
    holder = make_cgroup(tree.h, "kubepods/podold/h1", cpus="0-1")
    view = FakeView(tree.intents, tree.pool, synchronized=False)
    w = DriftWatcher(CgroupWriter(str(tree.root)), view)
    report = check(w, view)
    assert report.unknown_found == 1 and report.unknown_confined == 0
    assert read(holder / "cpuset.cpus") == "0-1"
    view.synchronized = True
    assert check(w, view).unknown_confined == 1
    assert read(holder / "cpuset.cpus") == "2-7"


def test_a_missing_hierarchy_is_warned_about_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    empty = tmp_path / "no-cgroups"
    empty.mkdir()
    view = FakeView(pool="0-7")
    w = DriftWatcher(CgroupWriter(str(empty)), view)
    with caplog.at_level(logging.DEBUG, logger="dracpu.cgroupfs.watcher"):
        reports = [check(w, view) for _ in range(3)]
    assert all(r.errors == 1 for r in reports)
    levels = [r.levelno for r in caplog.records if "drift check skipped" in r.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]


# -- pod sandboxes and the one-write rule -----------------------------------------------------
def test_a_sandbox_off_the_pool_is_kept_on_it_never_counted_as_drift(tmp_path: Path) -> None:
    tree = Tree(tmp_path, n=1, cpus="2-7")
    sandbox = msgspec.structs.replace(
        intent("sb0", pod="u9", cpus="2-7"), sandbox=True, cgroups_path="/kubepods/podu9/sb0"
    )
    make_cgroup(tree.h, sandbox.cgroups_path, cpus="0-7")  # as runc created it
    tree.intents.append(sandbox)
    report = tree.check(tree.watcher())
    assert read(tree.h / "kubepods/podu9/sb0/cpuset.cpus") == "2-7"
    assert (report.drifted, report.repaired) == (0, 0)
    assert tree.sample("dracpu_cgroup_fallback_writes_total", result="success", cause="sandbox")
    assert tree.sample("dracpu_cgroup_drift_repairs_total", result="success") == 0
    assert tree.sample("dracpu_cgroup_drifted_containers") == 0


def test_a_repair_another_writer_made_meanwhile_is_not_written_again(tmp_path: Path) -> None:
    tree = Tree(tmp_path, n=2)
    (tree.leaf(0) / "cpuset.cpus").write_text("0-7\n")
    writer = CgroupWriter(str(tree.root))
    watcher = DriftWatcher(writer, tree.view, metrics=tree.metrics)
    real_many = writer.write_many

    def fixed_first(intents, **kwargs):  # type: ignore[no-untyped-def]
        # Between the watcher's read and its write, the verifier's pass fixed the cgroup.
        (tree.leaf(0) / "cpuset.cpus").write_text("0-1\n")
        return real_many(intents, **kwargs)

    writer.write_many = fixed_first  # type: ignore[method-assign]
    report = tree.check(watcher)
    assert (report.drifted, report.repaired) == (1, 0)
    assert tree.sample("dracpu_cgroup_drift_repairs_total", result="success") == 0


async def test_a_writer_that_stops_mid_repair_is_one_error(tmp_path: Path) -> None:
    # The watcher waits for the writer's answer; a writer that crashed on its request
    # closes the reply channel, and the check reports that instead of hanging.
    tree = Tree(tmp_path, n=1)
    (tree.leaf(0) / "cpuset.cpus").write_text("7\n")
    w = tree.watcher()

    def broken(*intents: object) -> None:
        raise RuntimeError("writer bug")

    w.writer._write_repairs = broken  # type: ignore[method-assign,assignment]
    crashed: list[BaseException] = []

    async def writer() -> None:
        try:
            await w.writer.run(tree.view)
        except* RuntimeError as group:
            crashed.extend(group.exceptions)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        with trio.fail_after(10):
            report = await w.check()
    assert [str(e) for e in crashed] == ["writer bug"]
    assert (report.drifted, report.repaired, report.errors) == (1, 0, 1)
    assert report.error_messages == ("the cgroupfs writer stopped before repairing",)
    assert read(tree.leaf(0) / "cpuset.cpus") == "7"


def test_the_watcher_never_writes(tmp_path: Path) -> None:
    # Every write goes through the writer task: a check whose writer answers with nothing
    # written leaves the tree as it found it.
    tree = Tree(tmp_path, n=2)
    (tree.leaf(0) / "cpuset.cpus").write_text("7\n")
    stray = make_cgroup(tree.h, "kubepods/podnew/s1", cpus="0-7")
    w = tree.watcher()
    w.writer.write_many = lambda intents, **kw: []  # type: ignore[method-assign]
    report = tree.check(w)
    assert (report.drifted, report.repaired, report.unknown_found, report.unknown_confined) == (
        1,
        0,
        1,
        0,
    )
    assert read(tree.leaf(0) / "cpuset.cpus") == "7"
    assert read(stray / "cpuset.cpus") == "0-7"


async def test_a_repair_whose_asker_stopped_waiting_does_not_stop_the_writer(
    tmp_path: Path,
) -> None:
    tree = Tree(tmp_path, n=1)
    (tree.leaf(0) / "cpuset.cpus").write_text("7\n")
    w = tree.watcher()
    reply_send, reply = trio.open_memory_channel[RepairResults](1)
    reply.close()  # the check was cancelled while its request waited in the inbox
    inbox = w.writer.inbox()
    drifted = (tree.intents[0],)
    await inbox.send(DriftRepair(drifted=drifted, sandboxes=(), strangers=(), reply=reply_send))
    async with trio.open_nursery() as nursery:
        await nursery.start(w.writer.run, tree.view)
        with trio.fail_after(10):
            while read(tree.leaf(0) / "cpuset.cpus") != "0-1":
                await trio.sleep(0.01)
            # Still serving: the next check is answered.
            (tree.leaf(0) / "cpuset.cpus").write_text("7\n")
            assert (await w.check()).repaired == 1
        nursery.cancel_scope.cancel()
