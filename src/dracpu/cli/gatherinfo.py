"""`dracpu gatherinfo` (also installed as `dracpu-gatherinfo`): the node-local support
bundle of the running driver."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from dracpu.cli.common import CLIError, command_parser, discover, host_path, sysfs_root

if TYPE_CHECKING:
    from pathlib import Path

    from dracpu.config import DriverConfig
    from dracpu.gatherinfo import ApiObjects

__all__ = ["cmd_gatherinfo"]

# The API step's default time limit: the two lists take 10 s each at most; a credential
# plugin gets the rest.
API_TIMEOUT = 30.0


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
        "no daemon running, the report says so and holds the default config. When the API "
        "server answers, the report also holds the other drivers' ResourceSlices of this node "
        "and the cluster's DeviceClasses. Attach it to a bug report; feed it back with "
        "`dracpu introspect topology --sysfs-root FILE` to reproduce the node's topology, or "
        "`dracpu demo --sysfs-root FILE --scenario CLAIMS` to replay claims on the node with "
        "every driver's devices.",
        "dracpu gatherinfo --output-dir /tmp/dracpu-report\n"
        "dracpu gatherinfo --stdout --kubeconfig ~/.kube/config --node-name worker-3",
    )
    p.add_argument("--output-dir", default="", help="directory for the report file")
    p.add_argument("--stdout", action="store_true", help="write the report to stdout")
    p.add_argument("--sysfs-root", help="sysfs directory to read (default $HOST_ROOT/sys)")
    p.add_argument(
        "--kubeconfig",
        default="",
        help="kubeconfig for reading other drivers' ResourceSlices (default: the running "
        "driver's --kubeconfig, else the pod's in-cluster config)",
    )
    p.add_argument(
        "--node-name",
        default="",
        help="the node whose slices to save (default: the running driver's "
        "--hostname-override, else $NODE_NAME, else the hostname)",
    )
    p.add_argument(
        "--no-api",
        action="store_true",
        help="do not ask the API server for other drivers' ResourceSlices",
    )
    p.add_argument(
        "--api-timeout",
        type=float,
        default=API_TIMEOUT,
        metavar="SECONDS",
        help="time limit of the whole API server step, credential plugins included; past "
        f"it the report is written without the API objects (default {API_TIMEOUT:g})",
    )
    args = p.parse_args(argv)
    if args.stdout and args.output_dir:
        raise CLIError("--stdout and --output-dir cannot be used together")
    if not (args.api_timeout > 0 and math.isfinite(args.api_timeout)):
        raise CLIError(f"--api-timeout must be a number of seconds > 0, got {args.api_timeout}")
    procfs = host_path("proc")
    try:
        config, source, resolve = _running_driver_config(procfs)
        sysfs = sysfs_root(args.sysfs_root)
        overlay = config.sysfsOverlay
        if overlay and resolve is not None:
            overlay = resolve(overlay)
        topo = discover(sysfs, overlay=overlay or None, pcie=False)
        api_objects = None if args.no_api else _api_objects(args, config, resolve)
        report = build_report(
            topo, config, collect_sysfs(sysfs), config_source=source, api_objects=api_objects
        )
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


def _api_objects(
    args: argparse.Namespace, config: DriverConfig, resolve: Callable[[str], str] | None
) -> ApiObjects:
    """Other drivers' slices of this node and the device classes, or, when the API server
    cannot be asked or does not answer, an empty result whose source says why (also on
    stderr): the rest of the report is still worth having."""
    from dracpu import DRIVER_NAME
    from dracpu.config import ConfigError, resolve_node_name
    from dracpu.gatherinfo import (
        ApiObjects,
        GatherinfoError,
        driver_kubeconfig,
        gather_api_objects_within,
        write_private_kubeconfig,
    )

    def skipped(why: str, *, quietly: bool = False) -> ApiObjects:
        if not quietly:
            _say(f"other drivers' ResourceSlices not saved: {why}")
        return ApiObjects(slices=[], classes=[], source=f"not gathered: {why}")

    kubeconfig = args.kubeconfig or config.kubeconfig
    if not kubeconfig and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        # Off the cluster with nothing to reach it by: expected, so only the report says it.
        return skipped(
            "no --kubeconfig, the running driver has none, and this is not a pod "
            "(KUBERNETES_SERVICE_HOST is unset)",
            quietly=True,
        )
    try:
        node_name = args.node_name or resolve_node_name(config)
    except ConfigError as err:
        return skipped(str(err))
    private = None
    try:
        if kubeconfig and not args.kubeconfig and resolve is not None:
            # The driver's kubeconfig and the files it names, seen through its root.
            private = write_private_kubeconfig(driver_kubeconfig(kubeconfig, resolve))
            kubeconfig = str(private)
        found = gather_api_objects_within(
            kubeconfig or None, node_name, DRIVER_NAME, deadline=args.api_timeout
        )
    except GatherinfoError as err:
        return skipped(str(err))
    finally:
        if private is not None:
            private.unlink(missing_ok=True)
    _say(f"saved from the {found.source}")
    return found


def _say(line: str) -> None:
    print(f"dracpu gatherinfo: {line}", file=sys.stderr)


def _driver_config_of(argv: list[str], resolve: Callable[[str], str]) -> DriverConfig:
    from dracpu.config import ConfigError, reconstruct_from_cmdline

    try:
        return reconstruct_from_cmdline(argv, resolve)
    except ConfigError as err:
        raise CLIError(str(err)) from err
