"""The interrupt service against a fake procfs tree: masks move at prepare, come back at
unprepare and after a restart in between; managed interrupts are counted; bad /proc content
is a clear error that loses nothing."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import trio
import trio.testing
from fake_proc import ManagedProc, affinities, default_mask, make_proc
from prometheus_client import CollectorRegistry

from dracpu.allocation.options import AllocationOptions
from dracpu.allocation.store import ClaimRecord
from dracpu.cpuset import CPUSet
from dracpu.irq.metrics import IrqMetrics
from dracpu.irq.procfs import IrqFileError
from dracpu.irq.record import RECORD_FILE
from dracpu.irq.service import IrqIsolation, banned_cpus

ISOLATE = {"main": AllocationOptions(isolate_irqs=True)}
ORIGINAL = {0: "0", 24: "0-7", 25: "4-5", 26: "2-3", 27: "0-7", 28: "6"}


def assert_all_restored(proc: Path) -> None:
    """Every interrupt's affinity and the default mask are back to what they were."""
    assert affinities(proc) == ORIGINAL
    assert default_mask(proc) == "ff"


def claim(uid: str, cpus: str, *, isolate: bool = True) -> ClaimRecord:
    return ClaimRecord(uid=uid, cpus=CPUSet.parse(cpus), options=ISOLATE if isolate else {})


class Claims:
    """The owner's view as the service reads it: the prepared claims; the online CPUs
    are not known (empty), so every CPU counts as online."""

    online = CPUSet()

    def __init__(self) -> None:
        self.records: list[ClaimRecord] = []

    def claims(self) -> list[ClaimRecord]:
        return list(self.records)


def service(tmp_path: Path, claims: Claims, **kw: object) -> IrqIsolation:
    svc = IrqIsolation(
        str(tmp_path / "proc"), str(tmp_path / "state"), boot_id="boot-1", view=claims, **kw
    )
    svc.load()
    return svc


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    return make_proc(tmp_path, "ff", ORIGINAL)


def test_banned_cpus_are_the_claims_that_asked_or_all_with_the_node_setting() -> None:
    records = [claim("a", "2-3"), claim("b", "6", isolate=False)]
    assert banned_cpus(records, isolate_all=False) == CPUSet.parse("2-3")
    assert banned_cpus(records, isolate_all=True) == CPUSet.parse("2-3,6")


def test_prepare_moves_masks_and_unprepare_gives_them_back(tmp_path: Path, proc: Path) -> None:
    claims = Claims()
    svc = service(tmp_path, claims)
    report = svc.apply(CPUSet.parse("2-3"))
    assert affinities(proc) == {0: "0", 24: "0-1,4-7", 25: "4-5", 26: "2-3", 27: "0-1,4-7", 28: "6"}
    assert default_mask(proc) == "f3"
    assert report.would_empty == [26]  # only on banned CPUs: left as it was, reported
    assert report.written == 3
    # A second claim widens the ban; each mask is computed from its original.
    svc.apply(CPUSet.parse("2-3,6-7"))
    assert affinities(proc) == {0: "0", 24: "0-1,4-5", 25: "4-5", 26: "2-3", 27: "0-1,4-5", 28: "6"}
    assert default_mask(proc) == "33"
    svc.apply(CPUSet.parse("6-7"))
    assert affinities(proc)[26] == "2-3"
    assert affinities(proc)[24] == "0-5"
    report = svc.apply(CPUSet())
    assert_all_restored(proc)
    assert svc.record.empty
    assert json.loads((tmp_path / "state" / RECORD_FILE).read_text())["originals"] == {}


def test_the_record_is_on_disk_before_a_mask_changes(tmp_path: Path, proc: Path) -> None:
    seen: list[dict[str, object]] = []

    class Spy(ManagedProc):
        def write_affinity(self, irq: int, cpus: CPUSet) -> None:
            seen.append(json.loads((tmp_path / "state" / RECORD_FILE).read_text()))
            super().write_affinity(irq, cpus)

    svc = service(tmp_path, Claims())
    svc.proc = Spy(str(proc), managed=set())
    svc.apply(CPUSet.parse("2-3"))
    assert seen and all(s["banned"] == "2-3" for s in seen)
    # What dracpu is about to change: the originals, and what it will write (pending).
    assert seen[0]["originals"] == {"24": "0-7", "27": "0-7"}
    assert seen[0]["pending"] == {"24": "0-1,4-7", "27": "0-1,4-7"}
    assert seen[0]["default_original"] == "ff" and seen[0]["default_pending"] == "f3"
    saved = json.loads((tmp_path / "state" / RECORD_FILE).read_text())
    assert saved["pending"] == {} and saved["written"] == {"24": "0-1,4-7", "27": "0-1,4-7"}


def test_restart_in_the_middle_restores_from_the_record(tmp_path: Path, proc: Path) -> None:
    svc = service(tmp_path, Claims())
    svc.apply(CPUSet.parse("2-3"))
    # The process dies here; the claim is unprepared while it is down (or the checkpoint
    # no longer holds it): a new process starts with no claim asking.
    again = service(tmp_path, Claims())
    assert again.record.banned == CPUSet.parse("2-3")
    again.apply(CPUSet())
    assert_all_restored(proc)


def test_restart_with_the_claim_still_prepared_keeps_the_ban(tmp_path: Path, proc: Path) -> None:
    svc = service(tmp_path, Claims())
    svc.apply(CPUSet.parse("2-3"))
    again = service(tmp_path, Claims())
    report = again.apply(CPUSet.parse("2-3"))
    assert report.written == 0
    assert affinities(proc)[24] == "0-1,4-7"
    again.apply(CPUSet())
    assert affinities(proc) == ORIGINAL


def test_a_record_of_another_boot_is_dropped(tmp_path: Path, proc: Path) -> None:
    svc = service(tmp_path, Claims())
    svc.apply(CPUSet.parse("2-3"))
    rebooted = IrqIsolation(str(proc), str(tmp_path / "state"), boot_id="boot-2", view=Claims())
    rebooted.load()
    assert rebooted.record.empty


def test_managed_interrupts_are_counted_and_not_tried_again(tmp_path: Path, proc: Path) -> None:
    registry = CollectorRegistry()
    svc = service(tmp_path, Claims(), metrics=IrqMetrics(registry))
    svc.proc = ManagedProc(str(proc), managed={27})
    report = svc.apply(CPUSet.parse("2-3"))
    assert report.refused == [27]
    assert affinities(proc)[27] == "0-7"
    assert registry.get_sample_value("dracpu_irq_unmoved", {"reason": "refused"}) == 1
    assert registry.get_sample_value("dracpu_irq_unmoved", {"reason": "would-empty"}) == 1
    assert registry.get_sample_value("dracpu_irq_banned_cpus") == 2
    # The default affinity and interrupt 24 moved; 27 is managed.
    assert registry.get_sample_value("dracpu_irq_affinity_writes_total", {"result": "refused"}) == 1
    assert registry.get_sample_value("dracpu_irq_affinity_writes_total", {"result": "success"}) == 2
    svc.proc.attempts.clear()
    report = svc.apply(CPUSet.parse("2-3"))
    assert report.refused == [27] and 27 not in svc.proc.attempts
    svc.apply(CPUSet())
    assert registry.get_sample_value("dracpu_irq_unmoved", {"reason": "refused"}) == 0
    assert affinities(proc) == ORIGINAL


def test_eperm_is_a_refusal_too(tmp_path: Path, proc: Path) -> None:
    # Linux 6.12 and later answer EPERM where older kernels answered EIO.
    svc = service(tmp_path, Claims())
    svc.proc = ManagedProc(str(proc), managed={24}, errno_=errno.EPERM)
    assert svc.apply(CPUSet.parse("2-3")).refused == [24]


def test_other_write_errors_are_reported_and_retried(tmp_path: Path, proc: Path) -> None:
    svc = service(tmp_path, Claims())
    svc.proc = ManagedProc(str(proc), managed={24}, errno_=errno.ENOSPC)
    report = svc.apply(CPUSet.parse("2-3"))
    assert list(report.errors) == [24]
    assert "cannot write" in report.errors[24] and "smp_affinity_list" in report.errors[24]
    svc.proc = ManagedProc(str(proc), managed=set())
    assert svc.apply(CPUSet.parse("2-3")).errors == {}
    assert affinities(proc)[24] == "0-1,4-7"


def test_a_vanished_interrupt_is_forgotten(tmp_path: Path, proc: Path) -> None:
    svc = service(tmp_path, Claims())
    svc.apply(CPUSet.parse("2-3"))
    (proc / "irq" / "27" / "smp_affinity_list").unlink()
    (proc / "irq" / "27").rmdir()
    svc.apply(CPUSet())
    assert affinities(proc) == {k: v for k, v in ORIGINAL.items() if k != 27}
    assert svc.record.empty


def test_bad_default_affinity_is_a_clear_error_and_loses_nothing(
    tmp_path: Path, proc: Path
) -> None:
    svc = service(tmp_path, Claims())
    svc.apply(CPUSet.parse("2-3"))
    saved = (tmp_path / "state" / RECORD_FILE).read_bytes()
    before = affinities(proc)
    (proc / "irq" / "default_smp_affinity").write_text("not a mask\n")
    with pytest.raises(IrqFileError) as info:
        svc.apply(CPUSet())
    assert str(info.value) == (
        f"\"{proc}/irq/default_smp_affinity\": 'not a mask\\n' is not a hex CPU mask "
        "(comma-separated 32-bit hex words, such as ff,ffffffff)"
    )
    assert (tmp_path / "state" / RECORD_FILE).read_bytes() == saved
    assert affinities(proc) == before
    (proc / "irq" / "default_smp_affinity").write_text("f3\n")
    svc.apply(CPUSet())
    assert_all_restored(proc)


def test_a_bad_interrupt_file_is_reported_and_its_original_kept(tmp_path: Path, proc: Path) -> None:
    svc = service(tmp_path, Claims())
    svc.apply(CPUSet.parse("2-3"))
    (proc / "irq" / "24" / "smp_affinity_list").write_text("garbage\n")
    report = svc.apply(CPUSet())
    assert report.errors == {
        24: f"\"{proc}/irq/24/smp_affinity_list\": 'garbage\\n' is not a CPU list "
        "(invalid cpuset 'garbage\\n': not a cpu id or range: 'garbage')"
    }
    assert svc.record.originals == {24: CPUSet.parse("0-7")}
    assert affinities(proc)[27] == "0-7"
    (proc / "irq" / "24" / "smp_affinity_list").write_text("0-1,4-7\n")
    svc.apply(CPUSet())
    assert affinities(proc) == ORIGINAL and svc.record.empty


def test_a_corrupt_record_is_moved_aside_and_named(tmp_path: Path, proc: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / RECORD_FILE).write_text('{"version": 1, "boot_id": ')
    svc = service(tmp_path, Claims())
    assert svc.record.empty
    assert (tmp_path / "state" / (RECORD_FILE + ".corrupt")).exists()


async def test_the_service_follows_claim_changes(tmp_path: Path, proc: Path) -> None:
    claims = Claims()
    claims.records = [claim("a", "2-3")]
    svc = IrqIsolation(
        str(proc), str(tmp_path / "state"), boot_id="boot-1", view=claims, resync_interval=5
    )
    send, receive = trio.open_memory_channel[object](10)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run, receive)
        assert affinities(proc)[24] == "0-1,4-7"  # the start-up pass, from the view
        claims.records.append(claim("b", "6-7", isolate=False))
        claims.records.append(claim("c", "5"))
        await send.send("prepared")
        await trio.testing.wait_all_tasks_blocked()
        while svc.passes < 2:
            await trio.sleep(0.01)
        assert affinities(proc)[24] == "0-1,4,6-7"
        claims.records = []
        await send.send("unprepared")
        while svc.passes < 3:
            await trio.sleep(0.01)
        assert affinities(proc) == ORIGINAL
        await send.aclose()
    assert svc.describe()["bannedCPUs"] == ""


async def test_the_service_resyncs_what_another_writer_moved_back(
    tmp_path: Path, proc: Path, autojump_clock: trio.testing.MockClock
) -> None:
    claims = Claims()
    claims.records = [claim("a", "2-3")]
    svc = IrqIsolation(
        str(proc), str(tmp_path / "state"), boot_id="boot-1", view=claims, resync_interval=60
    )
    _send, receive = trio.open_memory_channel[object](10)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run, receive)
        (proc / "irq" / "24" / "smp_affinity_list").write_text("0-7\n")  # irqbalance
        await trio.sleep(59)
        assert affinities(proc)[24] == "0-7" and svc.passes == 1
        while svc.passes < 2:
            await trio.sleep(1)
        assert affinities(proc)[24] == "0-1,4-7"
        nursery.cancel_scope.cancel()
