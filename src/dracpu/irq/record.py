"""What dracpu changed in /proc/irq, kept on disk: ``<state dir>/irq-affinity.json``.

A sibling of the checkpoint rather than part of it: the checkpoint says which claims are
prepared (and so, with their options and the node config, which CPUs are banned); this file
says, for each interrupt dracpu owns, what it had before dracpu changed it (``originals``)
and what dracpu wrote (``written``; ``pending`` while a pass is writing). A mask that no
longer reads what dracpu wrote is another writer's and is not given back (``plan.py``). It
is written atomically (``atomicfile.atomic_write``) before any mask changes to something
other than its original, so after a restart or a kill -9 the next pass knows every mask it
owns: with the claims restored from the checkpoint it keeps their ban, without them it
gives back what it owns.

    {"version": 2, "boot_id": "...", "banned": "2-3", "present": "0-40",
     "default_original": "ff", "default_written": "f3",
     "originals": {"24": "0-7"}, "written": {"24": "0-1,4-7"}, "pending": {}}

Version 1 (no ``written``) is still read: that dracpu always wrote ``original - banned``
(the original when that was empty), so that is what it owns. After a reboot the kernel
starts every interrupt afresh, so a record from another boot is dropped. A record that
cannot be decoded is moved aside (``.corrupt``) and reported: the masks then read as
other writers' choices, and only banned CPUs are cleared from them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import msgspec

from dracpu.atomicfile import atomic_write
from dracpu.cpuset import CPUSet
from dracpu.irq.masks import HexMask, MaskFormatError, parse_cpu_list, parse_hex_mask

__all__ = ["RECORD_FILE", "RECORD_VERSION", "IrqRecord", "IrqRecordError", "RecordFile"]

RECORD_FILE = "irq-affinity.json"
RECORD_VERSION = 2
_READABLE_VERSIONS = (1, 2)


class IrqRecordError(Exception):
    """The record cannot be read or written; the message names the file."""


class _Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    version: int
    boot_id: str
    banned: str = ""
    present: str = ""
    default_original: str = ""
    default_written: str = ""
    default_pending: str = ""
    originals: dict[str, str] = {}
    written: dict[str, str] = {}
    pending: dict[str, str] = {}


@dataclass(frozen=True, slots=True)
class IrqRecord:
    """The masks dracpu owns (their originals, what it wrote), and what it banned.

    ``present``: the interrupts the last pass saw (None: not known, as after a version 1
    record). ``pending``/``default_pending``: what a pass is about to write, on disk
    before it writes, so a crash in between still knows those masks for dracpu's.
    """

    boot_id: str = ""
    banned: CPUSet = field(default_factory=CPUSet)
    default_original: HexMask | None = None
    originals: dict[int, CPUSet] = field(default_factory=dict)
    written: dict[int, CPUSet] = field(default_factory=dict)
    default_written: HexMask | None = None
    pending: dict[int, CPUSet] = field(default_factory=dict)
    default_pending: HexMask | None = None
    present: CPUSet | None = None

    @property
    def empty(self) -> bool:
        return not self.banned and self.default_original is None and not self.originals


_DECODER = msgspec.json.Decoder(_Wire)
_ENCODER = msgspec.json.Encoder(order="sorted")


def _lists(masks: dict[int, CPUSet]) -> dict[str, str]:
    return {str(irq): cpus.format() for irq, cpus in sorted(masks.items())}


def _hex(mask: HexMask | None) -> str:
    return mask.format() if mask is not None else ""


def encode_record(record: IrqRecord) -> bytes:
    wire = _Wire(
        version=RECORD_VERSION,
        boot_id=record.boot_id,
        banned=record.banned.format(),
        present=record.present.format() if record.present is not None else "",
        default_original=_hex(record.default_original),
        default_written=_hex(record.default_written),
        default_pending=_hex(record.default_pending),
        originals=_lists(record.originals),
        written=_lists(record.written),
        pending=_lists(record.pending),
    )
    return _ENCODER.encode(wire)


def _parse_lists(name: str, wire: dict[str, str]) -> dict[int, CPUSet]:
    out: dict[int, CPUSet] = {}
    for key, text in wire.items():
        if not (key.isascii() and key.isdigit()):
            raise IrqRecordError(f"{name}: {key!r} is not an interrupt number")
        out[int(key)] = parse_cpu_list(text)
    return out


def _written_by_v1(banned: CPUSet, original: CPUSet) -> CPUSet:
    """What a version 1 dracpu wrote: the original without the banned CPUs, or the
    original when that left nothing."""
    return (original - banned) or original


def decode_record(data: bytes) -> IrqRecord:
    """Parse a record; every problem is an IrqRecordError naming what is wrong."""
    try:
        wire = _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise IrqRecordError(f"not a record of interrupt affinities: {exc}") from None
    if wire.version not in _READABLE_VERSIONS:
        raise IrqRecordError(
            f"unsupported record version {wire.version} (supported: 1 and {RECORD_VERSION})"
        )
    if wire.version == 1 and (
        wire.written or wire.pending or wire.present or wire.default_written or wire.default_pending
    ):
        raise IrqRecordError("a version 1 record has only banned, default_original and originals")
    try:
        banned = parse_cpu_list(wire.banned)
        default = parse_hex_mask(wire.default_original) if wire.default_original else None
        originals = _parse_lists("originals", wire.originals)
        written = _parse_lists("written", wire.written)
        pending = _parse_lists("pending", wire.pending)
        default_written = parse_hex_mask(wire.default_written) if wire.default_written else None
        default_pending = parse_hex_mask(wire.default_pending) if wire.default_pending else None
        present = parse_cpu_list(wire.present) if wire.present else None
    except MaskFormatError as exc:
        raise IrqRecordError(f"not a record of interrupt affinities: {exc}") from None
    if wire.version == 1:
        written = {irq: _written_by_v1(banned, cpus) for irq, cpus in originals.items()}
        if default is not None:
            default_written = default.with_cpus(_written_by_v1(banned, default.cpus))
    for name, masks in (("written", written), ("pending", pending)):
        stray = sorted(set(masks) - set(originals))
        if stray:
            raise IrqRecordError(f"{name}: interrupt {stray[0]} has no original")
    if (default_written is not None or default_pending is not None) and default is None:
        raise IrqRecordError("default_written without default_original")
    return IrqRecord(
        boot_id=wire.boot_id,
        banned=banned,
        default_original=default,
        originals=originals,
        written=written,
        default_written=default_written,
        pending=pending,
        default_pending=default_pending,
        present=present,
    )


class RecordFile:
    """The record in ``state_dir`` (blocking)."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, RECORD_FILE)

    def load(self, boot_id: str) -> tuple[IrqRecord, str]:
        """The record of this boot (empty if none) and a note saying what was dropped."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(16 * 1024 * 1024)
        except FileNotFoundError:
            return IrqRecord(boot_id=boot_id), ""
        except OSError as exc:
            raise IrqRecordError(f'cannot read "{self.path}": {exc.strerror or exc}') from None
        try:
            record = decode_record(data)
        except IrqRecordError as exc:
            aside = self.path + ".corrupt"
            try:
                os.replace(self.path, aside)
            except OSError:
                aside = ""
            moved = f" (moved to {aside})" if aside else ""
            note = (
                f'"{self.path}": {exc}{moved}; the current interrupt masks are taken as '
                "their originals"
            )
            return IrqRecord(boot_id=boot_id), note
        if record.boot_id != boot_id:
            return IrqRecord(boot_id=boot_id), (
                f'"{self.path}" is from another boot: the kernel reset every interrupt '
                "affinity since, so it is dropped"
            )
        return record, ""

    def save(self, record: IrqRecord) -> None:
        try:
            atomic_write(self.path, encode_record(record), dir_mode=0o750)
        except OSError as exc:
            raise IrqRecordError(f'failed to write "{self.path}": {exc.strerror or exc}') from None
