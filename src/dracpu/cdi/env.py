"""The ``DRA_CPUSET_<claimUID>=<cpuset>`` container env entries (behavior.md §13.2).

The CDI spec of a prepared claim injects one such entry into every container that uses the
claim; the NRI plugin reads them back to learn which exclusive CPUs a container holds. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

from dracpu.cpuset import CPUSet, CPUSetParseError, parse_cpuset
from dracpu.gofmt import go_quote

__all__ = [
    "DRA_ENV_KEY_PREFIX",
    "DRA_ENV_PREFIX",
    "DRAEnvError",
    "cdi_env_entry",
    "parse_dra_env",
]

# Entries are looked at when they start with DRA_ENV_PREFIX; only keys that start with
# DRA_ENV_KEY_PREFIX carry a claim UID (so ``DRA_CPUSETX=...`` is ignored, as upstream does).
DRA_ENV_PREFIX = "DRA_CPUSET"
DRA_ENV_KEY_PREFIX = f"{DRA_ENV_PREFIX}_"


def cdi_env_entry(claim_uid: str, cpus: CPUSet) -> str:
    """The env entry the CDI spec injects; the UID goes in verbatim, hyphens and all."""
    return f"{DRA_ENV_KEY_PREFIX}{claim_uid}={cpus.format()}"


class DRAEnvError(ValueError):
    """A ``DRA_CPUSET`` env entry that cannot be read; the message is the container's error."""


def parse_dra_env(env: Iterable[str]) -> dict[str, CPUSet]:
    """Claim UID -> cpuset from a container's env; later entries for a UID win."""
    claims: dict[str, CPUSet] = {}
    for entry in env:
        if not entry.startswith(DRA_ENV_PREFIX):
            continue
        key, sep, value = entry.partition("=")
        if not sep:
            raise DRAEnvError(f"malformed DRA env entry {go_quote(entry)}")
        if not key.startswith(DRA_ENV_KEY_PREFIX):
            continue
        try:
            cpus = parse_cpuset(value)
        except CPUSetParseError as exc:
            raise DRAEnvError(
                f"failed to parse cpuset value {go_quote(value)} from env {go_quote(entry)}: {exc}"
            ) from None
        claims[key[len(DRA_ENV_KEY_PREFIX) :]] = cpus
    return claims
