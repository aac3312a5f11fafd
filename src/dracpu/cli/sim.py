"""`dracpu sim <part>`: parts of the simulated node run on their own.

Each part is one entry of `SIM_SUBCOMMANDS` (name → handler taking the words after the
name); the usage line and the unknown-subcommand error list them in that order. A new part
is one more entry; `fleet` runs many nodes' slice reconcilers against one API server.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from dracpu.cli.common import CLIError, command_parser, print_help_text, require_simulator

__all__ = ["SIM_SUBCOMMANDS", "cmd_sim"]


def _runtime(argv: Sequence[str]) -> int:
    from dracpu_sim.runtime.__main__ import main as runtime_main

    return runtime_main(list(argv))


def _apiserver(argv: Sequence[str]) -> int:
    import trio

    from dracpu_sim.apiserver import main_apiserver

    p = command_parser(
        "dracpu sim apiserver",
        "Serve a loopback Kubernetes API server (resource.k8s.io/v1 slices, claims, claim "
        "templates, device classes; v1 nodes and pods, with OpenAPI v3 documents for kubectl's "
        "validation) on 127.0.0.1 and write a kubeconfig for it. Only the API: no scheduler or "
        "kubelet acts on what you create (dracpu demo --keep-running runs the whole node). "
        "Runs until interrupted; prints its URL when listening.",
        "dracpu sim apiserver --port 0 --kubeconfig-out /tmp/kubeconfig\n"
        "# it serves until Ctrl-C; in another terminal:\n"
        "kubectl --kubeconfig /tmp/kubeconfig apply -f docs/examples/grouped-claim.yaml\n"
        "kubectl --kubeconfig /tmp/kubeconfig get resourceclaims,pods",
    )
    p.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = any free)")
    p.add_argument("--kubeconfig-out", required=True, help="where to write the kubeconfig")
    args = p.parse_args(argv)
    try:
        trio.run(main_apiserver, args.port, args.kubeconfig_out)
    except OSError as err:
        raise CLIError(f"sim apiserver: {err}") from err
    return 0


def _fleet(argv: Sequence[str]) -> int:
    from dracpu_sim.fleet.cli import main as fleet_main

    return fleet_main(list(argv), prog="dracpu sim fleet")


SIM_SUBCOMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "apiserver": _apiserver,
    "runtime": _runtime,
    "fleet": _fleet,
}


def _usage() -> str:
    return (
        f"usage: dracpu sim {{{','.join(SIM_SUBCOMMANDS)}}} [flags]\n\n"
        "Run parts of the simulated node on their own: a loopback API server, the NRI\n"
        "runtime, or a fleet of nodes' slice publishers against one API server. Each has\n"
        "its own --help.\n\n"
        "example:\n  dracpu sim apiserver --port 0 --kubeconfig-out /tmp/kubeconfig\n"
        "  dracpu sim runtime --socket /tmp/nri.sock --cgroup-root /tmp/cg "
        "--cgroup-version 2 --cgroup-driver systemd\n"
        "  dracpu sim fleet --nodes 100 --duration 20\n"
    )


def cmd_sim(argv: Sequence[str]) -> int:
    supported = ", ".join(SIM_SUBCOMMANDS)
    if not argv:
        sys.stderr.write(_usage())
        raise CLIError(f"sim requires a subcommand; supported subcommands: {supported}")
    if argv[0] in ("-h", "--help"):
        print_help_text(_usage())
    handler = SIM_SUBCOMMANDS.get(argv[0])
    if handler is None:
        raise CLIError(f'unknown sim subcommand "{argv[0]}"; supported subcommands: {supported}')
    require_simulator(f"dracpu sim {argv[0]}")
    return handler(argv[1:])
