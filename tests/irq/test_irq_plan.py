"""One pass's plan: originals, wanted masks, what is left alone."""

from __future__ import annotations

from dracpu.cpuset import CPUSet
from dracpu.irq.masks import parse_hex_mask
from dracpu.irq.plan import plan_pass

C = CPUSet.parse
ALL8 = parse_hex_mask("ff")


def test_first_ban_remembers_every_interrupt_and_removes_the_banned_cpus() -> None:
    plan = plan_pass(
        banned=C("2-3"),
        current={24: C("0-7"), 25: C("4"), 26: C("0-1")},
        current_default=ALL8,
        originals={},
        default_original=None,
    )
    assert plan.originals == {24: C("0-7"), 25: C("4"), 26: C("0-1")}
    assert plan.writes == {24: C("0-1,4-7")}  # 25 and 26 already avoid 2-3
    assert plan.default_original == ALL8
    assert plan.default_write is not None and plan.default_write.format() == "f3"
    assert plan.would_empty == ()


def test_an_interrupt_only_on_banned_cpus_is_left_and_reported() -> None:
    plan = plan_pass(
        banned=C("2-3"),
        current={30: C("2-3"), 31: C("3")},
        current_default=ALL8,
        originals={},
        default_original=None,
    )
    assert plan.writes == {}
    assert plan.would_empty == (30, 31)


def test_a_wider_ban_starts_from_the_originals_not_the_current_masks() -> None:
    # First ban 2-3 made 24 0-1,4-7; now 4-7 are banned too, 2-3 no longer.
    plan = plan_pass(
        banned=C("4-7"),
        current={24: C("0-1,4-7")},
        current_default=parse_hex_mask("f3"),
        originals={24: C("0-7")},
        default_original=ALL8,
    )
    assert plan.writes == {24: C("0-3")}
    assert plan.default_write is not None and plan.default_write.format() == "0f"


def test_a_ban_that_would_empty_an_interrupt_gives_it_back_its_original() -> None:
    plan = plan_pass(
        banned=C("0-7"),
        current={24: C("0-1")},
        current_default=parse_hex_mask("03"),
        originals={24: C("0-7")},
        default_original=ALL8,
    )
    assert plan.writes == {24: C("0-7")}
    assert plan.would_empty == (24,)
    assert plan.default_would_empty
    assert plan.default_write is not None and plan.default_write.format() == "ff"


def test_nothing_banned_gives_every_original_back() -> None:
    plan = plan_pass(
        banned=CPUSet(),
        current={24: C("0-1,4-7"), 25: C("4"), 99: C("0-7")},
        current_default=parse_hex_mask("f3"),
        originals={24: C("0-7"), 25: C("4")},
        default_original=ALL8,
    )
    assert plan.writes == {24: C("0-7")}
    assert plan.originals == {24: C("0-7"), 25: C("4")}  # 99 was never touched
    assert plan.default_write is not None and plan.default_write.format() == "ff"


def test_an_interrupt_born_from_the_restricted_default_gets_the_original_default() -> None:
    # 40 appeared while the default was f3 (2-3 banned): it was born with that mask.
    plan = plan_pass(
        banned=C("2-3"),
        current={24: C("0-1,4-7"), 40: C("0-1,4-7"), 41: C("5")},
        current_default=parse_hex_mask("f3"),
        originals={24: C("0-7")},
        default_original=ALL8,
    )
    assert plan.originals[40] == C("0-7")
    assert plan.originals[41] == C("5")
    assert plan.writes == {}
    released = plan_pass(
        banned=CPUSet(),
        current={24: C("0-1,4-7"), 40: C("0-1,4-7"), 41: C("5")},
        current_default=parse_hex_mask("f3"),
        originals=plan.originals,
        default_original=ALL8,
    )
    assert released.writes == {24: C("0-7"), 40: C("0-7")}


def test_vanished_interrupts_are_forgotten() -> None:
    plan = plan_pass(
        banned=C("2"),
        current={24: C("0-1")},
        current_default=parse_hex_mask("fb"),
        originals={24: C("0-1"), 25: C("0-7")},
        default_original=ALL8,
    )
    assert plan.originals == {24: C("0-1")}
