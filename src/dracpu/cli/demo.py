"""`dracpu demo`: the real daemon against a simulated node, with a scenario applied."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dracpu.cli.common import (
    CLIError,
    command_parser,
    discover,
    require_simulator,
    reserved_cpuset,
    sysfs_root,
)

if TYPE_CHECKING:
    from dracpu_sim.demo.scenario import Scenario

__all__ = ["cmd_demo"]


def _demo_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "dracpu demo",
        "Run the real daemon against a simulated node (API server, scheduler, kubelet, NRI "
        "runtime and cgroup tree in a temp dir), apply a scenario of Pods and ResourceClaims, "
        "and print the published devices, each claim's CPUs, each container's cpuset read "
        "back from the cgroup tree, and a CPU map. Exit 1 when a claim cannot be satisfied.",
        "dracpu demo --sysfs-root tests/fake_sysfs/xeon-2s-ht --cpu-device-mode grouped\n"
        "dracpu demo --cgroup-version 1 --cgroup-driver cgroupfs",
    )
    p.add_argument("--sysfs-root", help="sysfs directory, or a gatherinfo report (default /sys)")
    p.add_argument(
        "--scenario",
        help="YAML stream of Pods and ResourceClaims, and other drivers' DeviceClasses and "
        "ResourceSlices (default: built in)",
    )
    p.add_argument(
        "--output",
        choices=("text", "json"),
        default="text",
        help="text: progress lines, the report and a CPU map; json: one document with the "
        "published slices, each claim's CPUs, each container's cpuset and the notes "
        "(default text)",
    )
    p.add_argument(
        "--cpu-device-mode",
        choices=("grouped", "individual"),
        default="grouped",
        help="the daemon's --cpu-device-mode: one device per group of CPUs with a consumable "
        "capacity, or one device per CPU (default grouped)",
    )
    p.add_argument(
        "--group-by",
        choices=("numanode", "socket", "machine"),
        default="numanode",
        help="in grouped mode, what one device covers (default numanode)",
    )
    p.add_argument(
        "--reserved-cpus",
        default="",
        help="CPUs kept out of DRA, as the daemon's --reserved-cpus (e.g. 0-1); at least one "
        "CPU must stay unreserved",
    )
    p.add_argument(
        "--expose-pcie-roots",
        action="store_true",
        help="the daemon's --expose-pcie-roots: CPU devices carry the PCIe roots local to their "
        "CPUs (resource.kubernetes.io/pcieRoot), so a claim can match them with other drivers' "
        "devices that the scenario (or a gatherinfo report given as --sysfs-root) holds",
    )
    p.add_argument("--keep-running", action="store_true", help="leave everything up until Ctrl-C")
    from dracpu_sim.runtime.cliflags import add_cgroup_flags

    # cgroup v2 with the systemd driver: what most nodes run today.
    add_cgroup_flags(p, version=2, driver="systemd")
    return p


def cmd_demo(argv: Sequence[str]) -> int:
    require_simulator("dracpu demo")
    args = _demo_parser().parse_args(argv)

    import trio

    from dracpu.allocation.floor import unpublished_cpus
    from dracpu_sim.demo.runner import DemoError, DemoOptions, run_demo
    from dracpu_sim.demo.scenario import ScenarioError, default_scenario, load_scenario

    root = sysfs_root(args.sysfs_root)
    topo = discover(root)
    reserved = reserved_cpuset(args.reserved_cpus)
    if topo.all_cpus and not topo.all_cpus - reserved:
        raise CLIError(
            f"--reserved-cpus {args.reserved_cpus} reserves every CPU of this node "
            f"({topo.all_cpus.format()}): nothing is left for claims or the shared pool",
            code=2,
        )
    try:
        if args.scenario:
            scenario = load_scenario(args.scenario)
        else:
            scenario = default_scenario(
                topo,
                mode=args.cpu_device_mode,
                group_by=args.group_by,
                reserved=len(unpublished_cpus(topo, reserved, publish_isolated=False)),
            )
        _add_bundle_objects(scenario, args.sysfs_root)
    except ScenarioError as err:
        raise CLIError(str(err)) from err
    options = DemoOptions(
        sysfs_root=str(root),
        topology=topo,
        scenario=scenario,
        mode=args.cpu_device_mode,
        group_by=args.group_by,
        reserved=args.reserved_cpus,
        output=args.output,
        keep_running=args.keep_running,
        cgroup_version=args.cgroup_version,
        cgroup_driver=args.cgroup_driver,
        expose_pcie_roots=args.expose_pcie_roots,
    )
    try:
        result = trio.run(run_demo, options, sys.stdout)
    except DemoError as err:
        raise CLIError(f"demo: {err}") from err
    for problem in result.problems:
        print(f"dracpu demo: {problem}", file=sys.stderr)
    return 1 if result.problems else 0


def _add_bundle_objects(scenario: Scenario, sysfs_root: str | None) -> None:
    """A gatherinfo report given as ``--sysfs-root`` also brings the node's other drivers'
    ResourceSlices and the cluster's DeviceClasses, when it was gathered with them."""
    if sysfs_root is None or os.path.isdir(sysfs_root):
        return
    from dracpu.gatherinfo import GatherinfoError, read_bundle_objects

    try:
        slices, classes = read_bundle_objects(Path(sysfs_root))
    except GatherinfoError as err:
        raise CLIError(str(err)) from err
    scenario.add_node_slices(slices, classes, sysfs_root)
