"""The writer and the watcher against the real kernel's cgroup v1 cpuset hierarchy.

Each test builds a container-like tree under ``/sys/fs/cgroup/cpuset/dracpu-test-<random>``,
moves a real ``sleep`` into it, lets dracpu pin it and reads the process's
``Cpus_allowed_list``. With ``CI=true`` a missing or read-only hierarchy fails the test
instead of skipping it.
"""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from cgroup_trees import FakeView, check
from prometheus_client import CollectorRegistry

from dracpu.cgroupfs.paths import detect_layout
from dracpu.cgroupfs.watcher import DriftWatcher
from dracpu.cgroupfs.writer import CgroupWriteError, CgroupWriter, write_cgroup_file
from dracpu.cpuset import CPUSet
from dracpu.messages import ContainerIntent, CpusetUpdateFailed, VerifyCpusets
from dracpu.metrics import DriverMetrics

CGROUP_ROOT = "/sys/fs/cgroup"
CPUSET = Path(CGROUP_ROOT) / "cpuset"


def _unusable_reason() -> str | None:
    if not (CPUSET / "cpuset.cpus").is_file():
        return f"no cgroup v1 cpuset hierarchy at {CPUSET}"
    probe = CPUSET / f"dracpu-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError as exc:
        return f"{CPUSET} is not writable: {exc.strerror}"
    probe.rmdir()
    return None


def _require_hierarchy() -> None:
    reason = _unusable_reason()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true requires the real-kernel cgroup tests: {reason}")
    pytest.skip(reason)


def allowed_cpus(pid: int) -> CPUSet:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return CPUSet.parse(line.split(":", 1)[1].strip())
    raise AssertionError(f"no Cpus_allowed_list for pid {pid}")


@dataclass
class KernelPod:
    """``<base>/kubepods/pod<uid>/<cid>`` with a sleeping process in the container."""

    base: Path
    pod: Path
    cid: str
    cpus: list[int]
    mems: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def leaf(self) -> Path:
        return self.pod / self.cid

    @property
    def cgroups_path(self) -> str:
        return "/" + str(self.leaf.relative_to(CPUSET))

    @property
    def pid(self) -> int:
        return self.procs[0].pid

    def intent(self, cpus: str) -> ContainerIntent:
        return ContainerIntent(
            container_id=self.cid, cgroups_path=self.cgroups_path, cpus=cpus, pod_uid="u"
        )

    def add_container(self, name: str) -> tuple[Path, int]:
        directory = self.pod / name
        _mkcgroup(directory, ",".join(map(str, self.cpus)), self.mems)
        proc = subprocess.Popen(["sleep", "300"])
        self.procs.append(proc)
        (directory / "cgroup.procs").write_text(str(proc.pid))
        return directory, proc.pid


def _mkcgroup(directory: Path, cpus: str, mems: str) -> None:
    # v1: a new cpuset starts empty and takes no tasks until both sets are filled in.
    directory.mkdir()
    (directory / "cpuset.mems").write_text(mems)
    (directory / "cpuset.cpus").write_text(cpus)


@pytest.fixture
def kernel_pod() -> Iterator[KernelPod]:
    _require_hierarchy()
    root_cpus = CPUSet.parse((CPUSET / "cpuset.cpus").read_text())
    cpus = sorted(root_cpus & CPUSet(os.sched_getaffinity(0)))
    mems = (CPUSET / "cpuset.mems").read_text().strip()
    all_cpus = str(CPUSet(cpus))
    base = CPUSET / f"dracpu-test-{uuid.uuid4().hex[:12]}"
    pod = base / "kubepods" / "podu"
    tree = KernelPod(base=base, pod=pod, cid="c" + uuid.uuid4().hex[:12], cpus=cpus, mems=mems)
    try:
        for d in (base, base / "kubepods", pod):
            _mkcgroup(d, all_cpus, mems)
        tree.add_container(tree.cid)
        yield tree
    finally:
        for proc in tree.procs:
            proc.kill()
            proc.wait()
        if base.exists():
            for dirpath, _dirs, _files in os.walk(base, topdown=False):
                os.rmdir(dirpath)


def test_detects_the_v1_cpuset_mount() -> None:
    _require_hierarchy()
    layout = detect_layout(CGROUP_ROOT)
    assert (layout.version, layout.hierarchy) == (1, str(CPUSET))


async def test_fallback_pins_a_real_process(kernel_pod: KernelPod) -> None:
    first, last = kernel_pod.cpus[0], kernel_pod.cpus[-1]
    registry = CollectorRegistry()
    writer = CgroupWriter(CGROUP_ROOT, metrics=DriverMetrics(registry))
    for cpu in (last, first):
        want = kernel_pod.intent(str(cpu))
        failed = (CpusetUpdateFailed(intent=want, reason="NRI session down"),)
        message = VerifyCpusets(intents=(want,), cause="pool", failed=failed)
        assert await writer.verify(message, FakeView([want])) == [kernel_pod.cid]
        assert allowed_cpus(kernel_pod.pid) == CPUSet([cpu])
    ok = registry.get_sample_value(
        "dracpu_cgroup_fallback_writes_total", {"result": "success", "cause": "runtime-reported"}
    )
    assert ok == 2


def test_parent_is_widened_first_on_the_kernel(kernel_pod: KernelPod) -> None:
    first, last = kernel_pod.cpus[0], kernel_pod.cpus[-1]
    if first == last:
        pytest.skip("needs two CPUs to narrow a parent below its child's target")
    # Narrow child then parent to the first CPU (the kernel requires that order too).
    write_cgroup_file(str(kernel_pod.leaf / "cpuset.cpus"), str(first))
    write_cgroup_file(str(kernel_pod.pod / "cpuset.cpus"), str(first))
    # Control: v1 refuses a child outside its parent (validate_change answers EACCES).
    with pytest.raises(CgroupWriteError) as info:
        write_cgroup_file(str(kernel_pod.leaf / "cpuset.cpus"), str(last))
    assert info.value.errno == errno.EACCES
    assert str(info.value) == f"{kernel_pod.leaf}/cpuset.cpus: EACCES (Permission denied)"

    outcome = CgroupWriter(CGROUP_ROOT).write(kernel_pod.intent(str(last)))
    assert outcome.ok
    assert outcome.widened == (str(kernel_pod.pod),)
    assert CPUSet.parse((kernel_pod.pod / "cpuset.cpus").read_text()) == CPUSet([first, last])
    assert allowed_cpus(kernel_pod.pid) == CPUSet([last])
    assert outcome.effective_cpus == str(last)


def test_kernel_rejections_name_file_and_errno(kernel_pod: KernelPod) -> None:
    with pytest.raises(CgroupWriteError) as info:
        write_cgroup_file(str(kernel_pod.leaf / "cpuset.cpus"), "not-a-cpuset")
    assert (info.value.errno, info.value.path) == (
        errno.EINVAL,
        f"{kernel_pod.leaf}/cpuset.cpus",
    )
    beyond = CPUSet.parse((CPUSET / "cpuset.cpus").read_text()).max() + 1
    with pytest.raises(CgroupWriteError, match=r"is not within the cgroup root's"):
        CgroupWriter(CGROUP_ROOT).write(kernel_pod.intent(str(beyond)))
    assert allowed_cpus(kernel_pod.pid) == CPUSet(kernel_pod.cpus)


def _watcher(kernel_pod: KernelPod, view: FakeView) -> DriftWatcher:
    return DriftWatcher(
        CgroupWriter(CGROUP_ROOT),
        view,
        # Only the test's own tree: never the host's real kubepods.
        container_roots=(f"{kernel_pod.base.name}/kubepods",),
    )


def test_watcher_repairs_drift_on_the_kernel(kernel_pod: KernelPod) -> None:
    first, last = kernel_pod.cpus[0], kernel_pod.cpus[-1]
    want = kernel_pod.intent(str(last))
    view = FakeView([want], str(first))
    watcher = _watcher(kernel_pod, view)
    assert CgroupWriter(CGROUP_ROOT).write(want).ok
    # Behind dracpu's back, as a runtime or an operator might.
    write_cgroup_file(str(kernel_pod.leaf / "cpuset.cpus"), ",".join(map(str, kernel_pod.cpus)))
    assert allowed_cpus(kernel_pod.pid) == CPUSet(kernel_pod.cpus)
    report = check(watcher, view)
    expected_drift = 1 if len(kernel_pod.cpus) > 1 else 0
    assert (report.checked, report.drifted, report.repaired) == (1, expected_drift, expected_drift)
    assert report.errors == 0
    assert allowed_cpus(kernel_pod.pid) == CPUSet([last])


def test_watcher_confines_an_unknown_container(kernel_pod: KernelPod) -> None:
    first = kernel_pod.cpus[0]
    known = kernel_pod.intent(",".join(map(str, kernel_pod.cpus)))
    stray_dir, stray_pid = kernel_pod.add_container("stray")
    view = FakeView([known], str(first))
    report = check(_watcher(kernel_pod, view), view)
    expected = 1 if len(kernel_pod.cpus) > 1 else 0
    assert (report.unknown_found, report.unknown_confined, report.errors) == (expected, expected, 0)
    assert allowed_cpus(stray_pid) == CPUSet([first])
    assert allowed_cpus(kernel_pod.pid) == CPUSet(kernel_pod.cpus)  # known: untouched
    assert CPUSet.parse((stray_dir / "cpuset.cpus").read_text()) == CPUSet([first])


async def test_watcher_wakes_on_kernel_inotify(kernel_pod: KernelPod) -> None:
    first, last = kernel_pod.cpus[0], kernel_pod.cpus[-1]
    if first == last:
        pytest.skip("needs two CPUs to drift")
    want = kernel_pod.intent(str(last))
    view = FakeView([want], str(first))
    watcher = _watcher(kernel_pod, view)
    watcher.interval = 3600.0
    watcher.settle = 0.01
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.writer.run, view)
        await nursery.start(watcher.run)
        with trio.fail_after(10):
            while watcher.state().watched_dirs == 0:  # first check done, watches set
                await trio.sleep(0.01)
        assert allowed_cpus(kernel_pod.pid) == CPUSet([last])
        write_cgroup_file(str(kernel_pod.leaf / "cpuset.cpus"), str(first))
        with trio.fail_after(10):
            while allowed_cpus(kernel_pod.pid) != CPUSet([last]):
                await trio.sleep(0.01)
        assert watcher.checks >= 2
        nursery.cancel_scope.cancel()


def _status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {name} for pid {pid}")


def test_mems_are_written_with_cpus_on_the_kernel(kernel_pod: KernelPod) -> None:
    last = kernel_pod.cpus[-1]
    node = str(CPUSet.parse(kernel_pod.mems).min())
    target = ContainerIntent(
        container_id=kernel_pod.cid, cgroups_path=kernel_pod.cgroups_path, cpus=str(last), mems=node
    )
    outcome = CgroupWriter(CGROUP_ROOT).write(target)
    assert outcome.ok
    assert (outcome.effective_cpus, outcome.effective_mems) == (str(last), node)
    assert _status_field(kernel_pod.pid, "Mems_allowed_list") == node
    assert allowed_cpus(kernel_pod.pid) == CPUSet([last])


def test_ci_turns_a_missing_hierarchy_into_a_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(globals(), "CPUSET", tmp_path / "cpuset")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true requires the real-kernel"):
        _require_hierarchy()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="no cgroup v1 cpuset hierarchy at"):
        _require_hierarchy()
