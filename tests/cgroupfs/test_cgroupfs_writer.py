"""The raw cpuset writer on fake v1 and v2 trees, and the one writer task's passes."""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import trio
from builders import cs
from cgroup_trees import FakeView, intent, make_cgroup, read, v1_root, v2_root
from prometheus_client import CollectorRegistry

from dracpu.cgroupfs.paths import CgroupPathError
from dracpu.cgroupfs.writer import (
    CgroupIntentError,
    CgroupWriteError,
    CgroupWriter,
    CpusetWrite,
    plan_cpuset_writes,
)
from dracpu.cpuset import CPUSet
from dracpu.messages import ContainerIntent, CpusetUpdateFailed, VerifyCpusets
from dracpu.metrics import DriverMetrics


# -- the pure plan ------------------------------------------------------------------------
def test_plan_widens_parents_top_down_then_leaf() -> None:
    plan = plan_cpuset_writes(
        "/h/a/b/c",
        "cpuset.cpus",
        cs("4-5"),
        [("/h/a", cs("0-3")), ("/h/a/b", cs("0-1"))],
        limit=cs("0-7"),
        nested=True,
    )
    assert plan == [
        CpusetWrite("/h/a", "cpuset.cpus", "0-5"),
        CpusetWrite("/h/a/b", "cpuset.cpus", "0-1,4-5"),
        CpusetWrite("/h/a/b/c", "cpuset.cpus", "4-5"),
    ]


def test_plan_narrowing_touches_only_the_leaf() -> None:
    plan = plan_cpuset_writes(
        "/h/a/c", "cpuset.cpus", cs("2"), [("/h/a", cs("0-7"))], limit=cs("0-7"), nested=True
    )
    assert plan == [CpusetWrite("/h/a/c", "cpuset.cpus", "2")]


def test_plan_skips_ancestors_without_the_file_and_v2_inheritors() -> None:
    ancestors: list[tuple[str, CPUSet | None]] = [("/h/a", None), ("/h/a/b", CPUSet())]
    v1 = plan_cpuset_writes("/h/a/b/c", "cpuset.cpus", cs("1"), ancestors, limit=None, nested=True)
    assert [w.directory for w in v1] == ["/h/a/b", "/h/a/b/c"]  # v1: empty means no CPUs
    v2 = plan_cpuset_writes("/h/a/b/c", "cpuset.cpus", cs("1"), ancestors, limit=None, nested=False)
    assert [w.directory for w in v2] == ["/h/a/b/c"]  # v2: empty means inherit


def test_plan_refuses_cpus_outside_the_root() -> None:
    with pytest.raises(CgroupWriteError) as info:
        plan_cpuset_writes("/h/c", "cpuset.cpus", cs("6-9"), [], limit=cs("0-7"), nested=True)
    assert info.value.errno == errno.EINVAL
    assert str(info.value) == "/h/c/cpuset.cpus: EINVAL (6-9 is not within the cgroup root's 0-7)"


# -- v1 fake trees ------------------------------------------------------------------------
def test_v1_cgroupfs_write_and_readback(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1", cpus="0-7", mems="0-1")
    outcome = CgroupWriter(str(root)).write(intent("c1", cpus="2,3"))
    assert read(leaf / "cpuset.cpus") == "2-3"
    assert read(leaf / "cpuset.mems") == "0-1"  # no mems asked for: untouched
    assert outcome.ok
    assert (outcome.cpus, outcome.effective_cpus, outcome.directory) == ("2-3", "2-3", str(leaf))
    assert outcome.widened == ()


def test_v1_writes_mems_when_asked(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1", cpus="0-7", mems="0-1")
    outcome = CgroupWriter(str(root)).write(intent("c1", cpus="4-5", mems="1"))
    assert (read(leaf / "cpuset.cpus"), read(leaf / "cpuset.mems")) == ("4-5", "1")
    assert outcome.ok
    assert [w.file for w in outcome.writes] == ["cpuset.mems", "cpuset.cpus"]


def test_v1_widens_parents_before_the_child(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    h = root / "cpuset"
    make_cgroup(h, "kubepods", cpus="0-3")
    make_cgroup(h, "kubepods/podp1", cpus="0-1")
    sibling = make_cgroup(h, "kubepods/podp1/c0", cpus="0-1")
    leaf = make_cgroup(h, "kubepods/podp1/c1", cpus="0-1")
    outcome = CgroupWriter(str(root)).write(intent("c1", cpus="5-6"))
    assert [(w.directory, w.value) for w in outcome.writes] == [
        (str(h / "kubepods"), "0-3,5-6"),
        (str(h / "kubepods/podp1"), "0-1,5-6"),
        (str(leaf), "5-6"),
    ]
    assert outcome.widened == (str(h / "kubepods"), str(h / "kubepods/podp1"))
    assert read(h / "kubepods/podp1/cpuset.cpus") == "0-1,5-6"
    assert read(sibling / "cpuset.cpus") == "0-1"


def test_v1_narrowing_never_narrows_a_parent(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    h = root / "cpuset"
    make_cgroup(h, "kubepods/podp1", cpus="0-7")
    sibling = make_cgroup(h, "kubepods/podp1/c0", cpus="4-7")
    leaf = make_cgroup(h, "kubepods/podp1/c1", cpus="0-7")
    outcome = CgroupWriter(str(root)).write(intent("c1", cpus="1"))
    assert [w.path for w in outcome.writes] == [f"{leaf}/cpuset.cpus"]
    assert read(h / "kubepods/podp1/cpuset.cpus") == "0-7"
    assert read(sibling / "cpuset.cpus") == "4-7"


def test_v1_readback_mismatch_is_reported(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1")
    # Something (a kernel restriction, here a stale file) keeps the effective set apart.
    (leaf / "cpuset.effective_cpus").write_text("0-7\n")
    outcome = CgroupWriter(str(root)).write(intent("c1", cpus="2"))
    assert not outcome.ok
    assert outcome.cpus_mismatch
    assert outcome.describe_mismatch() == (f"{leaf}: effective cpus '0-7' differ from intended '2'")


def test_v1_mems_mismatch_is_reported(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1")
    (leaf / "cpuset.effective_mems").write_text("0\n")
    outcome = CgroupWriter(str(root)).write(intent("c1", cpus="2", mems="1"))
    assert not outcome.ok
    assert "effective mems '0' differ from intended '1'" in outcome.describe_mismatch()


def test_v1_systemd_driver_tree(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    rel = (
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podab_cd.slice/"
        "cri-containerd-c1.scope"
    )
    leaf = make_cgroup(root / "cpuset", rel)
    target = ContainerIntent(
        container_id="c1",
        cgroups_path="kubepods-burstable-podab_cd.slice:cri-containerd:c1",
        cpus="6-7",
    )
    assert CgroupWriter(str(root)).write(target).ok
    assert read(leaf / "cpuset.cpus") == "6-7"


# -- v2 fake trees ------------------------------------------------------------------------
def test_v2_reads_cpus_effective(tmp_path: Path) -> None:
    root = v2_root(tmp_path / "cg")
    leaf = make_cgroup(root, "kubepods/podp1/c1", cpus="", mems=None)
    (leaf / "cpuset.cpus.effective").write_text("0-7\n")
    outcome = CgroupWriter(str(root)).write(intent("c1", cpus="3"))
    assert read(leaf / "cpuset.cpus") == "3"
    # A fake tree has no kernel to recompute the effective file: the mismatch shows.
    assert outcome.effective_cpus == "0-7"
    assert not outcome.ok


def test_v2_widens_only_explicit_parents(tmp_path: Path) -> None:
    root = v2_root(tmp_path / "cg")
    make_cgroup(root, "kubepods.slice", cpus="", mems=None)
    make_cgroup(root, "kubepods.slice/kubepods-podx.slice", cpus="0-1", mems=None)
    leaf = make_cgroup(root, "kubepods.slice/kubepods-podx.slice/crio-c1.scope", mems=None)
    outcome = CgroupWriter(str(root)).write(
        ContainerIntent(container_id="c1", cgroups_path="kubepods-podx.slice:crio:c1", cpus="4")
    )
    assert outcome.widened == (str(root / "kubepods.slice/kubepods-podx.slice"),)
    assert read(root / "kubepods.slice/cpuset.cpus") == ""
    assert read(root / "kubepods.slice/kubepods-podx.slice/cpuset.cpus") == "0-1,4"
    assert read(leaf / "cpuset.cpus") == "4"
    assert outcome.ok


# -- errors -------------------------------------------------------------------------------
def test_missing_container_dir_names_it(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    with pytest.raises(CgroupWriteError) as info:
        CgroupWriter(str(root)).write(intent("gone"))
    assert info.value.errno == errno.ENOENT
    assert info.value.path == f"{root}/cpuset/kubepods/podp1/gone"
    assert (
        str(info.value) == f"{root}/cpuset/kubepods/podp1/gone: ENOENT (no such cgroup directory)"
    )


def test_missing_file_names_it(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1", cpus=None, mems=None)
    with pytest.raises(CgroupWriteError) as info:
        CgroupWriter(str(root)).write(intent("c1"))
    assert info.value.errno == errno.ENOENT
    assert str(info.value) == f"{leaf}/cpuset.cpus: ENOENT (No such file or directory)"


def test_file_that_is_a_directory(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1", cpus=None)
    (leaf / "cpuset.cpus").mkdir()
    with pytest.raises(CgroupWriteError, match=r"c1/cpuset.cpus: EISDIR \(Is a directory\)"):
        CgroupWriter(str(root)).write(intent("c1"))


def test_planted_symlink_file_is_not_followed(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1", cpus=None)
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    os.symlink(victim, leaf / "cpuset.cpus")
    with pytest.raises(CgroupWriteError, match=r"c1/cpuset.cpus: ELOOP"):
        CgroupWriter(str(root)).write(intent("c1"))
    assert read(victim) == "keep"


def _write_as_nobody(root: Path) -> str:
    """Run one write in a forked child without root's file-mode override; its error text."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        status = 0
        try:
            os.close(read_fd)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            try:
                CgroupWriter(str(root)).write(intent("c1", cpus="1"))
                text = "no error"
            except CgroupWriteError as exc:
                text = f"{exc.errno} {exc}"
            os.write(write_fd, text.encode())
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        text = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return text


def test_read_only_file_names_it_and_the_errno(short_tmp: str) -> None:
    base = Path(short_tmp)  # under /tmp: nobody can reach it once it is 0755
    root = v1_root(base / "cg")
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1")
    for d in (base, root, root / "cpuset", leaf.parent.parent, leaf.parent, leaf):
        os.chmod(d, 0o755)
    for f in [*leaf.iterdir(), root / "cpuset" / "cpuset.cpus"]:
        os.chmod(f, 0o444)
    text = _write_as_nobody(root)
    assert text == f"{errno.EACCES} {leaf}/cpuset.cpus: EACCES (Permission denied)"
    assert read(leaf / "cpuset.cpus") == "0-7"


@pytest.mark.parametrize(
    ("cpus", "mems", "message"),
    [
        ("1-", "", r"container 'c1': invalid cpus: invalid cpuset '1-'"),
        ("", "", r"container 'c1': refusing to write an empty cpus set"),
        ("1", "x", r"container 'c1': invalid mems: invalid cpuset 'x'"),
    ],
)
def test_bad_intents(tmp_path: Path, cpus: str, mems: str, message: str) -> None:
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1")
    with pytest.raises(CgroupIntentError, match=message):
        CgroupWriter(str(root)).write(intent("c1", cpus=cpus, mems=mems))
    assert read(leaf / "cpuset.cpus") == "0-7"


def test_escaping_intent_refused(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    bad = ContainerIntent(container_id="c1", cgroups_path="/kubepods/../../etc", cpus="1")
    with pytest.raises(CgroupPathError, match="escapes the cgroup root"):
        CgroupWriter(str(root)).write(bad)


def test_write_many_keeps_going_past_failures(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    h = root / "cpuset"
    make_cgroup(h, "kubepods/podp1", cpus="0-1")
    make_cgroup(h, "kubepods/podp1/c1", cpus="0-1")
    make_cgroup(h, "kubepods/podp1/c3", cpus="0-1")
    results = CgroupWriter(str(root)).write_many(
        [intent("c1", cpus="2"), intent("c2", cpus="3"), intent("c3", cpus="4")]
    )
    assert [type(r).__name__ for _, r in results] == [
        "WriteOutcome",
        "CgroupWriteError",
        "WriteOutcome",
    ]
    # The shared parent was widened twice through the batch cache, keeping both CPUs.
    assert read(h / "kubepods/podp1/cpuset.cpus") == "0-2,4"


async def test_a_pass_reads_first_asks_then_writes_what_is_still_wanted(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    h = root / "cpuset"
    make_cgroup(h, "kubepods/podp1", cpus="0-7", mems="0-1")
    holds = make_cgroup(h, "kubepods/podp1/c1", cpus="2-3", mems="0")
    other_cpus = make_cgroup(h, "kubepods/podp1/c2", cpus="0-7")
    other_mems = make_cgroup(h, "kubepods/podp1/c4", cpus="2-3", mems="0")
    changed = make_cgroup(h, "kubepods/podp1/c5", cpus="0-7")
    stamp = os.stat(holds / "cpuset.cpus").st_mtime_ns
    pushed = [
        intent("c1", cpus="2-3", mems="0"),  # holds it already: neither written nor asked
        intent("c2", cpus="2-3"),
        intent("c3", cpus="2-3"),  # no cgroup (stopped): skipped, not an error
        intent("c4", cpus="2-3", mems="1"),
        intent("c5", cpus="2-3"),
    ]
    view = FakeView([*pushed[:4], intent("c5", cpus="4")])  # c5's intent moved on
    registry = CollectorRegistry()
    writer = CgroupWriter(str(root), metrics=DriverMetrics(registry))
    written = await writer.verify(VerifyCpusets(intents=tuple(pushed), cause="pool"), view)
    assert view.asked == [["c2", "c4", "c5"]]  # asked once, after every read, only of those
    assert written == ["c2", "c4"]
    assert (writer.tally.verified, writer.tally.rewritten) == (5, 2)
    assert os.stat(holds / "cpuset.cpus").st_mtime_ns == stamp
    assert read(other_cpus / "cpuset.cpus") == "2-3"
    assert read(other_mems / "cpuset.mems") == "1"
    assert read(changed / "cpuset.cpus") == "0-7"
    assert _counter(registry, "success", "verify-mismatch") == 2


async def test_a_pass_asks_every_chunk(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    pushed = [intent(f"c{i}", cpus="3") for i in range(5)]
    for i in range(5):
        make_cgroup(root / "cpuset", f"kubepods/podp1/c{i}", cpus="0-7")
    view = FakeView(pushed)
    writer = CgroupWriter(str(root), chunk=2)
    written = await writer.verify(VerifyCpusets(intents=tuple(pushed), cause="pool"), view)
    assert view.asked == [["c0", "c1"], ["c2", "c3"], ["c4"]]
    assert written == [f"c{i}" for i in range(5)]


def test_a_pass_step_reports_an_unreadable_cgroup(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    h = root / "cpuset"
    make_cgroup(h, "kubepods/podp1", cpus="0-7")
    garbled = make_cgroup(h, "kubepods/podp1/c1", cpus="0-7")
    (garbled / "cpuset.cpus").write_text("not a set\n")
    make_cgroup(h, "kubepods/podp1/c2", cpus="0-7")
    writer = CgroupWriter(str(root))
    pending = iter([intent("c1", cpus="1"), intent("c2", cpus="1")])
    step = writer.read_differing(pending, chunk=128)
    [(bad, error)] = step.errors
    assert bad.container_id == "c1" and isinstance(error, CgroupWriteError)
    assert "unparsable content" in str(error)
    assert [i.container_id for i in step.differing] == ["c2"]
    last = writer.write_then_read(step.differing, pending, chunk=128)
    assert [(i.container_id, r.ok) for i, r in last.written] == [("c2", True)]  # type: ignore[union-attr]
    assert (last.differing, last.errors) == ([], [])
    assert read(h / "kubepods/podp1/c2/cpuset.cpus") == "1"


async def test_a_pass_never_writes_back_a_set_the_owner_moved_on_from(tmp_path: Path) -> None:
    # Between the pass's read-back and its write the pool shrinks and the runtime applies
    # the newer set. The read-back differs from the pushed set, but the owner, asked after
    # the read-back, no longer wants it: nothing is written.
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1", cpus="0-5")
    pushed = intent("c1", cpus="0-7")

    class MovesOn(FakeView):
        def still_wanted(self, intents: Iterable[ContainerIntent]) -> list[ContainerIntent]:
            self.set([intent("c1", cpus="0-3")])
            (leaf / "cpuset.cpus").write_text("0-3\n")
            return super().still_wanted(intents)

    writer = CgroupWriter(str(root))
    view = MovesOn([pushed])
    assert await writer.verify(VerifyCpusets(intents=(pushed,), cause="pool"), view) == []
    assert view.asked == [["c1"]]
    assert read(leaf / "cpuset.cpus") == "0-3"
    assert writer.tally.rewritten == 0


async def test_a_cancelled_pass_leaves_its_step_to_finish_in_its_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cancellation (a stop) never waits for cgroupfs: the step in flight is abandoned, yet
    # its thread still writes and reads back as one step, and the next step of the writer
    # cannot start before that thread ends.
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1")
    writer = CgroupWriter(str(root))
    want = intent("c1", cpus="5")
    in_step, release = threading.Event(), threading.Event()
    write_then_read = writer.write_then_read

    def hung_write(*args: object, **kwargs: object) -> object:
        in_step.set()
        release.wait(timeout=30)
        return write_then_read(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(writer, "write_then_read", hung_write)
    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    writer.verify, VerifyCpusets(intents=(want,), cause="pool"), FakeView([want])
                )
                await trio.to_thread.run_sync(in_step.wait)
                scope.cancel()
        assert scope.cancelled_caught  # the pass ended without waiting for its thread
        assert read(leaf / "cpuset.cpus") != "5"
        assert writer._one_thread.borrowed_tokens == 1  # held by the abandoned step
    finally:
        release.set()
    with trio.fail_after(10):
        async with writer._one_thread:  # free once the abandoned step ended
            pass
    assert read(leaf / "cpuset.cpus") == "5"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk": 0}, "verification chunk must be at least 1, got 0"),
        ({"create_poll": 0}, "invalid wait for new cgroups: wait 2.0, poll 0"),
        ({"create_wait": -1}, "invalid wait for new cgroups: wait -1, poll 0.05"),
    ],
)
def test_bad_writer_settings(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        CgroupWriter("/sys/fs/cgroup", **kwargs)  # type: ignore[arg-type]


def _counter(registry: CollectorRegistry, result: str, cause: str = "runtime-reported") -> float:
    value = registry.get_sample_value(
        "dracpu_cgroup_fallback_writes_total", {"result": result, "cause": cause}
    )
    assert value is not None
    return value


async def _one_pool_pass(writer: CgroupWriter, view: FakeView, message: VerifyCpusets) -> None:
    """Hand the writer task one pool change's pass, as the pusher does, and wait for it."""
    inbox = writer.inbox()
    writer.begin_pass()
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run, view)
        await inbox.send(message)
        with trio.fail_after(10):
            await writer.wait_no_pass()
        nursery.cancel_scope.cancel()


def _failed(*pairs: tuple[ContainerIntent, str]) -> tuple[CpusetUpdateFailed, ...]:
    return tuple(CpusetUpdateFailed(intent=i, reason=r) for i, r in pairs)


async def test_runtime_reported_failures_are_written_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dracpu.cgroupfs")
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1")
    registry = CollectorRegistry()
    writer = CgroupWriter(str(root), metrics=DriverMetrics(registry))
    c1, gone = intent("c1", cpus="6-7"), intent("gone", cpus="1")
    bad = ContainerIntent(container_id="evil", cgroups_path="/../x", cpus="1")
    failed = _failed((c1, "NRI session down"), (gone, "timed out"), (bad, "listed as failed"))
    message = VerifyCpusets(intents=(c1, gone, bad), cause="pool", failed=failed)
    await _one_pool_pass(writer, FakeView([c1, gone, bad]), message)
    assert read(leaf / "cpuset.cpus") == "6-7"
    assert _counter(registry, "success") == 1
    assert _counter(registry, "error") == 2
    assert writer.tally.rewritten == 1
    messages = [r.getMessage() for r in caplog.records]
    assert "fallback cpuset write container_id=c1 cpus=6-7 reason=NRI session down" in messages
    assert any(
        m.startswith("fallback cpuset write failed container_id=gone cpus=1 reason=timed out")
        and m.endswith("podp1/gone: ENOENT (no such cgroup directory)")
        for m in messages
    )
    assert (
        "fallback cpuset write failed container_id=evil cpus=1 reason=listed as failed: "
        "cgroups path '/../x' escapes the cgroup root through '..'"
    ) in messages


async def test_a_runtime_reported_failure_the_owner_moved_on_from_is_not_written(
    tmp_path: Path,
) -> None:
    # The fallback used to write whatever the runtime could not apply; a later change (the
    # pool grew again) makes that set stale, and the one rule leaves it alone.
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1", cpus="0-1")
    registry = CollectorRegistry()
    writer = CgroupWriter(str(root), metrics=DriverMetrics(registry))
    pushed = intent("c1", cpus="6-7")
    message = VerifyCpusets(intents=(pushed,), cause="pool", failed=_failed((pushed, "timed out")))
    await _one_pool_pass(writer, FakeView([intent("c1", cpus="2-7")]), message)
    assert read(leaf / "cpuset.cpus") == "0-1"
    assert registry.get_sample_value(
        "dracpu_cgroup_fallback_writes_total", {"result": "success", "cause": "runtime-reported"}
    ) in (None, 0.0)


async def test_a_runtime_reported_mismatch_is_a_failure(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1")
    (leaf / "cpuset.effective_cpus").write_text("0-7\n")
    registry = CollectorRegistry()
    writer = CgroupWriter(str(root), metrics=DriverMetrics(registry))
    pushed = intent("c1", cpus="3")
    message = VerifyCpusets(intents=(pushed,), cause="pool", failed=_failed((pushed, "x")))
    assert await writer.verify(message, FakeView([pushed])) == []
    assert _counter(registry, "error") == 1


async def test_a_runtime_reported_failure_already_in_place_is_not_written(
    tmp_path: Path,
) -> None:
    # The runtime applied it after all (or a pass before got there): once is enough.
    root = v1_root(tmp_path)
    leaf = make_cgroup(root / "cpuset", "kubepods/podp1/c1", cpus="6-7")
    before = (leaf / "cpuset.cpus").stat().st_mtime_ns
    registry = CollectorRegistry()
    writer = CgroupWriter(str(root), metrics=DriverMetrics(registry))
    pushed = intent("c1", cpus="6-7")
    message = VerifyCpusets(
        intents=(pushed,), cause="pool", failed=_failed((pushed, "listed as failed"))
    )
    assert await writer.verify(message, FakeView([pushed])) == []
    assert (leaf / "cpuset.cpus").stat().st_mtime_ns == before
    assert _counter(registry, "success", "verify-mismatch") == 0


def test_widening_reads_the_parent_fresh_within_a_batch(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    h = root / "cpuset"
    pod = make_cgroup(h, "kubepods/podp1", cpus="0-3")
    make_cgroup(h, "kubepods/podp1/c1", cpus="0-3")
    make_cgroup(h, "kubepods/podp1/c2", cpus="0-3")

    def intents() -> Iterator[ContainerIntent]:
        yield intent("c1", cpus="1")
        # The kubelet widens the pod between two writes of the batch.
        (pod / "cpuset.cpus").write_text("0-7\n")
        yield intent("c2", cpus="5")

    results = CgroupWriter(str(root)).write_many(intents())
    assert all(not isinstance(r, Exception) and r.ok for _, r in results)
    assert read(pod / "cpuset.cpus") == "0-7"  # not written back as the stale 0-3 plus 5


def test_interleaved_writes_keep_both_widenings(tmp_path: Path) -> None:
    # Two containers of one pod widen the pod's cpuset in turn. The writer has no lock:
    # one task writes, one step at a time (CgroupWriter.run), so writes never run side by
    # side; what must hold is that each widening reads the parent fresh and keeps the
    # other's CPUs.
    root = v1_root(tmp_path, cpus="0-63")
    h = root / "cpuset"
    pod = make_cgroup(h, "kubepods/podp1", cpus="0")
    for c in ("a", "b"):
        make_cgroup(h, f"kubepods/podp1/{c}", cpus="0")
    writer = CgroupWriter(str(root))
    for a_cpu, b_cpu in zip(range(1, 32), range(32, 63), strict=True):
        writer.write(intent("a", cpus=str(a_cpu)))
        writer.write(intent("b", cpus=str(b_cpu)))
    assert read(pod / "cpuset.cpus") == "0-62"
    assert read(pod / "a" / "cpuset.cpus") == "31"
    assert read(pod / "b" / "cpuset.cpus") == "62"


async def test_a_hung_cgroup_check_strands_one_thread_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new container's cgroup check is cut short at its deadline and its thread left
    # behind. With a hung cgroupfs, one check per container would strand one thread of
    # Trio's shared pool each, until nothing else (device metadata, sysfs) got a thread.
    # The checks have a limiter of their own: one thread is stranded, whatever the count.
    root = v1_root(tmp_path)
    make_cgroup(root / "cpuset", "kubepods/podp1/c1")
    writer = CgroupWriter(str(root), create_wait=0.2, create_poll=0.01)
    entered, release = threading.Event(), threading.Event()
    hung: list[int] = []

    def hung_check(intents: object) -> bool:
        hung.append(1)
        entered.set()
        release.wait(timeout=30)
        return True

    monkeypatch.setattr(writer, "_all_exist", hung_check)
    default = trio.to_thread.current_default_thread_limiter()
    before = default.borrowed_tokens
    want = intent("c1", cpus="5")
    inbox = writer.inbox()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run, FakeView([want]))
            for _ in range(5):
                await inbox.send(VerifyCpusets(intents=(want,), cause="create"))
            await trio.to_thread.run_sync(entered.wait, 10)
            await trio.sleep(0.5)  # every check's deadline passed
            assert len(hung) == 1
            assert writer._create_checks.borrowed_tokens == 1
            assert default.borrowed_tokens == before
            nursery.cancel_scope.cancel()
        assert read(root / "cpuset/kubepods/podp1/c1/cpuset.cpus") == "5"  # checks went on
    finally:
        release.set()
