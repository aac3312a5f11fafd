"""``python -m dracpu_sim.fleet`` (and ``dracpu sim fleet``): one fleet run, its figures
printed as ``name: value`` lines."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from dracpu_sim.fleet.run import MODES, FleetOptions, run_fleet
from dracpu_sim.fleet.shapes import FIXTURES

__all__ = ["build_parser", "main"]


def build_parser(prog: str = "python -m dracpu_sim.fleet") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Simulate N dracpu nodes (the daemon's ResourceSlice publisher, one per node) "
            "against one loopback API server and measure what they cost it: at rest, "
            "after a topology change, when every watch drops, across an API server "
            "restart and a roll-out. See docs/scale.md."
        ),
        epilog="example: python -m dracpu_sim.fleet --nodes 1000 --mode grouped --duration 60",
    )
    p.add_argument("--nodes", type=int, default=50, help="simulated nodes (default 50)")
    p.add_argument(
        "--cpus-per-node",
        type=int,
        default=768,
        help="machine shapes with this many CPUs, from the fake sysfs trees; 0 = all shapes "
        "(default 768)",
    )
    p.add_argument("--mode", choices=MODES, default="grouped", help="cpuDeviceMode")
    p.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="seconds of scripted phases; waits for convergence come on top (default 60)",
    )
    p.add_argument("--seed", type=int, default=1, help="seed of shapes, changes and jitter")
    p.add_argument("--fixtures", type=Path, default=FIXTURES, help="directory of sysfs trees")
    p.add_argument(
        "--resync", type=float, default=30.0, help="the reconcilers' resync interval (default 30)"
    )
    p.add_argument(
        "--reconnect-spread",
        type=float,
        default=None,
        help="spread of relists and watch reconnects, seconds (default: the daemon's)",
    )
    p.add_argument(
        "--restart-downtime", type=float, default=5.0, help="API server downtime (default 5)"
    )
    p.add_argument(
        "--max-rps",
        type=float,
        default=300.0,
        help="server capacity: 429 with Retry-After beyond it; 0 = unlimited (default 300)",
    )
    p.add_argument("--topology-changes", type=int, default=None, help="changes to time")
    p.add_argument("-v", "--verbose", action="store_true", help="show the nodes' warnings")
    return p


def options_from(args: argparse.Namespace) -> FleetOptions:
    return FleetOptions(
        nodes=args.nodes,
        cpus_per_node=args.cpus_per_node or None,
        mode=args.mode,
        duration=args.duration,
        seed=args.seed,
        fixtures=args.fixtures,
        resync_interval=args.resync,
        reconnect_spread=args.reconnect_spread,
        restart_downtime=args.restart_downtime,
        max_rps=args.max_rps or None,
        topology_changes=args.topology_changes,
    )


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Run once with ``argv`` (``sys.argv[1:]`` when None); ``prog`` names the command
    in usage lines (``dracpu sim fleet`` when called from the dracpu CLI)."""
    args = (build_parser(prog) if prog else build_parser()).parse_args(argv)
    opts = options_from(args)
    try:
        opts.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.verbose:
        # A thousand reconcilers warn about every refused connection of a restart.
        # Process-wide, so undone on the way out (tests call main() in-process).
        logging.disable(logging.WARNING)
    try:
        result = trio.run(run_fleet, opts)
    except ValueError as exc:  # no machine shape with that many CPUs, ...
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        logging.disable(logging.NOTSET)
    for line in result.lines():
        print(line, flush=True)
    return 0
