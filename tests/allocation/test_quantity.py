"""Kubernetes quantity parsing for consumed capacity (behavior.md §8.4)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dracpu.allocation.quantity import FORMAT_WRONG, OUT_OF_RANGE, QuantityError, is_whole
from dracpu.allocation.quantity import parse_quantity as q


@pytest.mark.parametrize(
    ("text", "value", "whole"),
    [
        ("2", Fraction(2), True),
        ("2000m", Fraction(2), True),
        ("1500m", Fraction(3, 2), False),
        ("500m", Fraction(1, 2), False),
        ("0", Fraction(0), True),
        ("-1", Fraction(-1), True),
        ("+3", Fraction(3), True),
        ("007", Fraction(7), True),
        ("1.5", Fraction(3, 2), False),
        ("1.", Fraction(1), True),
        (".5", Fraction(1, 2), False),
        ("0.000", Fraction(0), True),
        ("1k", Fraction(1000), True),
        ("1M", Fraction(10**6), True),
        ("2G", Fraction(2 * 10**9), True),
        ("1T", Fraction(10**12), True),
        ("1P", Fraction(10**15), True),
        ("1E", Fraction(10**18), True),
        ("1n", Fraction(1, 10**9), False),
        ("5u", Fraction(5, 10**6), False),
        ("1Ki", Fraction(1024), True),
        ("8Gi", Fraction(8 * 2**30), True),
        ("1Ei", Fraction(2**60), True),
        ("1e3", Fraction(1000), True),
        ("1E3", Fraction(1000), True),
        ("25e-1", Fraction(5, 2), False),
        ("2e+0", Fraction(2), True),
        ("-500m", Fraction(-1, 2), False),
    ],
)
def test_parse_quantity(text: str, value: Fraction, whole: bool) -> None:
    assert q(text) == value
    assert is_whole(q(text)) is whole


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", FORMAT_WRONG),
        ("abc", FORMAT_WRONG),
        ("1 ", FORMAT_WRONG),
        (" 1", FORMAT_WRONG),
        ("1.2.3", FORMAT_WRONG),
        (".", FORMAT_WRONG),
        ("-", FORMAT_WRONG),
        ("1e", FORMAT_WRONG),
        ("1K", FORMAT_WRONG),
        ("1ki", FORMAT_WRONG),
        ("1KiB", FORMAT_WRONG),
        ("1mm", FORMAT_WRONG),
        ("--1", FORMAT_WRONG),
        ("1e1.5", FORMAT_WRONG),
        ("\u0661", FORMAT_WRONG),
        ("1e65", OUT_OF_RANGE),
        ("1e-999999999", OUT_OF_RANGE),
        ("1" * 65, OUT_OF_RANGE),
    ],
)
def test_parse_quantity_errors(text: str, reason: str) -> None:
    with pytest.raises(QuantityError) as info:
        q(text)
    assert info.value.reason == reason
    assert info.value.text == text
    assert str(info.value).startswith("invalid quantity ")
    assert str(info.value).endswith(": " + reason)


def test_quantity_error_message_quotes_like_go() -> None:
    with pytest.raises(QuantityError) as info:
        q("garbage")
    assert str(info.value) == f'invalid quantity "garbage": {FORMAT_WRONG}'
