"""One pass's plan: what dracpu owns, what it writes, what it leaves to other writers."""

from __future__ import annotations

from collections.abc import Mapping

from dracpu.cpuset import CPUSet
from dracpu.irq.masks import HexMask, parse_hex_mask
from dracpu.irq.plan import IrqPass, plan_pass

C = CPUSet.parse
ALL8 = parse_hex_mask("ff")
Masks = Mapping[int, str] | Mapping[int, CPUSet]


def plan(
    banned: str,
    current: Mapping[int, str],
    *,
    default: str = "ff",
    originals: Masks | None = None,
    written: Masks | None = None,
    default_original: str | None = None,
    default_written: str | None = None,
    pending: Masks | None = None,
    present: str | None = None,
    online: str | None = None,
) -> IrqPass:
    def sets(m: Masks | None) -> dict[int, CPUSet]:
        return {k: v if isinstance(v, CPUSet) else C(v) for k, v in (m or {}).items()}

    def hexmask(text: str | None) -> HexMask | None:
        return parse_hex_mask(text) if text is not None else None

    return plan_pass(
        banned=C(banned),
        current=sets(current),
        current_default=parse_hex_mask(default),
        originals=sets(originals),
        written=sets(written),
        default_original=hexmask(default_original),
        default_written=hexmask(default_written),
        pending=sets(pending),
        present=C(present) if present is not None else None,
        online=C(online) if online is not None else None,
    )


def test_first_ban_clears_the_banned_cpus_and_owns_only_what_it_writes() -> None:
    p = plan("2-3", {24: "0-7", 25: "4", 26: "0-1"})
    assert p.writes == {24: C("0-1,4-7")}  # 25 and 26 already avoid 2-3: not dracpu's
    assert p.originals == {24: C("0-7")}
    assert p.written == {24: C("0-1,4-7")}
    assert p.default_original == ALL8
    assert p.default_write is not None and p.default_write.format() == "f3"
    assert p.default_written == p.default_write
    assert p.would_empty == ()


def test_an_interrupt_only_on_banned_cpus_is_left_and_reported() -> None:
    p = plan("2-3", {30: "2-3", 31: "3"})
    assert p.writes == {}
    assert p.would_empty == (30, 31)
    assert p.originals == {}


def test_irqbalance_moving_an_interrupt_off_the_ban_is_left_alone() -> None:
    # dracpu wrote 0-1,4-7 for IRQ 24; irqbalance (CPUs 2-3 banned in its config) moved it
    # to CPU 5. The resync must neither write 0-1,4-7 back nor give 0-7 back later.
    p = plan(
        "2-3",
        {24: "5"},
        default="f3",
        originals={24: "0-7"},
        written={24: "0-1,4-7"},
        default_original="ff",
        default_written="f3",
        present="24",
    )
    assert p.writes == {}
    assert p.originals == {}  # irqbalance's now: nothing of dracpu's to give back
    released = plan("", {24: "5"}, default="f3", default_original="ff", default_written="f3")
    assert released.writes == {}


def test_an_admin_pinned_queue_is_not_widened() -> None:
    # The admin pinned IRQ 40 to CPU 1 after dracpu banned 2-3: never widened again.
    owned = {"originals": {40: "0-7"}, "written": {40: "0-1,4-7"}}
    p = plan("2-3", {40: "1"}, default="f3", default_original="ff", default_written="f3", **owned)  # type: ignore[arg-type]
    assert p.writes == {} and 40 not in p.originals


def test_another_writers_mask_on_banned_cpus_loses_only_the_banned_ones() -> None:
    # irqbalance put 24 on 3,6 (3 banned): dracpu clears 3 and gives 3,6 back later.
    p = plan("2-3", {24: "3,6"}, originals={24: "0-7"}, written={24: "0-1,4-7"})
    assert p.writes == {24: C("6")}
    assert p.originals == {24: C("3,6")} and p.written == {24: C("6")}
    released = plan("", {24: "6"}, originals=p.originals, written=p.written)
    assert released.writes == {24: C("3,6")}


def test_now_minus_banned_empty_falls_back_to_the_original_minus_banned() -> None:
    p = plan("2-3", {24: "2"}, originals={24: "0-7"}, written={24: "0-1,4-7"})
    assert p.writes == {24: C("0-1,4-7")}
    assert p.originals == {24: C("2")}  # what it replaced, given back at the end


def test_a_changed_ban_recomputes_owned_masks_from_their_originals() -> None:
    # First ban 2-3 made 24 0-1,4-7; now 4-7 are banned, 2-3 no longer.
    p = plan(
        "4-7",
        {24: "0-1,4-7"},
        default="f3",
        originals={24: "0-7"},
        written={24: "0-1,4-7"},
        default_original="ff",
        default_written="f3",
    )
    assert p.writes == {24: C("0-3")}
    assert p.default_write is not None and p.default_write.format() == "0f"


def test_a_mask_about_to_be_written_when_a_pass_stopped_is_still_dracpus() -> None:
    # A crash between the record (pending 0-3) and the write's end: either mask is owned.
    for now in ("0-1,4-7", "0-3"):
        p = plan(
            "4-7", {24: now}, originals={24: "0-7"}, written={24: "0-1,4-7"}, pending={24: "0-3"}
        )
        assert p.originals == {24: C("0-7")} and p.written == {24: C("0-3")}


def test_a_ban_that_would_empty_an_owned_interrupt_gives_it_its_original() -> None:
    p = plan(
        "0-7",
        {24: "0-1"},
        default="03",
        originals={24: "0-7"},
        written={24: "0-1"},
        default_original="ff",
        default_written="03",
    )
    assert p.writes == {24: C("0-7")}
    assert p.would_empty == (24,)
    assert p.originals == {24: C("0-7")} and p.written == {24: C("0-7")}  # still dracpu's
    assert p.default_would_empty
    assert p.default_write is not None and p.default_write.format() == "ff"
    assert p.default_original == ALL8


def test_nothing_banned_gives_back_only_what_still_reads_as_written() -> None:
    p = plan(
        "",
        {24: "0-1,4-7", 25: "6", 99: "0-7"},
        default="f3",
        originals={24: "0-7", 25: "0-7"},
        written={24: "0-1,4-7", 25: "0-1,4-7"},
        default_original="ff",
        default_written="f3",
    )
    assert p.writes == {24: C("0-7")}  # 25 was moved by someone else since; 99 never ours
    assert p.originals == {}
    assert p.default_write is not None and p.default_write.format() == "ff"


def test_an_admin_default_is_not_overwritten_at_give_back() -> None:
    p = plan("", {}, default="0f", default_original="ff", default_written="f3")
    assert p.default_write is None and p.default_original is None


def test_an_admin_default_without_banned_cpus_is_left_while_banning() -> None:
    p = plan("2-3", {}, default="c0", default_original="ff", default_written="f3")
    assert p.default_write is None and p.default_original is None


def test_an_interrupt_born_from_the_restricted_default_gets_the_original_default() -> None:
    # 40 appeared (not in the last pass) while the default was f3 (2-3 banned).
    kw = {"default": "f3", "default_original": "ff", "default_written": "f3"}
    p = plan(
        "2-3",
        {24: "0-1,4-7", 40: "0-1,4-7", 41: "5"},
        originals={24: "0-7"},
        written={24: "0-1,4-7"},
        present="24",
        **kw,  # type: ignore[arg-type]
    )
    assert p.originals == {24: C("0-7"), 40: C("0-7")}  # 41 is not dracpu's
    assert p.writes == {}
    released = plan(
        "", {24: "0-1,4-7", 40: "0-1,4-7", 41: "5"}, originals=p.originals, written=p.written, **kw
    )  # type: ignore[arg-type]
    assert released.writes == {24: C("0-7"), 40: C("0-7")}


def test_an_interrupt_present_before_with_the_default_mask_is_not_taken_for_born() -> None:
    kw = {"default": "f3", "default_original": "ff", "default_written": "f3"}
    p = plan("2-3", {42: "0-1,4-7"}, present="42", **kw)  # type: ignore[arg-type]
    assert p.originals == {}


def test_vanished_interrupts_are_forgotten() -> None:
    p = plan("2", {24: "0-1"}, originals={24: "0-1", 25: "0-7"}, written={24: "0-1", 25: "0-1"})
    assert set(p.originals) == {24}


# -- offline CPUs: the kernel refuses a mask with no online CPU (EINVAL) ------------------


def test_a_mask_left_with_only_offline_cpus_is_not_written() -> None:
    # 4-5 offline: 0-7 minus 0-3,6-7 leaves only 4-5, which the kernel would refuse.
    p = plan("0-3,6-7", {24: "0-7"}, online="0-3,6-7")
    assert p.writes == {}
    assert p.would_empty == (24,)
    assert p.default_write is None and p.default_would_empty


def test_an_offline_cpu_may_stay_in_a_mask_that_has_an_online_one() -> None:
    p = plan("2-3", {24: "0-7"}, online="0-3,6-7")
    assert p.writes == {24: C("0-1,4-7")}


def test_the_fallback_to_the_original_needs_an_online_cpu_too() -> None:
    # now - banned = 4 (offline); original - banned = 0-1,4-7 (0-1 online): that one.
    p = plan("2-3", {24: "3-4"}, originals={24: "0-7"}, written={24: "0-1,4-7"}, online="0-3")
    assert p.writes == {24: C("0-1,4-7")}


def test_a_give_back_to_an_offline_original_waits() -> None:
    p = plan(
        "",
        {24: "0-1"},
        default="03",
        originals={24: "4-5"},
        written={24: "0-1"},
        default_original="30",
        default_written="03",
        online="0-3",
    )
    assert p.writes == {} and p.waiting == (24,) and p.default_waiting
    assert p.originals == {24: C("4-5")}  # still owned: given back once 4 or 5 is online
    later = plan(
        "",
        {24: "0-1"},
        default="03",
        originals=p.originals,
        written=p.written,
        default_original="30",
        default_written="03",
        online="0-5",
    )
    assert later.writes == {24: C("4-5")}
    assert later.default_write is not None and later.default_write.format() == "30"
