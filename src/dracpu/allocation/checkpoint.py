"""Checkpoint of prepared claims: pure encode and decode (the file I/O lives elsewhere).

Upstream keeps nothing across a restart (behavior.md §18) and loses claims whose container
does not exist yet at the first Synchronize. dracpu writes this checkpoint after every
change of the allocation store and reads it at start: when the node did not reboot and the
configuration is the same (``is_driver_restart``), the claims in it are still prepared.

The file is JSON::

    {"version": 1, "boot_id": "...", "config_fingerprint": "...",
     "claims": [{"uid": "...", "cpus": "0-3", ...}], "checksum": "sha256:<hex>"}

``checksum`` is the SHA-256 of the canonical encoding of everything else (the same
document without ``checksum``, as msgspec writes it: fields in declaration order, no
whitespace). The version is checked before the schema, so a file from a newer dracpu is
reported as such and not as corruption.

Fields added to a claim's allocation options after version 1 (``isolate_irqs``) are left
out of the file while they hold their default, so a checkpoint written before they existed
keeps its checksum, and one written now reads the same in a dracpu that predates them
unless a claim uses them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from dracpu.allocation.store import ClaimRecord
from dracpu.cpuset import CPUSet, CPUSetParseError, parse_cpuset

__all__ = [
    "CHECKPOINT_VERSION",
    "Checkpoint",
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointVersionError",
    "checkpoint_checksum",
    "decode_checkpoint",
    "encode_checkpoint",
    "is_driver_restart",
]

CHECKPOINT_VERSION = 1
SUPPORTED_VERSIONS = frozenset({CHECKPOINT_VERSION})
_CHECKSUM_PREFIX = "sha256:"


class CheckpointError(Exception):
    """The checkpoint cannot be used."""


class CheckpointCorrupt(CheckpointError):
    """Not JSON, wrong shape (the message names the field path), or a checksum mismatch."""


class CheckpointVersionError(CheckpointError):
    """Written by a dracpu whose checkpoint format this one does not know."""

    def __init__(self, version: int) -> None:
        self.version = version
        known = ", ".join(str(v) for v in sorted(SUPPORTED_VERSIONS))
        super().__init__(f"unsupported checkpoint version {version} (supported: {known})")


class _Payload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    version: int
    boot_id: str
    config_fingerprint: str
    claims: tuple[ClaimRecord, ...] = ()


class Checkpoint(_Payload, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The prepared claims at one instant. ``checksum`` is filled in by the codec."""

    checksum: str = ""


class _Head(msgspec.Struct):
    """Just enough to read the version of any checkpoint, old or new."""

    version: int


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, CPUSet):
        return obj.format()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _dec_hook(typ: type, obj: Any) -> Any:
    if typ is CPUSet:
        if not isinstance(obj, str):
            raise TypeError(f"Expected `str`, got `{type(obj).__name__}`")
        try:
            return parse_cpuset(obj)
        except CPUSetParseError as exc:
            raise ValueError(str(exc)) from None
    raise NotImplementedError(f"cannot decode {typ.__name__}")


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)
# AllocationOptions fields newer than checkpoint version 1, with their defaults.
_LATER_OPTION_DEFAULTS = {"isolate_irqs": False}


def _encode(doc: _Payload) -> bytes:
    """The canonical bytes: msgspec's encoding, later option fields left out at default."""
    if not any(r.options for r in doc.claims):
        return _ENCODER.encode(doc)  # the usual case: no options, nothing to leave out
    data = msgspec.to_builtins(doc, enc_hook=_enc_hook)
    for claim in data["claims"]:
        for options in claim["options"].values():
            for name, default in _LATER_OPTION_DEFAULTS.items():
                if options.get(name, default) == default:
                    options.pop(name, None)
    return _ENCODER.encode(data)


_HEAD_DECODER = msgspec.json.Decoder(_Head)
_DECODER = msgspec.json.Decoder(Checkpoint, dec_hook=_dec_hook)


def checkpoint_checksum(cp: _Payload) -> str:
    payload = _Payload(
        version=cp.version,
        boot_id=cp.boot_id,
        config_fingerprint=cp.config_fingerprint,
        claims=cp.claims,
    )
    return _CHECKSUM_PREFIX + hashlib.sha256(_encode(payload)).hexdigest()


def encode_checkpoint(cp: Checkpoint) -> bytes:
    """The file content; the checksum is computed here, whatever ``cp.checksum`` says."""
    return _encode(msgspec.structs.replace(cp, checksum=checkpoint_checksum(cp)))


def decode_checkpoint(data: bytes) -> Checkpoint:
    """Parse and verify a checkpoint; every failure is a CheckpointError."""
    try:
        head = _HEAD_DECODER.decode(data)
    except msgspec.DecodeError as exc:
        # ValidationError is a DecodeError: covers bad JSON and a missing/odd version alike.
        raise CheckpointCorrupt(f"checkpoint is corrupt: {exc}") from None
    if head.version not in SUPPORTED_VERSIONS:
        raise CheckpointVersionError(head.version)
    try:
        cp = _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise CheckpointCorrupt(f"checkpoint is corrupt: {exc}") from None
    if cp.checksum != checkpoint_checksum(cp):
        raise CheckpointCorrupt(
            f"checkpoint is corrupt: checksum mismatch (stored {cp.checksum!r}, "
            f"computed {checkpoint_checksum(cp)!r})"
        )
    return cp


def is_driver_restart(cp: Checkpoint, boot_id: str, config_fingerprint: str) -> bool:
    """True when only the driver restarted: same boot, same configuration.

    After a reboot every container is gone and the claims must be prepared again; after a
    configuration change (reserved CPUs, device mode) the recorded CPUs may no longer be
    valid devices. In both cases the checkpoint is not trusted.
    """
    return cp.boot_id == boot_id and cp.config_fingerprint == config_fingerprint
