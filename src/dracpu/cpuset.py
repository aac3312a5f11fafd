"""Immutable CPU sets backed by an int bitmask, with the Linux list format.

The list format is what the kernel writes in sysfs and cgroupfs (``0-3,8,10-11``):
comma-separated items, each ``N`` or ``A-B`` (inclusive, A <= B). Formatting writes every
maximal run of two or more ids as ``A-B``; the empty set formats as the empty string.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from dracpu.bounded import remember

__all__ = ["CPUSet", "CPUSetParseError", "parse_cpuset"]

# A cpu id far beyond any real machine; it bounds the bitmask a hostile string could build.
MAX_CPU_ID = 1 << 16


class CPUSetParseError(ValueError):
    """A cpuset string is not in the Linux list format; the message names the bad token."""

    def __init__(self, text: str, token: str, reason: str) -> None:
        self.text = text
        self.token = token
        self.reason = reason
        super().__init__(f"invalid cpuset {text!r}: {reason}: {token!r}")


def _parse_id(text: str, item: str, part: str) -> int:
    # int() would accept "+1", " 1", "1_0" and non-ASCII digits; the kernel format does not.
    if not part or not part.isascii() or not part.isdigit():
        raise CPUSetParseError(text, item, "not a cpu id or range")
    value = int(part)
    if value > MAX_CPU_ID:
        raise CPUSetParseError(text, item, f"cpu id above {MAX_CPU_ID}")
    return value


# Parsed strings (see CPUSet.parse); bounded, so hostile strings cannot grow it.
_FORMATTED: dict[int, str] = {}
_FORMATTED_BITS_LIMIT = 8192
_PARSED: dict[str, CPUSet] = {}
_PARSED_LIMIT = 1024
_PARSED_KEY_LIMIT = 256


class CPUSet:
    """A set of CPU ids. Hashable, immutable, iterates in ascending order."""

    __slots__ = ("_mask",)

    _mask: int

    def __init__(self, cpus: Iterable[int] = ()) -> None:
        mask = 0
        for cpu in cpus:
            if cpu < 0:
                raise ValueError(f"cpu id must not be negative: {cpu}")
            mask |= 1 << cpu
        object.__setattr__(self, "_mask", mask)

    @classmethod
    def from_mask(cls, mask: int) -> CPUSet:
        if mask < 0:
            raise ValueError("cpu mask must not be negative")
        new = cls.__new__(cls)
        object.__setattr__(new, "_mask", mask)
        return new

    @classmethod
    def range(cls, first: int, last: int) -> CPUSet:
        """The CPUs first..last inclusive (empty when last < first)."""
        if first < 0:
            raise ValueError(f"cpu id must not be negative: {first}")
        if last < first:
            return cls.from_mask(0)
        return cls.from_mask(((1 << (last - first + 1)) - 1) << first)

    @classmethod
    def parse(cls, text: str) -> CPUSet:
        """Parse the Linux list format. One trailing newline (as sysfs writes) is tolerated."""
        # A node has few distinct sets (the pool, the claims), parsed again and again from
        # intents and cgroup files; sets are immutable, so a parsed one is shared.
        if cls is not CPUSet or len(text) > _PARSED_KEY_LIMIT:
            return cls._parse(text)
        cached = _PARSED.get(text)
        if cached is not None:
            return cached
        return remember(_PARSED, text, cls._parse(text), _PARSED_LIMIT)

    @classmethod
    def _parse(cls, text: str) -> CPUSet:
        body = text[:-1] if text.endswith("\n") else text
        if body == "":
            return cls.from_mask(0)
        mask = 0
        for item in body.split(","):
            if item == "":
                raise CPUSetParseError(text, item, "empty item")
            first_s, dash, last_s = item.partition("-")
            first = _parse_id(text, item, first_s)
            if not dash:
                mask |= 1 << first
                continue
            last = _parse_id(text, item, last_s)
            if last < first:
                raise CPUSetParseError(text, item, "range end below its start")
            mask |= ((1 << (last - first + 1)) - 1) << first
        return cls.from_mask(mask)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CPUSet is immutable")

    @property
    def mask(self) -> int:
        return self._mask

    # -- container protocol -------------------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        mask = self._mask
        while mask:
            low = mask & -mask
            yield low.bit_length() - 1
            mask ^= low

    def __len__(self) -> int:
        return self._mask.bit_count()

    def __bool__(self) -> bool:
        return self._mask != 0

    def __contains__(self, cpu: object) -> bool:
        return isinstance(cpu, int) and cpu >= 0 and bool(self._mask >> cpu & 1)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CPUSet):
            return self._mask == other._mask
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._mask)

    # -- algebra ------------------------------------------------------------------------
    def __or__(self, other: CPUSet) -> CPUSet:
        return _of(self._mask | other._mask)

    def __and__(self, other: CPUSet) -> CPUSet:
        return _of(self._mask & other._mask)

    def __sub__(self, other: CPUSet) -> CPUSet:
        return _of(self._mask & ~other._mask)

    def __xor__(self, other: CPUSet) -> CPUSet:
        return _of(self._mask ^ other._mask)

    def __le__(self, other: CPUSet) -> bool:
        return self._mask & ~other._mask == 0

    def __lt__(self, other: CPUSet) -> bool:
        return self <= other and self._mask != other._mask

    def __ge__(self, other: CPUSet) -> bool:
        return other <= self

    def __gt__(self, other: CPUSet) -> bool:
        return other < self

    union = __or__
    intersection = __and__
    difference = __sub__

    def issubset(self, other: CPUSet) -> bool:
        return self <= other

    def isdisjoint(self, other: CPUSet) -> bool:
        return self._mask & other._mask == 0

    def add(self, cpu: int) -> CPUSet:
        if cpu < 0:
            raise ValueError(f"cpu id must not be negative: {cpu}")
        return _of(self._mask | 1 << cpu)

    def min(self) -> int:
        if not self._mask:
            raise ValueError("min() of an empty CPUSet")
        return (self._mask & -self._mask).bit_length() - 1

    def max(self) -> int:
        if not self._mask:
            raise ValueError("max() of an empty CPUSet")
        return self._mask.bit_length() - 1

    def sorted(self) -> list[int]:
        return list(self)

    # -- formatting ---------------------------------------------------------------------
    def format(self) -> str:
        # The same few sets (the pool, the claims) are formatted for every cgroup written:
        # their text is kept, as parsed sets are.
        mask = self._mask
        cached = _FORMATTED.get(mask)
        if cached is not None:
            return cached
        text = self._format()
        if mask.bit_length() <= _FORMATTED_BITS_LIMIT:  # no hostile-sized keys kept
            remember(_FORMATTED, mask, text, _PARSED_LIMIT)
        return text

    def _format(self) -> str:
        parts: list[str] = []
        mask = self._mask
        base = 0
        while mask:
            # skip the zero run, then measure the run of ones
            zeros = (mask & -mask).bit_length() - 1
            mask >>= zeros
            base += zeros
            ones = (~mask & (mask + 1)).bit_length() - 1
            last = base + ones - 1
            parts.append(str(base) if ones == 1 else f"{base}-{last}")
            mask >>= ones
            base += ones
        return ",".join(parts)

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return f"CPUSet({self.format()!r})"


def parse_cpuset(text: str) -> CPUSet:
    """Parse a cpuset that came from a user or a runtime, not from sysfs.

    ``CPUSet.parse`` forgives one trailing newline because sysfs files end with one; a
    value in an env entry, an opaque config or a checkpoint has no such excuse.
    """
    if text.endswith("\n"):
        raise CPUSetParseError(text, text.rsplit(",", 1)[-1], "not a cpu id or range")
    return CPUSet.parse(text)


_new = object.__new__
_set_mask = CPUSet._mask.__set__  # type: ignore[attr-defined,misc]  # the slot descriptor


def _of(mask: int) -> CPUSet:
    """A set from a mask known to be non-negative (the algebra's results): the hot path
    of every pool and claim computation, without ``from_mask``'s checks."""
    new = _new(CPUSet)
    _set_mask(new, mask)
    return new
