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
    except (ValueError, CPUSetParseError, KeyError, TypeError, AttributeError) as err:
        raise CLIError(f"{url} is not a dracpu debug state: {err}") from err
    print(f"node {state.get('node', '?')}")
    sys.stdout.write(
        render_cpu_map(rows, claims=claims, shared=shared, reserved=reserved, isolated=isolated)
    )
    return 0
