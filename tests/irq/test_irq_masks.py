"""The /proc/irq mask formats: %*pb hex chunks and the list format."""

from __future__ import annotations

import pytest

from dracpu.cpuset import CPUSet
from dracpu.irq.masks import HexMask, MaskFormatError, parse_cpu_list, parse_hex_mask


@pytest.mark.parametrize(
    ("text", "cpus", "chunks", "first_width"),
    [
        # nr_cpu_ids 4: one chunk of one digit
        ("f\n", "0-3", 1, 1),
        # 8 CPUs with CPU 2-3 removed
        ("f3\n", "0-1,4-7", 1, 2),
        # 32 CPUs: exactly one full chunk
        ("ffffffff\n", "0-31", 1, 8),
        # 80 CPUs: a 16-bit chunk, then two full ones
        ("ffff,ffffffff,ffffffff\n", "0-79", 3, 4),
        # 64 CPUs, only CPU 0 and 63
        ("80000000,00000001", "0,63", 2, 8),
    ],
)
def test_hex_masks_as_the_kernel_prints_them(
    text: str, cpus: str, chunks: int, first_width: int
) -> None:
    mask = parse_hex_mask(text)
    assert mask.cpus == CPUSet.parse(cpus)
    assert (mask.chunks, mask.first_width) == (chunks, first_width)
    assert mask.format() == text.strip()


def test_format_keeps_the_width_it_was_read_with() -> None:
    mask = parse_hex_mask("ffff,ffffffff,ffffffff\n")
    assert mask.with_cpus(CPUSet.parse("0-1,40-79")).format() == "ffff,ffffff00,00000003"
    assert mask.with_cpus(CPUSet.parse("0")).format() == "0000,00000000,00000001"


def test_format_grows_when_the_cpus_need_more_chunks() -> None:
    assert HexMask(cpus=CPUSet.parse("0,40"), chunks=1, first_width=2).format() == (
        "00000100,00000001"
    )


@pytest.mark.parametrize("text", ["", "\n", "xyz", "ff,,ff", "0x3", "ff ff", "1ffffffff", "f\n\n"])
def test_bad_hex_masks_are_named(text: str) -> None:
    with pytest.raises(MaskFormatError) as info:
        parse_hex_mask(text)
    assert repr(text) in str(info.value)
    assert "is not a hex CPU mask" in str(info.value)


def test_a_huge_hex_mask_is_refused_without_parsing_it() -> None:
    with pytest.raises(MaskFormatError):
        parse_hex_mask(",".join(["ffffffff"] * 5000))


def test_cpu_lists() -> None:
    assert parse_cpu_list("0-3,8\n") == CPUSet.parse("0-3,8")
    assert parse_cpu_list("\n") == CPUSet()


@pytest.mark.parametrize("text", ["0-", "a", "3-1", "0,,1", "1 2"])
def test_bad_cpu_lists_are_named(text: str) -> None:
    with pytest.raises(MaskFormatError) as info:
        parse_cpu_list(text)
    assert str(info.value).startswith(f"{text!r} is not a CPU list (")
