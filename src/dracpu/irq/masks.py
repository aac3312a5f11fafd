"""The two CPU mask formats of ``/proc/irq`` (pure).

- ``/proc/irq/default_smp_affinity`` and ``/proc/irq/N/smp_affinity`` print the mask with
  the kernel's ``%*pb`` format (lib/vsprintf.c ``bitmap_string``): ``nr_cpu_ids`` bits as
  hex, most significant first, in comma-separated 32-bit chunks. Every chunk but the first
  is zero-padded to 8 digits; the first is padded to the digits its leftover bits need
  (4 CPUs print ``f``, 80 CPUs ``ffff,ffffffff,ffffffff``). Writes are parsed by
  ``cpumask_parse_user`` (``bitmap_parse``), which takes the same shape.
- ``/proc/irq/N/smp_affinity_list`` prints ``%*pbl``, the Linux list format (``0-3,8``),
  and its writes are parsed by ``cpumask_parselist_user``.

``HexMask`` keeps the shape it was read with, so what dracpu writes back has the width the
kernel printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dracpu.cpuset import CPUSet, CPUSetParseError

__all__ = ["HexMask", "MaskFormatError", "parse_cpu_list", "parse_hex_mask"]

_CHUNK = re.compile(r"[0-9a-fA-F]{1,8}")
_MAX_CHUNKS = 1024  # 32768 CPUs: far beyond any nr_cpu_ids, so hostile text stays small


class MaskFormatError(ValueError):
    """Text that is not a mask of the expected format; the message quotes it."""


@dataclass(frozen=True, slots=True)
class HexMask:
    """A ``%*pb`` mask: the CPUs, and the shape to print them in (chunks, first width)."""

    cpus: CPUSet
    chunks: int = 1
    first_width: int = 8

    def format(self) -> str:
        """The mask in the shape it was read with (wider when ``cpus`` needs more bits)."""
        mask = self.cpus.mask
        chunks = max(self.chunks, (mask.bit_length() + 31) // 32, 1)
        first_width = self.first_width if chunks == self.chunks else 8
        words = [(mask >> (32 * i)) & 0xFFFFFFFF for i in reversed(range(chunks))]
        head = f"{words[0]:0{first_width}x}"
        return ",".join([head, *(f"{w:08x}" for w in words[1:])])

    def with_cpus(self, cpus: CPUSet) -> HexMask:
        return HexMask(cpus=cpus, chunks=self.chunks, first_width=self.first_width)


def parse_hex_mask(text: str) -> HexMask:
    """Parse ``%*pb`` text (one trailing newline allowed, as the kernel prints it)."""
    body = text[:-1] if text.endswith("\n") else text
    parts = body.split(",")
    if len(parts) > _MAX_CHUNKS or not all(_CHUNK.fullmatch(p) for p in parts):
        raise MaskFormatError(
            f"{_shown(text)} is not a hex CPU mask (comma-separated 32-bit hex words, "
            "such as ff,ffffffff)"
        )
    mask = 0
    for part in parts:
        mask = (mask << 32) | int(part, 16)
    return HexMask(cpus=CPUSet.from_mask(mask), chunks=len(parts), first_width=len(parts[0]))


def parse_cpu_list(text: str) -> CPUSet:
    """Parse ``%*pbl`` text (one trailing newline allowed)."""
    if len(text) > 64 * 1024:
        raise MaskFormatError(f"{_shown(text)} is not a CPU list: too long")
    try:
        return CPUSet.parse(text)
    except CPUSetParseError as exc:
        raise MaskFormatError(f"{_shown(text)} is not a CPU list ({exc})") from None


def _shown(text: str) -> str:
    short = text if len(text) <= 60 else text[:57] + "..."
    return repr(short)
