"""`dracpu run` (or `dracpu` with root flags only): the node daemon.

The configuration is defaults ← the YAML file (`--config`) ← explicitly set flags; the daemon
then runs until SIGTERM/SIGINT (exit 0) or a fatal error (exit 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, NoReturn

from dracpu.cli.common import CLIError, host_path, parse_root

if TYPE_CHECKING:
    from dracpu.config import DriverConfig
    from dracpu.logs import Logger

__all__ = ["cmd_run", "start_daemon"]


def cmd_run(argv: Sequence[str]) -> NoReturn:
    """`dracpu run [flags]`: the root flags, spelled out after `run`."""
    parsed = parse_root(argv)
    if parsed.positionals:
        raise CLIError(f"run does not accept positional arguments: {' '.join(parsed.positionals)}")
    start_daemon(parsed.explicit)


def _configure_logging(explicit: dict[str, object]) -> Logger:
    from dracpu.logs import LogSetupError, get_logger, setup_logging

    try:
        setup_logging(
            str(explicit.get("log-format", "text")),
            int(explicit.get("v", 0)),  # type: ignore[call-overload]
            vmodule=str(explicit.get("vmodule", "")),
        )
    except LogSetupError as err:
        raise CLIError(str(err)) from err
    return get_logger("dracpu")


def _resolve_config(explicit: dict[str, object], log: Logger) -> tuple[DriverConfig, str]:
    """The effective config and the node name; a bad one is a `CLIError` (one line)."""
    from dracpu.config import (
        ConfigError,
        deprecated_flags_set,
        load_config,
        parse_reserved_cpus,
        resolve_node_name,
    )

    for flag, field in deprecated_flags_set(explicit):
        log.warning("flag is deprecated", flag=flag, driverConfigField=field)
    try:
        config = load_config(str(explicit.get("config", "")), explicit)
        parse_reserved_cpus(config)
        node_name = resolve_node_name(config)
    except ConfigError as err:
        raise CLIError(f"failed to load configuration: {err}") from err
    return config, node_name


def _check_kubeconfig_readable(path: str) -> None:
    """The kubernetes client reads a missing file as "No configuration found": say why."""
    if not path:
        return
    try:
        with open(path, "rb"):
            pass
    except OSError as err:
        raise CLIError(
            f"failed to create the Kubernetes client: kubeconfig {path}: "
            f"{(err.strerror or str(err)).lower()}"
        ) from err


def start_daemon(explicit: dict[str, object]) -> NoReturn:
    """Resolve the configuration from the explicitly set root flags, then run the daemon.

    The Kubernetes client is made before the configuration is logged, so a kubeconfig that
    cannot be read is one error line, not a config dump followed by the error. Start-up
    errors are printed once, as `dracpu: <message>`, not also as a log line.
    """
    from dracpu.daemon import lean_kubernetes_import

    lean_kubernetes_import()  # before anything below imports kubernetes

    import trio

    from dracpu import heap
    from dracpu.config import config_dump_yaml
    from dracpu.daemon.app import Daemon
    from dracpu.k8s.client import K8sError, KubeClient
    from dracpu.nursery.supervisor import Service, Supervisor, run_daemon

    log = _configure_logging(explicit)
    config, node_name = _resolve_config(explicit, log)
    _check_kubeconfig_readable(config.kubeconfig)
    try:
        kube = KubeClient.from_kubeconfig(config.kubeconfig or None)
    except K8sError as err:
        raise CLIError(f"failed to create the Kubernetes client: {err}") from err
    log.info("configuration successfully loaded", config=config_dump_yaml(config))
    # --proc-root points at another procfs (a fake tree in tests and the simulated node).
    proc_root = config.procRoot if config.procRoot != "/proc" else str(host_path("proc"))
    daemon = Daemon(config, kube=kube, node_name=node_name, proc_root=proc_root)

    async def startup(sup: Supervisor) -> None:
        await daemon.startup(sup)
        # Once ready, what is alive lives as long as the process: out of the collector's way.
        settle = partial(heap.settle_when_ready, sup.readiness.view())
        await sup.start(Service(name="heap", run=settle, restart=False))

    try:
        code = trio.run(run_daemon, startup)
    finally:
        kube.close()
    raise SystemExit(code)
