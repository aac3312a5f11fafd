"""``python -m dracpu.sim.runtime --socket PATH --cgroup-root DIR``: the NRI runtime simulator
on its own, waiting for a plugin (the same as ``dracpu sim runtime`` once the CLI wires it)."""

from __future__ import annotations

import argparse
import sys
from functools import partial

import trio

from dracpu.sim.runtime.layout import CGROUP_DRIVERS, CgroupLayoutError, check_cgroup_flavor
from dracpu.sim.runtime.simulator import UPDATE_MODES, main_runtime


def cgroup_version_arg(text: str) -> int:
    """``--cgroup-version``: 1 or 2 (argparse turns the error into one usage line)."""
    if text not in ("1", "2"):
        raise argparse.ArgumentTypeError(f"must be 1 or 2, got {text!r}")
    return int(text)


def add_cgroup_flags(parser: argparse.ArgumentParser, *, version: int, driver: str) -> None:
    """``--cgroup-version`` and ``--cgroup-driver``, shared by every command that builds a
    simulated node (``dracpu sim runtime``, ``dracpu demo``, the chaos run)."""
    parser.add_argument(
        "--cgroup-version",
        type=cgroup_version_arg,
        default=version,
        metavar="1|2",
        help=f"the simulated cgroup hierarchy: 1 (cpuset controller at <root>/cpuset) or 2 "
        f"(unified, <root>/cgroup.controllers) (default {version})",
    )
    parser.add_argument(
        "--cgroup-driver",
        choices=CGROUP_DRIVERS,
        default=driver,
        help="how the kubelet and containerd name pod and container cgroups: cgroupfs "
        "(/kubepods/burstable/pod<uid>/<id>) or systemd (kubepods.slice/.../"
        f"cri-containerd-<id>.scope) (default {driver})",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
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
        check_cgroup_flavor(args.cgroup_version, args.cgroup_driver)
    except CgroupLayoutError as err:
        parser.error(str(err))
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
