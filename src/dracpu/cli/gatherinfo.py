"""`dracpu gatherinfo` (also installed as `dracpu-gatherinfo`): the node-local support
bundle of the running driver."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from dracpu.cli.common import CLIError, command_parser, discover, host_path, sysfs_root

if TYPE_CHECKING:
    from pathlib import Path

    from dracpu.config import DriverConfig

__all__ = ["cmd_gatherinfo"]


def cmd_gatherinfo(argv: Sequence[str]) -> int:
    from dracpu.gatherinfo import (
        GatherinfoError,
        build_report,
        collect_sysfs,
        write_report,
    )

    p = command_parser(
        "dracpu gatherinfo",
        "Collect a node-local support bundle: the running driver's config, the CPU topology "
        "and the sysfs files it came from. The driver is the lowest-numbered process running "
        "the dracpu daemon (found under $HOST_ROOT/proc); its PID is printed on stderr. With "
        "no daemon running, the report says so and holds the default config. Attach it to a "
        "bug report; feed it back with `dracpu introspect topology --sysfs-root FILE` to "
        "reproduce the node's topology.",
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
        config, source, resolve = _running_driver_config(procfs)
        sysfs = sysfs_root(args.sysfs_root)
        overlay = config.sysfsOverlay
        if overlay and resolve is not None:
            overlay = resolve(overlay)
        topo = discover(sysfs, overlay=overlay or None, pcie=False)
        report = build_report(topo, config, collect_sysfs(sysfs), config_source=source)
        if args.stdout:
            sys.stdout.write(report)
            return 0
        path = write_report(report, output_dir=args.output_dir or None)
    except GatherinfoError as err:
        raise CLIError(str(err)) from err
    print(f'"debug info collected" path={path}', file=sys.stderr)
    return 0


def _running_driver_config(
    procfs: Path,
) -> tuple[DriverConfig, str, Callable[[str], str] | None]:
    """The running driver's config, where it came from (for the report), and how to open
    a path as the driver sees it (None when no driver runs: the defaults)."""
    from dracpu.config import DriverConfig
    from dracpu.gatherinfo import driver_processes, path_in_process

    found = driver_processes(procfs)
    if not found:
        _say(
            f"no dracpu daemon is running (none found under {procfs}): the report's "
            "driverConfig holds the defaults, not a running driver's config"
        )
        source = f"defaults: no dracpu daemon was running (none found under {procfs})"
        return DriverConfig(), source, None
    proc, others = found[0], ", ".join(str(other.pid) for other in found[1:])
    _say(
        f"read the running driver's config from PID {proc.pid} under {procfs}"
        + (f" (more daemons run: PIDs {others})" if others else "")
    )
    resolve = path_in_process(procfs, proc.pid)
    return _driver_config_of(proc.argv, resolve), f"PID {proc.pid}", resolve


def _say(line: str) -> None:
    print(f"dracpu gatherinfo: {line}", file=sys.stderr)


def _driver_config_of(argv: list[str], resolve: Callable[[str], str]) -> DriverConfig:
    from dracpu.config import ConfigError, reconstruct_from_cmdline

    try:
        return reconstruct_from_cmdline(argv, resolve)
    except ConfigError as err:
        raise CLIError(str(err)) from err
