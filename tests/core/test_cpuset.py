"""CPUSet: Linux list format parse/format, algebra laws, immutability."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dracpu.cpuset import CPUSet, CPUSetParseError

ids = st.frozensets(st.integers(min_value=0, max_value=1100), max_size=80)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", set()),
        ("\n", set()),
        ("0", {0}),
        ("0-3\n", {0, 1, 2, 3}),
        ("0,2,4-6", {0, 2, 4, 5, 6}),
        ("5-5", {5}),
        ("3,1", {1, 3}),
        ("0-1,1-2", {0, 1, 2}),
        ("767", {767}),
    ],
)
def test_parse(text: str, expected: set[int]) -> None:
    assert set(CPUSet.parse(text)) == expected


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        (set(), ""),
        ({0, 1}, "0-1"),
        ({0, 2, 4, 5, 6}, "0,2,4-6"),
        ({7}, "7"),
        ({0, 1, 2, 3, 8, 10, 11}, "0-3,8,10-11"),
        (set(range(40, 80)), "40-79"),
    ],
)
def test_format(cpus: set[int], text: str) -> None:
    assert CPUSet(cpus).format() == text
    assert str(CPUSet(cpus)) == text


@pytest.mark.parametrize(
    ("text", "token", "reason"),
    [
        ("1,", "", "empty item"),
        (",1", "", "empty item"),
        (" 1", " 1", "not a cpu id or range"),
        ("-1", "-1", "not a cpu id or range"),
        ("3-1", "3-1", "range end below its start"),
        ("1-2-3", "1-2-3", "not a cpu id or range"),
        ("a", "a", "not a cpu id or range"),
        ("+1", "+1", "not a cpu id or range"),
        ("1_0", "1_0", "not a cpu id or range"),
        ("0-", "0-", "not a cpu id or range"),
        ("1\n\n", "1\n", "not a cpu id or range"),
        ("٣", "٣", "not a cpu id or range"),
        ("0-99999999", "0-99999999", "cpu id above 65536"),
    ],
)
def test_parse_errors_name_the_token(text: str, token: str, reason: str) -> None:
    with pytest.raises(CPUSetParseError) as info:
        CPUSet.parse(text)
    assert info.value.token == token
    assert str(info.value) == f"invalid cpuset {text!r}: {reason}: {token!r}"
    assert isinstance(info.value, ValueError)


def test_container_protocol() -> None:
    s = CPUSet([5, 1, 3])
    assert list(s) == [1, 3, 5]
    assert len(s) == 3
    assert 3 in s and 2 not in s and -1 not in s and "3" not in s
    assert s.min() == 1 and s.max() == 5
    assert bool(CPUSet()) is False
    assert CPUSet.range(2, 4) == CPUSet([2, 3, 4])
    assert CPUSet.range(4, 2) == CPUSet()
    assert s.add(0) == CPUSet([0, 1, 3, 5])
    assert repr(s) == "CPUSet('1,3,5')"


def test_immutable_and_hashable() -> None:
    s = CPUSet([1])
    with pytest.raises(AttributeError):
        s._mask = 3  # type: ignore[misc]
    assert {CPUSet([1, 2]): "a"}[CPUSet.parse("1-2")] == "a"


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match="negative"):
        CPUSet([-1])
    with pytest.raises(ValueError, match="negative"):
        CPUSet.from_mask(-1)
    with pytest.raises(ValueError, match="empty"):
        CPUSet().min()
    with pytest.raises(ValueError, match="empty"):
        CPUSet().max()


@given(ids)
def test_round_trip(cpus: frozenset[int]) -> None:
    s = CPUSet(cpus)
    assert set(s) == set(cpus)
    assert CPUSet.parse(s.format()) == s
    assert CPUSet.parse(s.format() + "\n") == s


@given(ids, ids, ids)
def test_algebra_matches_python_sets(
    a: frozenset[int], b: frozenset[int], c: frozenset[int]
) -> None:
    x, y, z = CPUSet(a), CPUSet(b), CPUSet(c)
    assert set(x | y) == a | b
    assert set(x & y) == a & b
    assert set(x - y) == a - b
    assert set(x ^ y) == a ^ b
    assert (x <= y) == (a <= b)
    assert (x < y) == (a < b)
    assert (x >= y) == (a >= b)
    assert x.isdisjoint(y) == a.isdisjoint(b)
    # laws
    assert (x | y) | z == x | (y | z)
    assert x & (y | z) == (x & y) | (x & z)
    assert x - (y | z) == (x - y) - z
    assert (x - y) | (x & y) == x


@given(st.text(alphabet="0123456789,-\n a", max_size=20))
def test_parse_never_raises_other_errors(text: str) -> None:
    try:
        s = CPUSet.parse(text)
    except CPUSetParseError:
        return
    assert CPUSet.parse(s.format()) == s


def test_parsed_sets_are_shared_and_the_cache_is_bounded() -> None:
    from dracpu import cpuset

    assert CPUSet.parse("0-3,8") is CPUSet.parse("0-3,8")
    # A bad string is never cached: it raises every time.
    for _ in range(2):
        with pytest.raises(CPUSetParseError):
            CPUSet.parse("3-1")
    long_text = ",".join(str(i) for i in range(0, 400, 2))
    assert len(long_text) > cpuset._PARSED_KEY_LIMIT
    assert CPUSet.parse(long_text) == CPUSet(range(0, 400, 2))
    assert long_text not in cpuset._PARSED
    for i in range(cpuset._PARSED_LIMIT + 10):
        CPUSet.parse(str(i))
    assert len(cpuset._PARSED) <= cpuset._PARSED_LIMIT
