"""`dracpu introspect {topology,slices,allocate,metrics}`: what this node looks like to
dracpu, without running the daemon."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import yaml

from dracpu.cli.common import (
    CLIError,
    command_parser,
    discover,
    load_driver_config,
    positive_int,
    print_help_text,
    reserved_cpuset,
    sysfs_root,
)

__all__ = ["INTROSPECT_SUBCOMMANDS", "cmd_introspect"]

INTROSPECT_SUBCOMMANDS = ("topology", "slices", "allocate", "metrics")
_SYSFS_ROOT_HELP = "sysfs directory, or a gatherinfo report (default /sys)"


def cmd_introspect(argv: Sequence[str]) -> int:
    supported = ", ".join(INTROSPECT_SUBCOMMANDS)
    if not argv:
        raise CLIError(f"introspect requires a subcommand; supported subcommands: {supported}")
    if argv[0] in ("-h", "--help"):
        print_help_text(
            f"usage: dracpu introspect {{{','.join(INTROSPECT_SUBCOMMANDS)}}} [flags]\n\n"
            "Ask what this node looks like to dracpu, without running the daemon. Each "
            "subcommand has its own --help.\n\n"
            "example:\n  dracpu introspect topology --format text\n"
        )
    name, rest = argv[0], argv[1:]
    handlers: dict[str, Callable[[Sequence[str]], int]] = {
        "topology": _topology,
        "metrics": _metrics,
        "allocate": _allocate,
        "slices": _slices,
    }
    handler = handlers.get(name)
    if handler is None:
        raise CLIError(
            f'unknown introspect subcommand "{name}"; supported subcommands: {supported}'
        )
    return handler(rest)


def _metrics(argv: Sequence[str]) -> int:
    from dracpu.metrics import describe_metrics_json

    if list(argv) in (["-h"], ["--help"]):
        print_help_text(
            "usage: dracpu introspect metrics\n\nPrint the driver's custom Prometheus metrics "
            "as JSON.\n\nexample:\n  dracpu introspect metrics\n"
        )
    if argv:
        raise CLIError(f"metrics does not accept positional arguments: {' '.join(argv)}")
    sys.stdout.write(describe_metrics_json())
    return 0


def _topology(argv: Sequence[str]) -> int:
    from dracpu.introspect import topology_json, topology_text

    p = command_parser(
        "dracpu introspect topology",
        "Print the CPU topology discovered from sysfs: sockets, NUMA nodes, L3 groups, cores, "
        "SMT siblings, core types and PCIe roots.",
        "dracpu introspect topology --sysfs-root tests/fake_sysfs/xeon-2s-ht --format text",
    )
    p.add_argument("--sysfs-root", help=_SYSFS_ROOT_HELP)
    p.add_argument("--sysfs-overlay", help="sysfs overlay YAML file")
    p.add_argument("--format", choices=("json", "text"), default="json")
    args = p.parse_args(argv)
    topo = discover(sysfs_root(args.sysfs_root), overlay=args.sysfs_overlay)
    sys.stdout.write(topology_json(topo) if args.format == "json" else topology_text(topo))
    return 0


def _allocate_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "dracpu introspect allocate",
        "Print the CPUs dracpu would choose for a claim of COUNT CPUs on this node. "
        "Exit 1 with the reason when the request cannot be met.",
        "dracpu introspect allocate --sysfs-root tests/fake_sysfs/xeon-snc --count 20 "
        "--option fullPCPUsOnly=true",
    )
    p.add_argument("--sysfs-root", help=_SYSFS_ROOT_HELP)
    p.add_argument("--config", help="driver config file (for reservedCPUs and sysfsOverlay)")
    p.add_argument(
        "--count", type=positive_int, required=True, help="number of CPUs to allocate (1 or more)"
    )
    p.add_argument("--available", help="cpuset to choose from (default: all but reserved)")
    p.add_argument("--reserved", help="reserved cpuset (default: the config's reservedCPUs)")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="allocation option: fullPCPUsOnly, distributeAcrossNUMA, "
        "preferAlignByUncoreCache (true|false), strategy (packed|spread)",
    )
    return p


def _allocate(argv: Sequence[str]) -> int:
    from dracpu.allocation import (
        AllocationError,
        AllocationOptionsError,
        options_from_kv,
        take_cpus,
    )
    from dracpu.cpuset import CPUSet, CPUSetParseError

    args = _allocate_parser().parse_args(argv)
    config = load_driver_config(args.config)
    try:
        options = options_from_kv(args.option)
    except AllocationOptionsError as err:
        raise CLIError(str(err)) from err
    reserved = reserved_cpuset(args.reserved if args.reserved is not None else config.reservedCPUs)
    topo = discover(sysfs_root(args.sysfs_root), overlay=config.sysfsOverlay or None, pcie=False)
    available = topo.all_cpus - reserved
    if args.available is not None:
        try:
            available = CPUSet.parse(args.available) - reserved
        except CPUSetParseError as err:
            raise CLIError(f"--available: {err}") from err
    try:
        chosen = take_cpus(topo, available, args.count, options)
    except AllocationError as err:
        raise CLIError(str(err)) from err
    print(chosen.format())
    return 0


def _slices(argv: Sequence[str]) -> int:
    import json

    from dracpu.allocation.floor import unpublished_cpus
    from dracpu.config import resolve_node_name
    from dracpu.devices import DeviceSettings, build_inventory, build_slices

    p = command_parser(
        "dracpu introspect slices",
        "Print the ResourceSlice objects this node would publish.",
        "dracpu introspect slices --sysfs-root tests/fake_sysfs/epyc-nps4 --node-name node-a",
    )
    p.add_argument("--sysfs-root", help=_SYSFS_ROOT_HELP)
    p.add_argument("--config", help="driver config file")
    p.add_argument("--node-name", help="node name (default: hostnameOverride, NODE_NAME, hostname)")
    p.add_argument("--expose-pcie-roots", action="store_true", help="publish pcieRoot attributes")
    p.add_argument("--format", choices=("yaml", "json"), default="yaml")
    args = p.parse_args(argv)
    config = load_driver_config(args.config)
    reserved = reserved_cpuset(config.reservedCPUs)
    topo = discover(
        sysfs_root(args.sysfs_root),
        overlay=config.sysfsOverlay or None,
        pcie=args.expose_pcie_roots,
    )
    if topo.all_cpus and not topo.all_cpus - reserved:
        raise CLIError(
            f"reservedCPUs {config.reservedCPUs} covers every CPU of this node "
            f"({topo.all_cpus.format()}): there is nothing to publish"
        )
    node = args.node_name or resolve_node_name(config)
    # What the daemon leaves out: the reserved CPUs, the shared pool's floor (one core
    # when reservedCPUs holds none of this node's CPUs) and, by default, isolated CPUs.
    unpublished = unpublished_cpus(topo, reserved, publish_isolated=config.publishIsolatedCPUs)
    settings = DeviceSettings(
        # load_config validated both; DriverConfig keeps them as plain strings.
        mode=config.cpuDeviceMode,  # type: ignore[arg-type]
        group_by=config.groupBy,  # type: ignore[arg-type]
        reserved=unpublished,
        expose_pcie_roots=args.expose_pcie_roots,
        publish_node_allocatable=config.publishNodeAllocatableResourceMapping,
    )
    inventory = build_inventory(topo, settings)
    if not inventory.devices:
        # As the daemon, which publishes nothing then: say why rather than print nothing.
        print(
            f"dracpu: no devices to publish: CPUs {unpublished.format()} of this node are "
            "reserved, isolated or kept in the shared pool",
            file=sys.stderr,
        )
    slices = build_slices(
        inventory,
        node_name=node,
        node_uid="",
        expose_pcie_roots=args.expose_pcie_roots,
    )
    if args.format == "json":
        sys.stdout.write(json.dumps(slices, indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump_all(slices, sort_keys=False, explicit_start=True))
    return 0
