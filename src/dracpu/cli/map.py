"""`dracpu map`: the CPU map of a running daemon, read from its /debug/state endpoint."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from dracpu.cli.common import CLIError, command_parser

__all__ = ["cmd_map"]


def _read_state(url: str) -> Any:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.load(resp)
    except (urllib.error.URLError, OSError) as err:
        raise CLIError(f"cannot read {url}: {getattr(err, 'reason', err)}") from err
    except ValueError as err:
        raise CLIError(f"{url} did not answer JSON: {err}") from err


def cmd_map(argv: Sequence[str]) -> int:
    from dracpu.cpumap import render_cpu_map, rows_from_document
    from dracpu.cpuset import CPUSet, CPUSetParseError
    from dracpu.daemon.app import claims_of_state

    p = command_parser(
        "dracpu map",
        "Print the CPU map of a running daemon (claims, shared pool, reserved CPUs per core) "
        "from its /debug/state endpoint.",
        "dracpu map --url http://127.0.0.1:8081",
    )
    p.add_argument(
        "--url",
        default="http://127.0.0.1:8081",
        help="the daemon's debug address (--debug-address)",
    )
    args = p.parse_args(argv)
    url = args.url.rstrip("/") + "/debug/state"
    state = _read_state(url)
    try:
        rows = rows_from_document(state.get("topology") or {})
        claims = claims_of_state(state)
        shared = CPUSet.parse(state.get("sharedPool", ""))
        reserved = CPUSet.parse(state.get("reserved", ""))
        isolated = CPUSet.parse(state.get("isolated", ""))
        notes, status_off = _status_notes(state)
    except (ValueError, CPUSetParseError, KeyError, TypeError, AttributeError) as err:
        raise CLIError(f"{url} is not a dracpu debug state: {err}") from err
    print(f"node {state.get('node', '?')}")
    sys.stdout.write(
        render_cpu_map(
            rows,
            claims=claims,
            shared=shared,
            reserved=reserved,
            isolated=isolated,
            notes=notes,
        )
    )
    if status_off:
        print(f"claims' status.devices not written: {status_off}")
    return 0


def _status_notes(state: Any) -> tuple[dict[str, str], str]:
    """Per claim label, what the daemon did with the claim's ``status.devices`` (its
    ``claimStatus`` section: written, writing, removing, retrying and why); and why the
    daemon writes none, if it does not. A daemon without the section gives nothing."""
    section = state.get("claimStatus") or {}
    status = section.get("claims") or {}
    notes: dict[str, str] = {}
    for claim in state.get("claims") or []:
        label = f"{claim['namespace']}/{claim['name']}" if claim.get("name") else claim["uid"]
        said = status.get(claim["uid"])
        if said:
            notes[label] = f"status.devices: {said}"
    return notes, str(section.get("disabled") or "")
