"""CDI spec files for prepared claims (behavior.md §10.1, §10.2; protocols.md §7).

One spec per prepared claim, ``<cdi dir>/dra.k8s.io-cpu_claim-<uid>.json``, whose single
device injects the claim's ``DRA_CPUSET_<uid>=<cpus>`` env entry. Writes are atomic (temp
file that the runtime's watcher ignores, fsync, rename, directory fsync) so a runtime never
reads half a spec and a crash never leaves one.

``read_claim_specs`` reads our specs back at start-up and for NRI Synchronize;
``device_env`` resolves fully qualified CDI device ids the way a runtime's CDI cache does,
for the simulated runtime. Functions here block on the filesystem: call them from a worker
thread in async code.

``cdiVersion`` is the lowest version the content needs (protocols.md §7.3): env edits only
and a device name that starts with a letter need 0.3.0, which every CDI-enabled runtime
knows. Upstream writes 0.8.0; older containerd releases reject that, and nothing in the
spec needs it. Specs with any known version are read back.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dracpu.allocation.env import DRAEnvError, parse_dra_env
from dracpu.allocation.prepare import (
    CDI_CLASS,
    CDI_KIND,
    CDI_VENDOR,
    cdi_device_name,
    cdi_env_entry,
)
from dracpu.cpuset import CPUSet
from dracpu.gofmt import go_quote

__all__ = [
    "CDI_DIR",
    "CDI_VERSION",
    "CDIError",
    "CDIScan",
    "atomic_write",
    "check_claim_uid",
    "claim_spec_bytes",
    "claim_spec_path",
    "device_env",
    "on_memory_filesystem",
    "read_claim_specs",
    "remove_claim_spec",
    "write_claim_spec",
]

CDI_DIR = "/var/run/cdi"
CDI_VERSION = "0.3.0"
KNOWN_VERSIONS = frozenset(("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"))
SPEC_PREFIX = f"{CDI_VENDOR}-{CDI_CLASS}_"
DEVICE_PREFIX = "claim-"
# A file name is at most 255 bytes; the prefix, "claim-" and ".json" take 26 of them.
MAX_CLAIM_UID = 128
# Our specs are under 200 bytes; a spec file is read whole, so its size is capped.
MAX_SPEC_BYTES = 1024 * 1024
_UID_CHARS = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")


class CDIError(Exception):
    """A CDI spec could not be written, removed or resolved; ``str()`` is the claim error."""


@dataclass
class CDIScan:
    """Claims found in the spec directory, and one line per spec that could not be used."""

    claims: dict[str, CPUSet] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def check_claim_uid(claim_uid: str) -> None:
    """Refuse a claim UID that cannot safely become a file and CDI device name.

    Kubernetes UIDs are UUIDs; anything with a path separator, a NUL, ``..``, or characters
    a CDI device name may not hold is refused before it reaches the filesystem.
    """
    problem = None
    if not claim_uid:
        problem = "must not be empty"
    elif len(claim_uid) > MAX_CLAIM_UID:
        problem = f"must be at most {MAX_CLAIM_UID} characters, got {len(claim_uid)}"
    elif "/" in claim_uid or "\x00" in claim_uid or ".." in claim_uid:
        problem = "must not contain '/', '..' or NUL"
    elif not _UID_CHARS.fullmatch(claim_uid):
        problem = (
            "must start and end with a letter or digit and contain only letters, digits, "
            "'_', '.', ':' and '-'"
        )
    if problem is not None:
        raise CDIError(f"invalid claim UID {go_quote(claim_uid)}: {problem}")


def claim_spec_path(cdi_dir: str, claim_uid: str) -> str:
    """Where a claim's spec lives (the CDI transient-spec naming, protocols.md §7.1)."""
    check_claim_uid(claim_uid)
    return os.path.join(cdi_dir, f"{SPEC_PREFIX}{cdi_device_name(claim_uid)}.json")


def claim_spec_bytes(claim_uid: str, cpus: CPUSet) -> bytes:
    """The spec's exact bytes: compact JSON in the field order of behavior.md §10.1."""
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [
            {
                "name": cdi_device_name(claim_uid),
                "containerEdits": {"env": [cdi_env_entry(claim_uid, cpus)]},
            }
        ],
        "containerEdits": {},
    }
    return json.dumps(spec, separators=(",", ":")).encode()


def _describe(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ensure_dir(path: str, mode: int = 0o755) -> None:
    if os.path.isdir(path):
        return
    os.makedirs(path, mode=mode, exist_ok=True)
    os.chmod(path, mode)  # makedirs' mode is filtered by the umask


def atomic_write(path: str, data: bytes, *, mode: int = 0o600, dir_mode: int = 0o755) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never half.

    The temp name ``spec.*.tmp`` does not end in ``.json``, so runtimes watching the
    directory ignore it. Raises OSError; the temp file never survives a failure.
    """
    parent = os.path.dirname(path) or "."
    _ensure_dir(parent, dir_mode)
    # mkstemp creates the file 0600.
    fd, tmp = tempfile.mkstemp(prefix="spec.", suffix=".tmp", dir=parent)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if mode != 0o600:
                os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(parent)


def write_claim_spec(cdi_dir: str, claim_uid: str, cpus: CPUSet) -> str:
    """Write (or overwrite with identical content) the claim's spec atomically; its path."""
    path = claim_spec_path(cdi_dir, claim_uid)
    try:
        atomic_write(path, claim_spec_bytes(claim_uid, cpus))
    except OSError as exc:
        raise CDIError(f"failed to write CDI spec {go_quote(path)}: {_describe(exc)}") from exc
    return path


def remove_claim_spec(cdi_dir: str, claim_uid: str) -> None:
    """Delete the claim's spec; a spec that is already gone is fine."""
    path = claim_spec_path(cdi_dir, claim_uid)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CDIError(f"failed to remove CDI spec {go_quote(path)}: {_describe(exc)}") from exc
    # The file is gone; making the removal durable is best effort.
    with contextlib.suppress(OSError):
        _fsync_dir(cdi_dir)


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


class _SpecError(Exception):
    pass


def _load_spec(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise _SpecError(f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise _SpecError(f"larger than {MAX_SPEC_BYTES} bytes")
    try:
        spec = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _SpecError(f"invalid JSON: {exc}") from None
    except RecursionError:
        raise _SpecError("invalid JSON: nested too deeply") from None
    if not isinstance(spec, dict):
        raise _SpecError("not a JSON object")
    version = spec.get("cdiVersion")
    if not isinstance(version, str) or version.removeprefix("v") not in KNOWN_VERSIONS:
        raise _SpecError(f"unsupported cdiVersion {json.dumps(version)}")
    if not isinstance(spec.get("kind"), str):
        raise _SpecError("kind is missing")
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        raise _SpecError("no devices")
    return spec


def _device_env(device: object) -> tuple[str, list[str]]:
    if not isinstance(device, dict) or not isinstance(device.get("name"), str):
        raise _SpecError("a device has no name")
    edits = device.get("containerEdits")
    if not isinstance(edits, dict) or not edits:
        raise _SpecError(f"device {json.dumps(device['name'])} has no containerEdits")
    env = edits.get("env", [])
    if not isinstance(env, list) or not all(isinstance(e, str) for e in env):
        raise _SpecError(f"device {json.dumps(device['name'])} has a malformed env list")
    return device["name"], list(env)


def _spec_env(spec: dict[str, Any]) -> list[str]:
    edits = spec.get("containerEdits") or {}
    env = edits.get("env", []) if isinstance(edits, dict) else None
    if not isinstance(env, list) or not all(isinstance(e, str) for e in env):
        raise _SpecError("malformed spec-wide containerEdits")
    return list(env)


def _claim_from_spec(name: str, spec: dict[str, Any]) -> tuple[str, CPUSet]:
    uid = name[len(SPEC_PREFIX) + len(DEVICE_PREFIX) : -len(".json")]
    try:
        check_claim_uid(uid)
    except CDIError as exc:
        raise _SpecError(str(exc)) from None
    if spec["kind"] != CDI_KIND:
        raise _SpecError(f"kind is {json.dumps(spec['kind'])}, expected {json.dumps(CDI_KIND)}")
    wanted = cdi_device_name(uid)
    for device in spec["devices"]:
        device_name, env = _device_env(device)
        if device_name != wanted:
            continue
        try:
            claims = parse_dra_env(env)
        except DRAEnvError as exc:
            raise _SpecError(str(exc)) from None
        if uid not in claims:
            raise _SpecError(f"device {json.dumps(wanted)} has no DRA_CPUSET_{uid} env entry")
        return uid, claims[uid]
    raise _SpecError(f"no device named {json.dumps(wanted)}")


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
    prefix = SPEC_PREFIX + DEVICE_PREFIX
    for name in _spec_names(cdi_dir):
        if not (name.startswith(prefix) and name.endswith(".json")):
            continue
        try:
            uid, cpus = _claim_from_spec(name, _load_spec(os.path.join(cdi_dir, name)))
        except _SpecError as exc:
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
            spec = _load_spec(os.path.join(cdi_dir, name))
            common = _spec_env(spec)
            devices = [_device_env(d) for d in spec["devices"]]
        except _SpecError:
            continue  # a runtime skips invalid specs and keeps the valid ones (§10.2)
        for device_name, env in devices:
            qualified = f"{spec['kind']}={device_name}"
            if qualified in found:
                conflicts.add(qualified)
            found[qualified] = env + common
    return found, conflicts


def device_env(cdi_dir: str, device_ids: Sequence[str]) -> list[str]:
    """The env entries the runtime injects for these fully qualified device ids, in order."""
    found, conflicts = _qualified_env(cdi_dir)
    env: list[str] = []
    for device_id in device_ids:
        kind, sep, name = device_id.partition("=")
        if not sep or "/" not in kind or not name:
            raise CDIError(f"invalid CDI device id {go_quote(device_id)}")
        if device_id in conflicts:
            raise CDIError(f"conflicting CDI specs define device {go_quote(device_id)}")
        if device_id not in found:
            raise CDIError(f"failed to find CDI device {go_quote(name)}")
        env.extend(found[device_id])
    return env
