"""Claim CDI specs as names and bytes, and reading spec content back: no file I/O.

One spec per prepared claim, ``<cdi dir>/dra.k8s.io-cpu_claim-<uid>.json``, whose single
device injects the claim's ``DRA_CPUSET_<uid>=<cpus>`` env entry (behavior.md §10.1).

``cdiVersion`` is the lowest version the content needs (protocols.md §7.3): env edits only
and a device name that starts with a letter need 0.3.0, which every CDI-enabled runtime
knows. Upstream writes 0.8.0; older containerd releases reject that, and nothing in the
spec needs it. Specs with any known version are read back.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from dracpu.cdi.env import DRA_ENV_KEY_PREFIX, DRAEnvError, cdi_env_entry, parse_dra_env
from dracpu.cdi.names import CDI_KIND, DEVICE_PREFIX, SPEC_PREFIX, cdi_device_name
from dracpu.cpuset import CPUSet
from dracpu.gofmt import go_quote

__all__ = [
    "CDI_VERSION",
    "KNOWN_VERSIONS",
    "MAX_CLAIM_UID",
    "MAX_SPEC_BYTES",
    "CDIError",
    "SpecError",
    "check_claim_uid",
    "claim_from_spec",
    "claim_spec_bytes",
    "claim_spec_path",
    "is_claim_spec_name",
    "parse_spec",
    "qualified_devices",
    "resolve_device_env",
]

CDI_VERSION = "0.3.0"
KNOWN_VERSIONS = frozenset(("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"))
# A file name is at most 255 bytes; SPEC_PREFIX, DEVICE_PREFIX and ".json" take 26 of them.
MAX_CLAIM_UID = 128
# Our specs are under 200 bytes; a spec file is read whole, so its size is capped.
MAX_SPEC_BYTES = 1024 * 1024
_UID_CHARS = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")


class CDIError(Exception):
    """A CDI spec could not be written, removed or resolved; ``str()`` is the claim error."""


class SpecError(Exception):
    """One spec file cannot be used; the message says why (without the file's name)."""


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


def is_claim_spec_name(name: str) -> bool:
    """Is a directory entry named like one of our claim specs?"""
    return name.startswith(SPEC_PREFIX + DEVICE_PREFIX) and name.endswith(".json")


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
    # msgspec's compact JSON is json.dumps(separators=(",", ":"))'s for ASCII, which is
    # all a spec holds (a checked UID, CPU numbers), without the pure-Python encoder.
    return msgspec.json.encode(spec)


# -- reading back --------------------------------------------------------------------------------


def parse_spec(raw: bytes) -> dict[str, Any]:
    """A spec file's content as a checked JSON object (a known version, a kind, devices)."""
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(f"larger than {MAX_SPEC_BYTES} bytes")
    try:
        spec = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SpecError(f"invalid JSON: {exc}") from None
    except RecursionError:
        raise SpecError("invalid JSON: nested too deeply") from None
    if not isinstance(spec, dict):
        raise SpecError("not a JSON object")
    version = spec.get("cdiVersion")
    if not isinstance(version, str) or version.removeprefix("v") not in KNOWN_VERSIONS:
        raise SpecError(f"unsupported cdiVersion {json.dumps(version)}")
    if not isinstance(spec.get("kind"), str):
        raise SpecError("kind is missing")
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        raise SpecError("no devices")
    return spec


def _device_env(device: object) -> tuple[str, list[str]]:
    if not isinstance(device, dict) or not isinstance(device.get("name"), str):
        raise SpecError("a device has no name")
    edits = device.get("containerEdits")
    if not isinstance(edits, dict) or not edits:
        raise SpecError(f"device {json.dumps(device['name'])} has no containerEdits")
    env = edits.get("env", [])
    if not isinstance(env, list) or not all(isinstance(e, str) for e in env):
        raise SpecError(f"device {json.dumps(device['name'])} has a malformed env list")
    return device["name"], list(env)


def _spec_env(spec: dict[str, Any]) -> list[str]:
    edits = spec.get("containerEdits") or {}
    env = edits.get("env", []) if isinstance(edits, dict) else None
    if not isinstance(env, list) or not all(isinstance(e, str) for e in env):
        raise SpecError("malformed spec-wide containerEdits")
    return list(env)


def claim_from_spec(name: str, spec: dict[str, Any]) -> tuple[str, CPUSet]:
    """The claim UID and CPUs of our spec file ``name`` with content ``spec``."""
    uid = name[len(SPEC_PREFIX) + len(DEVICE_PREFIX) : -len(".json")]
    try:
        check_claim_uid(uid)
    except CDIError as exc:
        raise SpecError(str(exc)) from None
    if spec["kind"] != CDI_KIND:
        raise SpecError(f"kind is {json.dumps(spec['kind'])}, expected {json.dumps(CDI_KIND)}")
    wanted = cdi_device_name(uid)
    for device in spec["devices"]:
        device_name, env = _device_env(device)
        if device_name != wanted:
            continue
        try:
            claims = parse_dra_env(env)
        except DRAEnvError as exc:
            raise SpecError(str(exc)) from None
        if uid not in claims:
            raise SpecError(
                f"device {json.dumps(wanted)} has no {DRA_ENV_KEY_PREFIX}{uid} env entry"
            )
        return uid, claims[uid]
    raise SpecError(f"no device named {json.dumps(wanted)}")


def qualified_devices(spec: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Every device of a spec as (fully qualified id, the env a runtime injects for it)."""
    common = _spec_env(spec)
    return [
        (f"{spec['kind']}={device_name}", env + common)
        for device_name, env in (_device_env(d) for d in spec["devices"])
    ]


def resolve_device_env(
    found: Mapping[str, list[str]], conflicts: set[str], device_ids: Sequence[str]
) -> list[str]:
    """The env entries for these device ids, in order, as a runtime's CDI cache resolves
    them: ``found`` maps every known qualified id to its env; ``conflicts`` are the ids
    more than one spec defines."""
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
