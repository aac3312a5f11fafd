"""The `dracpu` command line: root flags (the daemon) and subcommands.

`dracpu [flags]` is the node daemon; every other word is a subcommand with flags of its own,
in the module of the same name (`run`, `demo`, `map`, `introspect`, `gatherinfo`, `sim`,
`version`; what they share is in `common`). Errors are one line on stderr
(`dracpu: <message>`) and a non-zero exit, never a traceback. Help goes to stdout.

A reader that closes stdout early (`dracpu demo | head -2`) ends the command quietly with
exit 141, 128 + SIGPIPE: what a shell reports for a C tool killed by SIGPIPE in the same
place, so `set -o pipefail` scripts see dracpu as they see `yes | head -1`. Python ignores
SIGPIPE and raises `BrokenPipeError` instead; leaving it unhandled prints a traceback, and
the buffered rest fails again at exit ("Exception ignored ... BrokenPipeError", exit 120).
This follows the recipe of https://docs.python.org/3/library/signal.html#note-on-sigpipe
(which exits 1): flush inside the `try`, then point stdout at /dev/null for the exit.
"""

from __future__ import annotations

import os
import select
import signal
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
    "EXIT_CLOSED_STDOUT",
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


# The exit status of a command whose stdout was closed under it.
EXIT_CLOSED_STDOUT = 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None and os.path.basename(sys.argv[0]) == "dracpu-gatherinfo":
        args = ["gatherinfo", *args]
    try:
        code = _run(args)
        sys.stdout.flush()  # a closed pipe is found here, not at interpreter exit
    except BrokenPipeError:
        if not _stdout_is_broken():
            raise  # another pipe or socket broke: a real error, with its traceback
        return _stdout_closed()
    except BaseExceptionGroup as group:
        # Written to inside a Trio nursery (the demo's report), it arrives in a group.
        _, rest = group.split(BrokenPipeError)
        if rest is None and _stdout_is_broken():
            return _stdout_closed()
        raise
    return code


def _stdout_is_broken() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports POLLERR on the write
    end of such a pipe), so a BrokenPipeError is the closed stdout and not another pipe."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return True  # no file behind it (a test's capture): the error can only be its own
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _run(args: list[str]) -> int:
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


def _stdout_closed() -> int:
    """stdout's reader is gone: what is still buffered goes to /dev/null, not to a second
    BrokenPipeError when Python flushes stdout on its way out."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # stdout is no file (a test's capture): nothing will flush to a pipe
    return EXIT_CLOSED_STDOUT


def gatherinfo_main() -> int:
    """The `dracpu-gatherinfo` entry point, kept for scripts written for the Go driver."""
    return main(["gatherinfo", *sys.argv[1:]])
