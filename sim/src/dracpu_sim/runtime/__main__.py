"""``python -m dracpu_sim.runtime --socket PATH --cgroup-root DIR``: the NRI runtime simulator
on its own, waiting for a plugin (the same as ``dracpu sim runtime`` once the CLI wires it)."""

from __future__ import annotations

import argparse
import sys
from functools import partial

import trio

from dracpu_sim.runtime.cliflags import OneLineErrorParser, add_cgroup_flags
from dracpu_sim.runtime.simulator import UPDATE_MODES, main_runtime


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(
        prog="dracpu sim runtime",
        description="Run the simulated container runtime's NRI side (a plugin socket and a "
        "cgroup v1 or v2 cpuset tree in a directory, laid out for the cgroupfs or systemd "
        "driver).",
        epilog="example:\n  dracpu sim runtime --socket /tmp/nri/nri.sock --cgroup-root /tmp/cg\n"
        "  dracpu sim runtime --socket /tmp/nri/nri.sock --cgroup-root /tmp/cg "
        "--cgroup-version 2 --cgroup-driver systemd",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--socket", required=True, help="unix socket to listen on")
    parser.add_argument("--cgroup-root", required=True, help="directory of the cgroup tree")
    parser.add_argument("--cpus", default="0-7", help="the node's CPUs (default 0-7)")
    parser.add_argument(
        "--update-mode",
        choices=UPDATE_MODES,
        default="apply",
        help="how updates to running containers behave: apply them (default); "
        "containerd-drop (not applied, best-effort ones not reported failed, as containerd); "
        "report (not applied, every one reported failed); cgroup-differs "
        "(reported applied, but the cgroup keeps its old value)",
    )
    add_cgroup_flags(parser, version=1, driver="cgroupfs")
    args = parser.parse_args(argv)
    try:
        trio.run(
            partial(
                main_runtime,
                args.socket,
                args.cgroup_root,
                node_cpus=args.cpus,
                update_mode=args.update_mode,
                cgroup_version=args.cgroup_version,
                cgroup_driver=args.cgroup_driver,
            )
        )
    except OSError as err:
        print(f"dracpu sim runtime: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
