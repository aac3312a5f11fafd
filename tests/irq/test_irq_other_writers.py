"""The interrupt service shares /proc/irq with irqbalance and the administrator, and with
CPU hotplug: the review's scenarios (issue 27), each against a fake procfs tree."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import pytest
import trio
import trio.testing
from fake_proc import affinities, default_mask, make_proc
from prometheus_client import CollectorRegistry

from dracpu.allocation.options import AllocationOptions
from dracpu.allocation.store import ClaimRecord
from dracpu.cpuset import CPUSet
from dracpu.irq.masks import HexMask
from dracpu.irq.metrics import IrqMetrics
from dracpu.irq.procfs import IrqWriteError, ProcIrq
from dracpu.irq.record import RECORD_FILE, IrqRecordError, decode_record
from dracpu.irq.service import IrqIsolation

C = CPUSet.parse
ORIGINAL = {24: "0-7", 25: "0-7", 40: "0-7"}


class Claims:
    """The owner's view as the service reads it: the prepared claims and the online CPUs
    (empty: not known, every CPU counts as online)."""

    def __init__(self, *records: ClaimRecord, online: str = "") -> None:
        self.records = list(records)
        self.online = C(online) if online else CPUSet()

    def claims(self) -> list[ClaimRecord]:
        return list(self.records)


def isolating(uid: str, cpus: str) -> ClaimRecord:
    return ClaimRecord(
        uid=uid,
        cpus=C(cpus),
        namespace="default",
        name=uid,
        options={"main": AllocationOptions(isolate_irqs=True)},
    )


def service(tmp_path: Path, claims: Claims | None = None, **kw: object) -> IrqIsolation:
    svc = IrqIsolation(
        str(tmp_path / "proc"),
        str(tmp_path / "state"),
        boot_id="boot-1",
        view=claims or Claims(),
        **kw,  # type: ignore[arg-type]
    )
    svc.load()
    return svc


def move(proc: Path, irq: int, cpus: str) -> None:
    """Another writer (irqbalance, the administrator) sets an interrupt's mask."""
    (proc / "irq" / str(irq) / "smp_affinity_list").write_text(cpus + "\n")


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    return make_proc(tmp_path, "ff", ORIGINAL)


# -- finding 1: irqbalance and the administrator -------------------------------------------


def test_irqbalance_moving_an_interrupt_within_the_allowed_cpus_is_not_undone(
    tmp_path: Path, proc: Path
) -> None:
    svc = service(tmp_path)
    svc.apply(C("2-3"))
    assert affinities(proc)[24] == "0-1,4-7"
    move(proc, 24, "5")  # irqbalance, CPUs 2-3 banned in its config
    for _ in range(3):  # resyncs
        assert svc.apply(C("2-3")).written == 0
    assert affinities(proc)[24] == "5"
    svc.apply(CPUSet())  # giveback: irqbalance's placement stays
    assert affinities(proc) == {24: "5", 25: "0-7", 40: "0-7"}
    assert svc.record.empty


def test_an_admin_pinned_queue_is_neither_widened_nor_reset(tmp_path: Path, proc: Path) -> None:
    svc = service(tmp_path)
    svc.apply(C("2-3"))
    move(proc, 40, "1")  # the administrator pins a NIC queue
    svc.apply(C("2-3"))
    assert affinities(proc)[40] == "1"
    svc.apply(CPUSet())
    assert affinities(proc)[40] == "1"


def test_a_mask_moved_onto_banned_cpus_loses_only_those(tmp_path: Path, proc: Path) -> None:
    svc = service(tmp_path)
    svc.apply(C("2-3"))
    move(proc, 25, "3,6")
    assert svc.apply(C("2-3")).written == 1
    assert affinities(proc)[25] == "6"
    svc.apply(CPUSet())
    assert affinities(proc)[25] == "3,6"  # the other writer's choice, not 0-7


def test_an_admin_default_affinity_is_kept(tmp_path: Path, proc: Path) -> None:
    svc = service(tmp_path)
    svc.apply(C("2-3"))
    assert default_mask(proc) == "f3"
    (proc / "irq" / "default_smp_affinity").write_text("c1\n")
    svc.apply(C("2-3"))
    assert default_mask(proc) == "c1"
    svc.apply(CPUSet())
    assert default_mask(proc) == "c1"


def test_a_crash_after_the_record_before_the_write_still_owns_the_mask(
    tmp_path: Path, proc: Path
) -> None:
    svc = service(tmp_path)
    svc.apply(C("2-3"))

    class Crash(Exception):
        pass

    def dies(irq: int, cpus: CPUSet) -> None:
        raise Crash

    svc.proc.write_affinity = dies  # type: ignore[method-assign]
    with pytest.raises(Crash):
        svc.apply(C("2-3,6-7"))  # the record with pending 0-1,4-5 is on disk already
    saved = json.loads((tmp_path / "state" / RECORD_FILE).read_text())
    assert saved["pending"]["24"] == "0-1,4-5"
    again = service(tmp_path)
    again.apply(C("2-3,6-7"))
    assert affinities(proc)[24] == "0-1,4-5"
    again.apply(CPUSet())
    assert affinities(proc) == ORIGINAL


def test_a_version_1_record_is_read_as_what_that_dracpu_wrote(tmp_path: Path, proc: Path) -> None:
    (tmp_path / "state").mkdir()
    move(proc, 24, "0-1,4-7")
    move(proc, 25, "6")  # irqbalance moved it after the older dracpu wrote 0-1,4-7
    (proc / "irq" / "default_smp_affinity").write_text("f3\n")
    (tmp_path / "state" / RECORD_FILE).write_text(
        json.dumps(
            {
                "version": 1,
                "boot_id": "boot-1",
                "banned": "2-3",
                "default_original": "ff",
                "originals": {"24": "0-7", "25": "0-7", "40": "0-7"},
            }
        )
    )
    svc = service(tmp_path)
    assert svc.record.written[24] == C("0-1,4-7")
    svc.apply(CPUSet())
    assert affinities(proc) == {24: "0-7", 25: "6", 40: "0-7"}
    assert default_mask(proc) == "ff"


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            {"version": 2, "boot_id": "b", "written": {"24": "1"}},
            "written: interrupt 24 has no original",
        ),
        (
            {"version": 2, "boot_id": "b", "default_written": "f3"},
            "default_written without default_original",
        ),
        (
            {"version": 1, "boot_id": "b", "written": {"24": "1"}, "originals": {"24": "0-1"}},
            "a version 1 record has only banned, default_original and originals",
        ),
        ({"version": 3, "boot_id": "b"}, "unsupported record version 3 (supported: 1 and 2)"),
        (
            {"version": 2, "boot_id": "b", "originals": {"24": "1"}, "pending": {"x": "1"}},
            "pending: 'x' is not an interrupt number",
        ),
        (
            {"version": 2, "boot_id": "b", "present": "zz"},
            "not a record of interrupt affinities: 'zz' is not a CPU list",
        ),
    ],
)
def test_bad_records_are_named(record: dict[str, object], message: str) -> None:
    with pytest.raises(IrqRecordError) as info:
        decode_record(json.dumps(record).encode())
    assert str(info.value).startswith(message)


# -- finding 2: offline CPUs ----------------------------------------------------------------


def test_a_mask_with_only_offline_cpus_left_is_not_written(tmp_path: Path, proc: Path) -> None:
    registry = CollectorRegistry()
    move(proc, 40, "4-7")
    svc = service(tmp_path, Claims(online="0-3,6-7"), metrics=IrqMetrics(registry))
    report = svc.apply(C("0-3,6-7"))  # 40 would keep only 4-5, both offline
    assert report.errors == {} and report.would_empty == [24, 25, 40]
    assert affinities(proc)[40] == "4-7"
    assert registry.get_sample_value("dracpu_irq_affinity_writes_total", {"result": "error"}) == 0
    assert registry.get_sample_value("dracpu_irq_unmoved", {"reason": "would-empty"}) == 3


async def test_hotplug_wakes_the_service_within_the_online_interval(
    tmp_path: Path, proc: Path, autojump_clock: trio.testing.MockClock
) -> None:
    move(proc, 40, "4-7")
    view = Claims(isolating("a", "6-7"), online="0-3,6-7")
    svc = IrqIsolation(
        str(proc),
        str(tmp_path / "state"),
        boot_id="boot-1",
        view=view,
        online_interval=5,
        resync_interval=600,
    )
    started: list[float] = []  # when each pass began (the mock clock runs on meanwhile)
    one_pass = svc._pass

    async def timed(banned: CPUSet) -> bool:
        started.append(trio.current_time())
        return await one_pass(banned)

    svc._pass = timed  # type: ignore[method-assign]
    _send, receive = trio.open_memory_channel[object](10)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run, receive)
        assert affinities(proc)[40] == "4-7" and svc.passes == 1  # would-empty: left
        view.online = C("0-7")  # 4-5 come online
        while svc.passes < 2:
            await trio.sleep(0.5)
        assert started[1] - started[0] <= 5  # the next online check, not the resync
        assert affinities(proc)[40] == "4-5"
        await trio.sleep(30)
        assert len(started) == 2  # nothing changed since: no pass until the resync
        nursery.cancel_scope.cancel()


# -- finding 5: a claim restored without its options --------------------------------------


def test_a_claim_restored_without_options_keeps_its_ban_until_unprepared(
    tmp_path: Path, proc: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = service(tmp_path)
    first.apply(C("2-3"))
    # The checkpoint was lost: the claim came back from its CDI spec, without options.
    restored = ClaimRecord(uid="u-1", cpus=C("2-3"), namespace="default", name="db")
    other = ClaimRecord(uid="u-2", cpus=C("6"), namespace="default", name="web")
    claims = Claims(restored, other)
    again = service(tmp_path, claims)
    with caplog.at_level(logging.WARNING, logger="dracpu.irq"):
        again.inherit(claims.claims())
    assert again.inherited == {"u-1": C("2-3")}
    named = [getattr(r, "dracpu_kv", {}).get("claim") for r in caplog.records]
    assert named == ["default/db"]  # web (u-2) was never banned
    assert again.banned_now() == C("2-3")
    assert again.describe()["inheritedBans"] == {"u-1": "2-3"}
    again.apply(again.banned_now())
    assert affinities(proc)[24] == "0-1,4-7"
    claims.records = [other]  # unprepared
    assert again.banned_now() == CPUSet()
    again.apply(again.banned_now())
    assert affinities(proc) == ORIGINAL


def test_nothing_is_inherited_without_a_ban_on_record(tmp_path: Path, proc: Path) -> None:
    claims = Claims(ClaimRecord(uid="u-1", cpus=C("2-3")))
    svc = service(tmp_path, claims)
    svc.inherit(claims.claims())
    assert svc.inherited == {} and svc.banned_now() == CPUSet()


def test_a_failed_default_write_keeps_the_default_only_if_it_was_dracpus(
    tmp_path: Path, proc: Path
) -> None:
    class NoDefault(ProcIrq):
        def write_default(self, mask: HexMask) -> None:
            raise IrqWriteError(self.default_path, errno.ENOSPC, "No space left on device")

    svc = service(tmp_path)
    svc.proc = NoDefault(str(proc))
    report = svc.apply(C("2-3"))  # never dracpu's: nothing of it to give back
    assert "No space left on device" in report.default_problem
    assert svc.record.default_original is None and default_mask(proc) == "ff"
    svc.proc = ProcIrq(str(proc))
    svc.apply(C("2-3"))
    assert default_mask(proc) == "f3"
    svc.proc = NoDefault(str(proc))
    svc.apply(C("2-3,6-7"))  # dracpu's f3 stays dracpu's, with its original
    assert default_mask(proc) == "f3"
    assert svc.record.default_original is not None
    assert svc.record.default_original.format() == "ff"
    svc.proc = ProcIrq(str(proc))
    svc.apply(CPUSet())
    assert default_mask(proc) == "ff"
