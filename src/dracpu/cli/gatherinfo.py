"""`dracpu gatherinfo` (also installed as `dracpu-gatherinfo`): the node-local support
bundle of the running driver."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from dracpu.cli.common import CLIError, command_parser, discover, host_path, sysfs_root

if TYPE_CHECKING:
    from dracpu.config import DriverConfig

__all__ = ["cmd_gatherinfo"]


def cmd_gatherinfo(argv: Sequence[str]) -> int:
    from dracpu.gatherinfo import (
        GatherinfoError,
        build_report,
        collect_sysfs,
        find_driver_process,
        path_in_process,
        write_report,
    )

    p = command_parser(
        "dracpu gatherinfo",
        "Collect a node-local support bundle: the running driver's config, the CPU topology "
        "and the sysfs files it came from. Attach it to a bug report; feed it back with "
        "`dracpu introspect topology --sysfs-root FILE` to reproduce the node's topology.",
        "dracpu gatherinfo --output-dir /tmp/dracpu-report",
    )
    p.add_argument("--output-dir", default="", help="directory for the report file")
    p.add_argument("--stdout", action="store_true", help="write the report to stdout")
    p.add_argument("--sysfs-root", help="sysfs directory to read (default $HOST_ROOT/sys)")
    args = p.parse_args(argv)
    if args.stdout and args.output_dir:
        raise CLIError("--stdout and --output-dir cannot be used together")
    procfs = host_path("proc")
    try:
        proc = find_driver_process(procfs)
        config = _driver_config_of(proc.argv, path_in_process(procfs, proc.pid))
        sysfs = sysfs_root(args.sysfs_root)
        overlay = config.sysfsOverlay
        if overlay:
            overlay = path_in_process(procfs, proc.pid)(overlay)
        topo = discover(sysfs, overlay=overlay or None, pcie=False)
        report = build_report(topo, config, collect_sysfs(sysfs))
        if args.stdout:
            sys.stdout.write(report)
            return 0
        path = write_report(report, output_dir=args.output_dir or None)
    except GatherinfoError as err:
        raise CLIError(str(err)) from err
    print(f'"debug info collected" path={path}', file=sys.stderr)
    return 0


def _driver_config_of(argv: list[str], resolve: Callable[[str], str]) -> DriverConfig:
    from dracpu.config import ConfigError, DriverConfig, driver_argv, reconstruct_from_cmdline

    argv = driver_argv(argv)
    if not argv or os.path.basename(argv[0]) != "dracpu":
        return DriverConfig()
    try:
        return reconstruct_from_cmdline(argv, resolve)
    except ConfigError as err:
        raise CLIError(str(err)) from err
