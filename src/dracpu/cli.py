"""The `dracpu` command line: root flags (the daemon) and subcommands.

`dracpu [flags]` is the node daemon; every other word is a subcommand with flags of its own.
Errors are one line on stderr (`dracpu: <message>`) and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import yaml

from dracpu import __version__

if TYPE_CHECKING:
    from dracpu.cpuset import CPUSet
    from dracpu.flags import ParsedFlags

__all__ = ["CLIError", "gatherinfo_main", "main"]

SUBCOMMANDS = ("demo", "gatherinfo", "introspect", "map", "run", "sim", "version")
INTROSPECT_SUBCOMMANDS = ("topology", "slices", "allocate", "metrics")


class CLIError(Exception):
    """A user-facing error: printed as `dracpu: <message>`; exit code in ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class _HelpRequested(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, and prints help to stderr (behavior.md §2.3)."""

    def error(self, message: str) -> NoReturn:
        raise CLIError(f"{self.prog.removeprefix('dracpu ')}: {message}", code=2)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            sys.stderr.write(message)
        raise _HelpRequested

    def print_help(self, file: object = None) -> None:
        sys.stderr.write(self.format_help())


def _parser(prog: str, description: str, example: str) -> _Parser:
    return _Parser(
        prog=prog,
        description=description,
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


# -- shared helpers -----------------------------------------------------------------------


def _host_path(name: str) -> Path:
    """`/sys` or `/proc`, under `$HOST_ROOT` when the driver's host is mounted elsewhere."""
    return Path(os.environ.get("HOST_ROOT", "") + "/" + name)


def _sysfs_root(value: str | None) -> Path:
    """A sysfs root directory, or a gatherinfo report whose `sysfs` section is unpacked."""
    if value is None:
        return _host_path("sys")
    path = Path(value)
    if path.is_dir():
        return path
    if not path.exists():
        raise CLIError(f"sysfs root {value}: no such file or directory")
    return _unpack_bundle(path)


def _unpack_bundle(path: Path) -> Path:
    from dracpu.gatherinfo import GatherinfoError, materialize_sysfs

    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as err:
        raise CLIError(f"read gatherinfo report {path}: {err}") from err
    if (
        len(docs) != 1
        or not isinstance(docs[0], dict)
        or not isinstance(docs[0].get("sysfs"), dict)
    ):
        raise CLIError(
            f"{path} is neither a directory nor a gatherinfo report with a sysfs section"
        )
    files = docs[0]["sysfs"]
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise CLIError(f"{path}: the sysfs section must map paths to strings")
    dest = Path(tempfile.mkdtemp(prefix="dracpu-sysfs-"))
    atexit.register(shutil.rmtree, dest, ignore_errors=True)
    try:
        return materialize_sysfs(files, dest)
    except (GatherinfoError, OSError) as err:
        raise CLIError(f"{path}: {err}") from err


def _discover(sysfs_root: Path, *, overlay: str | None = None, pcie: bool = True) -> object:
    from dracpu.topology import TopologyError, discover_from_root

    try:
        return discover_from_root(sysfs_root, overlay=overlay, expose_pcie_roots=pcie)
    except TopologyError as err:
        raise CLIError(str(err)) from err


# -- subcommands ----------------------------------------------------------------------------


def _cmd_version(argv: Sequence[str]) -> int:
    p = _parser("dracpu version", "Print the dracpu version.", "dracpu version")
    p.parse_args(argv)
    print(f"dracpu {__version__}")
    return 0


def _cmd_introspect(argv: Sequence[str]) -> int:
    supported = ", ".join(INTROSPECT_SUBCOMMANDS)
    if not argv:
        raise CLIError(f"introspect requires a subcommand; supported subcommands: {supported}")
    if argv[0] in ("-h", "--help"):
        sys.stderr.write(
            "usage: dracpu introspect {topology,slices,allocate,metrics} [flags]\n\n"
            "Ask what this node looks like to dracpu, without running the daemon.\n\n"
            "example:\n  dracpu introspect topology --format text\n"
        )
        return 0
    name, rest = argv[0], argv[1:]
    handlers: dict[str, Callable[[Sequence[str]], int]] = {
        "topology": _cmd_introspect_topology,
        "metrics": _cmd_introspect_metrics,
        "allocate": _cmd_introspect_allocate,
        "slices": _cmd_introspect_slices,
    }
    handler = handlers.get(name)
    if handler is None:
        raise CLIError(
            f'unknown introspect subcommand "{name}"; supported subcommands: {supported}'
        )
    return handler(rest)


def _cmd_introspect_metrics(argv: Sequence[str]) -> int:
    from dracpu.metrics import describe_metrics_json

    if list(argv) in (["-h"], ["--help"]):
        sys.stderr.write(
            "usage: dracpu introspect metrics\n\nPrint the driver's custom Prometheus metrics "
            "as JSON.\n\nexample:\n  dracpu introspect metrics\n"
        )
        return 0
    if argv:
        raise CLIError(f"metrics does not accept positional arguments: {' '.join(argv)}")
    sys.stdout.write(describe_metrics_json())
    return 0


def _cmd_introspect_topology(argv: Sequence[str]) -> int:
    from dracpu.introspect import topology_json, topology_text
    from dracpu.topology import Topology

    p = _parser(
        "dracpu introspect topology",
        "Print the CPU topology discovered from sysfs: sockets, NUMA nodes, L3 groups, cores, "
        "SMT siblings, core types and PCIe roots.",
        "dracpu introspect topology --sysfs-root tests/fake_sysfs/xeon-2s-ht --format text",
    )
    p.add_argument("--sysfs-root", help="sysfs directory, or a gatherinfo report (default /sys)")
    p.add_argument("--sysfs-overlay", help="sysfs overlay YAML file")
    p.add_argument("--format", choices=("json", "text"), default="json")
    args = p.parse_args(argv)
    topo = _discover(_sysfs_root(args.sysfs_root), overlay=args.sysfs_overlay)
    assert isinstance(topo, Topology)
    sys.stdout.write(topology_json(topo) if args.format == "json" else topology_text(topo))
    return 0


def _load_config(path: str | None) -> Any:
    from dracpu.config import ConfigError, load_config

    try:
        return load_config(path or "", {})
    except ConfigError as err:
        raise CLIError(str(err)) from err


def _reserved_of(config: Any, override: str | None) -> CPUSet:
    from dracpu.cpuset import CPUSet, CPUSetParseError

    text = override if override is not None else config.reservedCPUs
    try:
        return CPUSet.parse(text)
    except CPUSetParseError as err:
        raise CLIError(f"failed to parse reserved CPUs: {err}") from err


def _cmd_introspect_allocate(argv: Sequence[str]) -> int:
    from dracpu.allocation import (
        AllocationError,
        AllocationOptionsError,
        options_from_kv,
        take_cpus,
    )
    from dracpu.cpuset import CPUSet, CPUSetParseError
    from dracpu.topology import Topology

    p = _parser(
        "dracpu introspect allocate",
        "Print the CPUs dracpu would choose for a claim of COUNT CPUs on this node. "
        "Exit 1 with the reason when the request cannot be met.",
        "dracpu introspect allocate --sysfs-root tests/fake_sysfs/xeon-snc --count 20 "
        "--option fullPCPUsOnly=true",
    )
    p.add_argument("--sysfs-root", help="sysfs directory, or a gatherinfo report (default /sys)")
    p.add_argument("--config", help="driver config file (for reservedCPUs and sysfsOverlay)")
    p.add_argument("--count", type=int, required=True, help="number of CPUs to allocate")
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
    args = p.parse_args(argv)
    config = _load_config(args.config)
    try:
        options = options_from_kv(args.option)
    except AllocationOptionsError as err:
        raise CLIError(str(err)) from err
    reserved = _reserved_of(config, args.reserved)
    topo = _discover(_sysfs_root(args.sysfs_root), overlay=config.sysfsOverlay or None, pcie=False)
    assert isinstance(topo, Topology)
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


def _cmd_introspect_slices(argv: Sequence[str]) -> int:
    import json

    from dracpu.config import resolve_node_name
    from dracpu.devices import DeviceSettings, build_inventory, build_slices
    from dracpu.topology import Topology

    p = _parser(
        "dracpu introspect slices",
        "Print the ResourceSlice objects this node would publish.",
        "dracpu introspect slices --sysfs-root tests/fake_sysfs/epyc-nps4 --node-name node-a",
    )
    p.add_argument("--sysfs-root", help="sysfs directory, or a gatherinfo report (default /sys)")
    p.add_argument("--config", help="driver config file")
    p.add_argument("--node-name", help="node name (default: hostnameOverride, NODE_NAME, hostname)")
    p.add_argument("--expose-pcie-roots", action="store_true", help="publish pcieRoot attributes")
    p.add_argument("--format", choices=("yaml", "json"), default="yaml")
    args = p.parse_args(argv)
    config = _load_config(args.config)
    reserved = _reserved_of(config, None)
    topo = _discover(
        _sysfs_root(args.sysfs_root),
        overlay=config.sysfsOverlay or None,
        pcie=args.expose_pcie_roots,
    )
    assert isinstance(topo, Topology)
    node = args.node_name or resolve_node_name(config)
    settings = DeviceSettings(
        mode=config.cpuDeviceMode,
        group_by=config.groupBy,
        reserved=reserved,
        expose_pcie_roots=args.expose_pcie_roots,
        publish_node_allocatable=config.publishNodeAllocatableResourceMapping,
    )
    slices = build_slices(
        build_inventory(topo, settings),
        node_name=node,
        node_uid="",
        expose_pcie_roots=args.expose_pcie_roots,
    )
    if args.format == "json":
        sys.stdout.write(json.dumps(slices, indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump_all(slices, sort_keys=False, explicit_start=True))
    return 0


def _cmd_gatherinfo(argv: Sequence[str]) -> int:
    from dracpu.gatherinfo import (
        GatherinfoError,
        build_report,
        collect_sysfs,
        find_driver_process,
        path_in_process,
        write_report,
    )
    from dracpu.topology import Topology

    p = _parser(
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
    procfs = _host_path("proc")
    try:
        proc = find_driver_process(procfs)
        config = _driver_config_of(proc.argv, path_in_process(procfs, proc.pid))
        sysfs = _sysfs_root(args.sysfs_root)
        overlay = getattr(config, "sysfsOverlay", "") or getattr(config, "sysfs_overlay", "")
        if overlay:
            overlay = path_in_process(procfs, proc.pid)(overlay)
        topo = _discover(sysfs, overlay=overlay or None, pcie=False)
        assert isinstance(topo, Topology)
        report = build_report(topo, config, collect_sysfs(sysfs))
        if args.stdout:
            sys.stdout.write(report)
            return 0
        path = write_report(report, output_dir=args.output_dir or None)
    except GatherinfoError as err:
        raise CLIError(str(err)) from err
    print(f'"debug info collected" path={path}', file=sys.stderr)
    return 0


def _driver_config_of(argv: list[str], resolve: Callable[[str], str]) -> object:
    from dracpu.config import ConfigError, DriverConfig, driver_argv, reconstruct_from_cmdline

    argv = driver_argv(argv)
    if not argv or os.path.basename(argv[0]) != "dracpu":
        return DriverConfig()
    try:
        return reconstruct_from_cmdline(argv, resolve)
    except ConfigError as err:
        raise CLIError(str(err)) from err


def _cmd_demo(argv: Sequence[str]) -> int:
    import trio

    from dracpu.demo.runner import DemoError, DemoOptions, run_demo
    from dracpu.demo.scenario import ScenarioError, default_scenario, load_scenario
    from dracpu.topology import Topology

    p = _parser(
        "dracpu demo",
        "Run the real daemon against a simulated node (API server, scheduler, kubelet, NRI "
        "runtime and cgroup tree in a temp dir), apply a scenario of Pods and ResourceClaims, "
        "and print the published devices, each claim's CPUs, each container's cpuset read "
        "back from the cgroup tree, and a CPU map. Exit 1 when a claim cannot be satisfied.",
        "dracpu demo --sysfs-root tests/fake_sysfs/xeon-2s-ht --cpu-device-mode grouped",
    )
    p.add_argument("--sysfs-root", help="sysfs directory, or a gatherinfo report (default /sys)")
    p.add_argument("--scenario", help="YAML stream of Pods and ResourceClaims (default: built in)")
    p.add_argument("--output", choices=("text", "json"), default="text")
    p.add_argument("--cpu-device-mode", choices=("grouped", "individual"), default="grouped")
    p.add_argument("--group-by", choices=("numanode", "socket", "machine"), default="numanode")
    p.add_argument("--reserved-cpus", default="", help="CPUs kept out of DRA (e.g. 0-1)")
    p.add_argument("--keep-running", action="store_true", help="leave everything up until Ctrl-C")
    args = p.parse_args(argv)
    sysfs_root = _sysfs_root(args.sysfs_root)
    topo = _discover(sysfs_root)
    assert isinstance(topo, Topology)
    reserved = _reserved_of(None, args.reserved_cpus)
    try:
        if args.scenario:
            scenario = load_scenario(args.scenario)
        else:
            scenario = default_scenario(
                topo,
                mode=args.cpu_device_mode,
                group_by=args.group_by,
                reserved=len(reserved & topo.all_cpus),
            )
    except ScenarioError as err:
        raise CLIError(str(err)) from err
    options = DemoOptions(
        sysfs_root=str(sysfs_root),
        topology=topo,
        scenario=scenario,
        mode=args.cpu_device_mode,
        group_by=args.group_by,
        reserved=args.reserved_cpus,
        output=args.output,
        keep_running=args.keep_running,
    )
    try:
        result = trio.run(run_demo, options, sys.stdout)
    except DemoError as err:
        raise CLIError(f"demo: {err}") from err
    for problem in result.problems:
        print(f"dracpu demo: {problem}", file=sys.stderr)
    return 1 if result.problems else 0


def _cmd_map(argv: Sequence[str]) -> int:
    import json
    import urllib.error
    import urllib.request

    from dracpu.cpumap import render_cpu_map, rows_from_document
    from dracpu.cpuset import CPUSet, CPUSetParseError
    from dracpu.daemon.app import claims_of_state

    p = _parser(
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
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            state = json.load(resp)
    except (urllib.error.URLError, OSError) as err:
        raise CLIError(f"cannot read {url}: {getattr(err, 'reason', err)}") from err
    except ValueError as err:
        raise CLIError(f"{url} did not answer JSON: {err}") from err
    try:
        rows = rows_from_document(state.get("topology") or {})
        claims = claims_of_state(state)
        shared = CPUSet.parse(state.get("sharedPool", ""))
        reserved = CPUSet.parse(state.get("reserved", ""))
    except (ValueError, CPUSetParseError, KeyError, TypeError, AttributeError) as err:
        raise CLIError(f"{url} is not a dracpu debug state: {err}") from err
    print(f"node {state.get('node', '?')}")
    sys.stdout.write(render_cpu_map(rows, claims=claims, shared=shared, reserved=reserved))
    return 0


def _cmd_sim(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(
            "usage: dracpu sim apiserver|runtime [flags]\n\n"
            "Run parts of the simulated node on their own.\n\n"
            "example:\n  dracpu sim apiserver --port 0 --kubeconfig-out /tmp/kubeconfig\n"
        )
        if not argv:
            raise CLIError("sim requires a subcommand; supported subcommands: apiserver, runtime")
        return 0
    if argv[0] == "runtime":
        from dracpu.sim.runtime.__main__ import main as runtime_main

        return runtime_main(list(argv[1:]))
    if argv[0] != "apiserver":
        raise CLIError(
            f'unknown sim subcommand "{argv[0]}"; supported subcommands: apiserver, runtime'
        )
    import trio

    from dracpu.sim.apiserver import main_apiserver

    p = _parser(
        "dracpu sim apiserver",
        "Serve a loopback Kubernetes API server (resource.k8s.io/v1 slices, claims, device "
        "classes; v1 nodes and pods) on 127.0.0.1 and write a kubeconfig for it. Runs until "
        "interrupted; prints its URL when listening.",
        "dracpu sim apiserver --port 0 --kubeconfig-out /tmp/kubeconfig && "
        "kubectl --kubeconfig /tmp/kubeconfig get resourceslices",
    )
    p.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = any free)")
    p.add_argument("--kubeconfig-out", required=True, help="where to write the kubeconfig")
    args = p.parse_args(argv[1:])
    try:
        trio.run(main_apiserver, args.port, args.kubeconfig_out)
    except OSError as err:
        raise CLIError(f"sim apiserver: {err}") from err
    return 0


SUBCOMMAND_HANDLERS: dict[str, Callable[[Sequence[str]], int]] = {
    "sim": _cmd_sim,
    "version": _cmd_version,
    "introspect": _cmd_introspect,
    "gatherinfo": _cmd_gatherinfo,
    "demo": _cmd_demo,
    "map": _cmd_map,
}


# -- entry points ------------------------------------------------------------------------


def _start_daemon(explicit: dict[str, object]) -> NoReturn:
    """`dracpu run`: resolve the configuration (behavior.md §3.3, §16), then run the daemon
    until SIGTERM/SIGINT (exit 0) or a fatal error (exit 1)."""
    from dracpu.daemon import lean_kubernetes_import

    lean_kubernetes_import()  # before anything below imports kubernetes

    import trio

    from dracpu.config import (
        ConfigError,
        config_dump_yaml,
        deprecated_flags_set,
        load_config,
        parse_reserved_cpus,
        resolve_node_name,
    )
    from dracpu.daemon.app import Daemon
    from dracpu.k8s.client import K8sError, KubeClient
    from dracpu.logs import LogSetupError, get_logger, setup_logging
    from dracpu.nursery.supervisor import run_daemon

    try:
        setup_logging(
            str(explicit.get("log-format", "text")),
            int(explicit.get("v", 0)),  # type: ignore[call-overload]
            vmodule=str(explicit.get("vmodule", "")),
        )
    except LogSetupError as err:
        raise CLIError(str(err)) from err
    log = get_logger("dracpu")
    for flag, field in deprecated_flags_set(explicit):
        log.warning("flag is deprecated", flag=flag, driverConfigField=field)
    try:
        config = load_config(str(explicit.get("config", "")), explicit)
        parse_reserved_cpus(config)
        node_name = resolve_node_name(config)
    except ConfigError as err:
        log.error("failed to run", err=f"failed to load configuration: {err}")
        raise CLIError(f"failed to load configuration: {err}") from err
    log.info("configuration successfully loaded", config=config_dump_yaml(config))
    try:
        kube = KubeClient.from_kubeconfig(config.kubeconfig or None)
    except K8sError as err:
        log.error("failed to run", err=err)
        raise CLIError(f"failed to create the Kubernetes client: {err}") from err
    proc_root = str(_host_path("proc"))
    daemon = Daemon(config, kube=kube, node_name=node_name, proc_root=proc_root)
    try:
        code = trio.run(run_daemon, daemon.startup)
    finally:
        kube.close()
    raise SystemExit(code)


class _UsageError(Exception):
    """A root flag could not be parsed; the message and usage are already on stderr."""


def _parse_root(argv: Sequence[str]) -> ParsedFlags:
    """Root flags with Go's conventions: usage on stderr for -h (exit 0) and errors (exit 2)."""
    from dracpu.flags import FlagError, parse_root_flags, usage_text

    try:
        parsed = parse_root_flags(list(argv))
    except FlagError as err:
        sys.stderr.write(f"{err}\n{usage_text()}")
        raise _UsageError from err
    if parsed.help:
        sys.stderr.write(usage_text())
        raise _HelpRequested
    return parsed


def run(argv: Sequence[str]) -> int:
    parsed = _parse_root(argv)
    if parsed.positionals and parsed.positionals[0] == "run":
        if parsed.explicit:
            raise CLIError("root flags cannot be combined with subcommands")
        parsed = _parse_root(parsed.positionals[1:])
        if parsed.positionals:
            raise CLIError(
                f"run does not accept positional arguments: {' '.join(parsed.positionals)}"
            )
        _start_daemon(parsed.explicit)
    if not parsed.positionals:
        _start_daemon(parsed.explicit)
    name, rest = parsed.positionals[0], parsed.positionals[1:]
    if parsed.explicit:
        raise CLIError("root flags cannot be combined with subcommands")
    handler = SUBCOMMAND_HANDLERS.get(name)
    if handler is None:
        supported = ", ".join(sorted(SUBCOMMAND_HANDLERS))
        raise CLIError(f'unknown subcommand "{name}"; supported subcommands: {supported}')
    return handler(rest)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None and os.path.basename(sys.argv[0]) == "dracpu-gatherinfo":
        args = ["gatherinfo", *args]
    try:
        return run(args)
    except _HelpRequested:
        return 0
    except _UsageError:
        return 2
    except CLIError as err:
        print(f"dracpu: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        return 130
    except BaseExceptionGroup as group:
        # Ctrl-C inside a Trio nursery arrives wrapped in a group.
        _, rest = group.split(KeyboardInterrupt)
        if rest is None:
            return 130
        raise
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 1


def gatherinfo_main() -> int:
    """The legacy `dracpu-gatherinfo` entry point (behavior.md §2.1)."""
    return main(["gatherinfo", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
