"""What dracpu changed in /proc/irq, kept on disk: ``<state dir>/irq-affinity.json``.

A sibling of the checkpoint rather than part of it: the checkpoint says which claims are
prepared (and so, with their options and the node config, which CPUs are banned); this file
says what the interrupts had before dracpu changed them. It is written atomically
(``atomicfile.atomic_write``) before any mask changes, so after a restart or a kill -9 the
next pass computes every mask from the originals again: with the claims restored from the
checkpoint it bans their CPUs, without them it gives everything back.

    {"version": 1, "boot_id": "...", "banned": "2-3",
     "default_original": "ff", "originals": {"24": "0-7", "25": "0-7"}}

After a reboot the kernel starts every interrupt afresh, so a record from another boot is
dropped. A record that cannot be decoded is moved aside (``.corrupt``) and reported: the
current masks are then taken as the originals.
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
RECORD_VERSION = 1


class IrqRecordError(Exception):
    """The record cannot be read or written; the message names the file."""


class _Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    version: int
    boot_id: str
    banned: str = ""
    default_original: str = ""
    originals: dict[str, str] = {}


@dataclass(frozen=True, slots=True)
class IrqRecord:
    """The originals of every interrupt dracpu may have changed, and what it banned."""

    boot_id: str = ""
    banned: CPUSet = field(default_factory=CPUSet)
    default_original: HexMask | None = None
    originals: dict[int, CPUSet] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.banned and self.default_original is None and not self.originals


_DECODER = msgspec.json.Decoder(_Wire)
_ENCODER = msgspec.json.Encoder(order="sorted")


def encode_record(record: IrqRecord) -> bytes:
    wire = _Wire(
        version=RECORD_VERSION,
        boot_id=record.boot_id,
        banned=record.banned.format(),
        default_original=record.default_original.format() if record.default_original else "",
        originals={str(irq): cpus.format() for irq, cpus in sorted(record.originals.items())},
    )
    return _ENCODER.encode(wire)


def decode_record(data: bytes) -> IrqRecord:
    """Parse a record; every problem is an IrqRecordError naming what is wrong."""
    try:
        wire = _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise IrqRecordError(f"not a record of interrupt affinities: {exc}") from None
    if wire.version != RECORD_VERSION:
        raise IrqRecordError(
            f"unsupported record version {wire.version} (supported: {RECORD_VERSION})"
        )
    try:
        banned = parse_cpu_list(wire.banned)
        default = parse_hex_mask(wire.default_original) if wire.default_original else None
        originals: dict[int, CPUSet] = {}
        for key, text in wire.originals.items():
            if not (key.isascii() and key.isdigit()):
                raise IrqRecordError(f"originals: {key!r} is not an interrupt number")
            originals[int(key)] = parse_cpu_list(text)
    except MaskFormatError as exc:
        raise IrqRecordError(f"not a record of interrupt affinities: {exc}") from None
    return IrqRecord(
        boot_id=wire.boot_id, banned=banned, default_original=default, originals=originals
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
