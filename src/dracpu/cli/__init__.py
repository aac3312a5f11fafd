"""The `dracpu` command line: root flags (the daemon) and subcommands.

`dracpu [flags]` is the node daemon; every other word is a subcommand with flags of its own,
in the module of the same name (`run`, `demo`, `map`, `introspect`, `gatherinfo`, `sim`,
`version`; what they share is in `common`). Errors are one line on stderr
(`dracpu: <message>`) and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from dracpu.cli.common import CLIError, HelpRequested, parse_root
from dracpu.cli.demo import cmd_demo
from dracpu.cli.gatherinfo import cmd_gatherinfo
from dracpu.cli.introspect import INTROSPECT_SUBCOMMANDS, cmd_introspect
from dracpu.cli.map import cmd_map
from dracpu.cli.run import cmd_run, start_daemon
from dracpu.cli.sim import cmd_sim
from dracpu.cli.version import cmd_version

__all__ = [
    "INTROSPECT_SUBCOMMANDS",
    "SUBCOMMANDS",
    "SUBCOMMAND_HANDLERS",
    "CLIError",
    "dispatch",
    "gatherinfo_main",
    "main",
]

SUBCOMMANDS = ("demo", "gatherinfo", "introspect", "map", "run", "sim", "version")

# Every subcommand but `run`, which is the daemon's root flags spelled out.
SUBCOMMAND_HANDLERS: dict[str, Callable[[Sequence[str]], int]] = {
    "sim": cmd_sim,
    "version": cmd_version,
    "introspect": cmd_introspect,
    "gatherinfo": cmd_gatherinfo,
    "demo": cmd_demo,
    "map": cmd_map,
}


def dispatch(argv: Sequence[str]) -> int:
    """Run the command `argv` names; user errors raise `CLIError`."""
    parsed = parse_root(argv)
    if not parsed.positionals:
        start_daemon(parsed.explicit)
    name, rest = parsed.positionals[0], parsed.positionals[1:]
    if parsed.explicit:
        raise CLIError("root flags cannot be combined with subcommands")
    if name == "run":
        cmd_run(rest)
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
        return dispatch(args)
    except HelpRequested:
        return 0
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
    """The `dracpu-gatherinfo` entry point, kept for scripts written for the Go driver."""
    return main(["gatherinfo", *sys.argv[1:]])
