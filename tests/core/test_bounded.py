"""dracpu.bounded: a cache dict that starts over at its bound."""

from __future__ import annotations

from dracpu.bounded import remember


def test_remember_returns_the_value_and_starts_over_when_full() -> None:
    cache: dict[str, int] = {}
    assert [remember(cache, f"k{i}", i, 3) for i in range(3)] == [0, 1, 2]
    assert cache == {"k0": 0, "k1": 1, "k2": 2}
    assert remember(cache, "k3", 3, 3) == 3
    assert cache == {"k3": 3}  # never more than the bound, whatever the input
    remember(cache, "k3", 4, 3)  # an existing key is replaced
    assert cache == {"k3": 4}
