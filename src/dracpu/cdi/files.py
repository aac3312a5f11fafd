"""Claim CDI specs on disk: write, remove, read back, resolve device ids (§10.1, §10.2).

Writes are atomic (``dracpu.atomicfile``) so a runtime never reads half a spec and a crash
never leaves one. ``read_claim_specs`` reads our specs back at start-up and for NRI
Synchronize; ``device_env`` resolves fully qualified CDI device ids the way a runtime's CDI
cache does, for the simulated runtime. Everything here blocks on the filesystem: call it
from a worker thread in async code (``on_memory_filesystem`` says when that is not worth it).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dracpu.atomicfile import atomic_write, fsync_dir
from dracpu.cdi.spec import (
    MAX_SPEC_BYTES,
    CDIError,
    SpecError,
    claim_from_spec,
    claim_spec_bytes,
    claim_spec_path,
    is_claim_spec_name,
    parse_spec,
    qualified_devices,
    resolve_device_env,
)
from dracpu.cpuset import CPUSet
from dracpu.gofmt import go_quote

__all__ = [
    "CDIScan",
    "device_env",
    "on_memory_filesystem",
    "read_claim_specs",
    "remove_claim_spec",
    "write_claim_spec",
]


@dataclass
class CDIScan:
    """Claims found in the spec directory, and one line per spec that could not be used."""

    claims: dict[str, CPUSet] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def _describe(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


def write_claim_spec(cdi_dir: str, claim_uid: str, cpus: CPUSet, *, durable: bool = True) -> str:
    """Write (or overwrite with identical content) the claim's spec atomically; its path.

    ``durable=False`` leaves out the fsyncs (a directory on tmpfs, where they keep nothing).
    """
    path = claim_spec_path(cdi_dir, claim_uid)
    try:
        atomic_write(path, claim_spec_bytes(claim_uid, cpus), durable=durable)
    except OSError as exc:
        raise CDIError(f"failed to write CDI spec {go_quote(path)}: {_describe(exc)}") from exc
    return path


def remove_claim_spec(cdi_dir: str, claim_uid: str, *, durable: bool = True) -> None:
    """Delete the claim's spec; a spec that is already gone is fine."""
    path = claim_spec_path(cdi_dir, claim_uid)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CDIError(f"failed to remove CDI spec {go_quote(path)}: {_describe(exc)}") from exc
    if not durable:
        return
    # The file is gone; making the removal durable is best effort.
    with contextlib.suppress(OSError):
        fsync_dir(cdi_dir)


def _unescape_mount(field: str) -> str:
    # /proc/self/mounts writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def on_memory_filesystem(path: str, mounts: str = "/proc/self/mounts") -> bool:
    """True when ``path`` (or the closest existing directory above it) is on tmpfs/ramfs.

    ``/var/run/cdi`` is a tmpfs on real nodes: a write there never waits for a device, so
    handing it to a worker thread costs more than doing it. Unknown means False.
    """
    target = os.path.realpath(path)
    try:
        with open(mounts) as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    best, fstype = "", ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape_mount(fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, fields[2]
    return fstype in ("tmpfs", "ramfs")


# -- reading back ------------------------------------------------------------------------------


def _load_spec(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"cannot read: {exc.strerror or exc}") from None
    return parse_spec(raw)


def _spec_names(cdi_dir: str) -> list[str]:
    try:
        return sorted(os.listdir(cdi_dir))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CDIError(
            f"failed to read CDI spec directory {go_quote(cdi_dir)}: {_describe(exc)}"
        ) from exc


def read_claim_specs(cdi_dir: str) -> CDIScan:
    """The claims whose specs this driver wrote, with their CPUs; bad specs become errors.

    Only files named like ours are looked at; other vendors' specs are not our business. A
    missing directory is an empty scan.
    """
    scan = CDIScan()
    for name in _spec_names(cdi_dir):
        if not is_claim_spec_name(name):
            continue
        try:
            uid, cpus = claim_from_spec(name, _load_spec(os.path.join(cdi_dir, name)))
        except SpecError as exc:
            scan.errors.append(f"{os.path.join(cdi_dir, name)}: {exc}")
            continue
        scan.claims[uid] = cpus
    return scan


def _qualified_env(cdi_dir: str) -> tuple[dict[str, list[str]], set[str]]:
    """Every device of every valid spec in the directory -> its env; plus conflicting ids."""
    found: dict[str, list[str]] = {}
    conflicts: set[str] = set()
    for name in _spec_names(cdi_dir):
        if not (name.endswith(".json") and os.path.isfile(os.path.join(cdi_dir, name))):
            continue
        try:
            devices = qualified_devices(_load_spec(os.path.join(cdi_dir, name)))
        except SpecError:
            continue  # a runtime skips invalid specs and keeps the valid ones (§10.2)
        for qualified, env in devices:
            if qualified in found:
                conflicts.add(qualified)
            found[qualified] = env
    return found, conflicts


def device_env(cdi_dir: str, device_ids: Sequence[str]) -> list[str]:
    """The env entries the runtime injects for these fully qualified device ids, in order."""
    found, conflicts = _qualified_env(cdi_dir)
    return resolve_device_env(found, conflicts, device_ids)
