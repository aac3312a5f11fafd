"""Restart delays: exponential growth, cap, jitter bounds."""

from __future__ import annotations

import random

import pytest

from dracpu.nursery import restart_delay


def _delays(n: int, *, rand: float = 1.0, jitter: float = 0.0) -> list[float]:
    return [
        restart_delay(k, initial=0.5, factor=2.0, cap=10.0, jitter=jitter, rand=lambda: rand)
        for k in range(1, n + 1)
    ]


def test_exponential_then_capped() -> None:
    assert _delays(7) == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_factor_other_than_two() -> None:
    got = [
        restart_delay(k, initial=1.0, factor=3.0, cap=100.0, jitter=0.0, rand=lambda: 0.5)
        for k in (1, 2, 3, 4, 5)
    ]
    assert got == [1.0, 3.0, 9.0, 27.0, 81.0]


def test_jitter_scales_down_by_at_most_the_jitter_fraction() -> None:
    # rand() == 0 gives the lowest delay, rand() -> 1 the full one.
    assert _delays(3, rand=0.0, jitter=0.5) == [0.25, 0.5, 1.0]
    assert _delays(1, rand=0.5, jitter=0.5) == [0.375]
    rng = random.Random(3)
    for k in range(1, 40):
        d = restart_delay(k, initial=0.5, factor=2.0, cap=10.0, jitter=0.2, rand=rng.random)
        ceiling = min(10.0, 0.5 * 2 ** (k - 1))
        assert 0.8 * ceiling <= d <= ceiling


def test_huge_failure_count_stays_at_the_cap() -> None:
    assert (
        restart_delay(100_000, initial=0.5, factor=2.0, cap=30.0, jitter=0.0, rand=lambda: 0.0)
        == 30.0
    )


def test_failure_count_must_be_positive() -> None:
    with pytest.raises(ValueError, match="failures must be >= 1, got 0"):
        restart_delay(0, initial=1, factor=2, cap=3, jitter=0, rand=lambda: 0.0)
