"""``python -m dracpu_sim.chaos``: seeded chaos runs from the command line (``make chaos``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence

import trio

from dracpu_sim.chaos.plan import FAULT_KINDS
from dracpu_sim.chaos.run import (
    DEFAULT_FIXTURE,
    EVIDENCE,
    ChaosOptions,
    ChaosResult,
    format_result,
    run_chaos,
)
from dracpu_sim.runtime.cliflags import OneLineErrorParser, add_cgroup_flags

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog="python -m dracpu_sim.chaos",
        description="Seeded chaos run of the real daemon on the simulated node.",
        epilog="example:\n  python -m dracpu_sim.chaos --seed 7 --duration 60 "
        "--cgroup-version 1 --cgroup-driver cgroupfs",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the workload and faults")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of chaos per run")
    p.add_argument(
        "--mode",
        choices=("grouped", "individual", "both"),
        default="both",
        help="cpuDeviceMode of the daemon; 'both' runs one of each, one after the other",
    )
    p.add_argument("--sysfs-root", default=DEFAULT_FIXTURE, help="fake sysfs of the node")
    p.add_argument("--reserved-cpus", default="0,40", help="the daemon's --reserved-cpus")
    p.add_argument("--settle-timeout", type=float, default=90.0)
    p.add_argument(
        "--intensity", type=float, default=1.0, help="fault rate relative to the default (~0.7/s)"
    )
    p.add_argument("--keep-workdir", action="store_true", help="keep the node's files")
    p.add_argument("--json", action="store_true", help="also print a JSON summary line")
    p.add_argument("-v", "--verbose", action="store_true", help="log faults on stderr")
    add_cgroup_flags(p, version=2, driver="systemd")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.verbose:
        # The simulated kubelet and runtime warn about every failure the faults cause.
        # Process-wide, so undone on the way out (tests call main() in-process).
        logging.disable(logging.WARNING)
    try:
        return _main(args)
    finally:
        logging.disable(logging.NOTSET)


def _options(args: argparse.Namespace, mode: str) -> ChaosOptions:
    return ChaosOptions(
        seed=args.seed,
        duration=args.duration,
        mode=mode,
        sysfs_root=args.sysfs_root,
        reserved_cpus=args.reserved_cpus,
        settle_timeout=args.settle_timeout,
        intensity=args.intensity,
        keep_workdir=args.keep_workdir,
        verbose=args.verbose,
        cgroup_version=args.cgroup_version,
        cgroup_driver=args.cgroup_driver,
    )


def _print_run(result: ChaosResult, seconds: float) -> None:
    """One run: what it did and saw, then the report."""
    kinds = ", ".join(f"{k}={result.faults[k]}" for k in FAULT_KINDS)
    seen = ", ".join(f"{k}={result.evidence[k]}" for k in EVIDENCE)
    print(
        f"== mode {result.mode}, seed {result.seed}: {result.pods_created} pods created, "
        f"{result.pods_deleted} deleted, {seconds:.0f}s\n"
        f"   faults: {kinds}\n   missed (nothing to hit): {dict(result.missed)}\n"
        f"   daemon log: {seen}\n"
        f"   settling last waited for: {'; '.join(result.waited_for) or 'nothing'}"
    )
    if result.violations:
        print(f"   node files kept in {result.workdir}")
    sys.stdout.write(format_result(result))
    sys.stdout.flush()


def _print_total(args: argparse.Namespace, results: Sequence[ChaosResult]) -> None:
    total = ChaosResult(mode=args.mode, seed=args.seed)
    for r in results:
        total.faults.update(r.faults)
        total.violations.extend(r.violations)
    total.settle_ms = max(r.settle_ms for r in results)
    print(f"== total ({len(results)} runs; settle_ms is the longest)")
    sys.stdout.write(format_result(total))


def _print_json(results: Sequence[ChaosResult]) -> None:
    print(
        json.dumps(
            {
                r.mode: {
                    "faults": dict(r.faults),
                    "violations": [str(v) for v in r.violations],
                    "settle_ms": r.settle_ms,
                }
                for r in results
            }
        )
    )


def _main(args: argparse.Namespace) -> int:
    if args.duration <= 0:
        print(f"chaos: --duration must be positive, got {args.duration}", file=sys.stderr)
        return 2
    if args.intensity <= 0:
        print(f"chaos: --intensity must be positive, got {args.intensity}", file=sys.stderr)
        return 2
    modes = ("grouped", "individual") if args.mode == "both" else (args.mode,)
    results = []
    for mode in modes:
        started = time.monotonic()
        result = trio.run(run_chaos, _options(args, mode))
        results.append(result)
        _print_run(result, time.monotonic() - started)
    if len(results) > 1:
        _print_total(args, results)
    if args.json:
        _print_json(results)
    return 1 if any(r.violations for r in results) else 0
