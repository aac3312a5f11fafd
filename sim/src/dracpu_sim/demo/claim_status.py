"""The claims' ``status.devices`` in the demo's report, as read back from the API server.

dracpu writes its entries beside the prepare (dracpu.k8s.claim_status), so they may land
a moment after the pod runs: ``read_statuses`` waits a little for every claim that holds
CPUs to show its cpuset there, then reports whatever the server holds. Pure but for the
wait; ``status_line`` is the report's short line per claim.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import trio

from dracpu.cpuset import CPUSet, CPUSetParseError

__all__ = ["STATUS_TIMEOUT", "ours_show", "read_statuses", "status_line"]

DRIVER = "dra.cpu"
STATUS_TIMEOUT = 5.0


def _key(claim: Mapping[str, Any]) -> str:
    meta = claim["metadata"]
    return f"{meta.get('namespace', 'default')}/{meta['name']}"


def ours_show(status: Mapping[str, Any], cpus: str) -> bool:
    """Whether the status has an entry of ours and each of ours says ``cpus``."""
    ours = [e for e in status.get("devices") or [] if e.get("driver") == DRIVER]
    return bool(ours) and all(_same_cpus((e.get("data") or {}).get("cpuset"), cpus) for e in ours)


def _same_cpus(a: object, b: str) -> bool:
    try:
        return isinstance(a, str) and CPUSet.parse(a) == CPUSet.parse(b)
    except CPUSetParseError:
        return False


async def read_statuses(
    list_claims: Callable[[], list[dict[str, Any]]],
    held: Mapping[str, str],
    *,
    timeout: float = STATUS_TIMEOUT,
    poll: float = 0.1,
) -> dict[str, dict[str, Any]]:
    """``ns/name`` -> ``{"devices": [...]}`` (the claim's ``status.devices``, every
    driver's) for every claim; ``held`` maps claim keys to the CPUs dracpu holds for them,
    whose entries are waited for (up to ``timeout`` seconds)."""
    statuses: dict[str, dict[str, Any]] = {}
    with trio.move_on_after(timeout):
        while True:
            statuses = {
                _key(c): {"devices": list((c.get("status") or {}).get("devices") or [])}
                for c in list_claims()
            }
            if all(ours_show(statuses.get(k, {}), cpus) for k, cpus in held.items() if cpus):
                break
            await trio.sleep(poll)
    return statuses


def status_line(status: Mapping[str, Any] | None) -> str | None:
    """``status.devices: Ready, cpuset 0-3, NUMA 0, full cores`` for a claim with our
    entries; None without."""
    ours = [e for e in (status or {}).get("devices") or [] if e.get("driver") == DRIVER]
    if not ours:
        return None
    first = ours[0]
    ready = next((c for c in first.get("conditions") or [] if c.get("type") == "Ready"), None)
    state = "Ready" if ready and ready.get("status") == "True" else "not Ready"
    data = first.get("data") or {}
    bits = [state]
    if "cpuset" in data:
        bits.append(f"cpuset {data['cpuset']}")
    if "numaNodes" in data:
        bits.append(f"NUMA {data['numaNodes']}")
    if "fullCores" in data:
        bits.append("full cores" if data["fullCores"] else "shares cores")
    entries = "entry" if len(ours) == 1 else "entries"
    return f"status.devices ({len(ours)} {entries}): " + ", ".join(bits)
