"""What every `dracpu` subcommand shares: the user-facing error, argparse set up to raise
instead of exit, the root-flag parser, and the node inputs (sysfs root or a gatherinfo
report, topology discovery, the config file, reserved CPUs).

Help, asked for, goes to stdout with exit 0 (`dracpu demo --help | less` works, as it does
for git, kubectl and argparse itself); errors and the usage after a bad flag go to stderr."""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import yaml

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

    from dracpu.config import DriverConfig
    from dracpu.cpuset import CPUSet
    from dracpu.flags import ParsedFlags
    from dracpu.topology import Topology

__all__ = [
    "CLIError",
    "HelpRequested",
    "command_parser",
    "discover",
    "host_path",
    "load_driver_config",
    "parse_root",
    "positive_int",
    "print_help_text",
    "require_simulator",
    "reserved_cpuset",
    "sysfs_root",
]


class CLIError(Exception):
    """A user-facing error: printed as `dracpu: <message>`; exit code in ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class HelpRequested(Exception):
    """What was asked for (help, the version) is already on stdout: exit 0."""


def print_help_text(text: str) -> NoReturn:
    """Help that was asked for: on stdout, then exit 0 (`HelpRequested`)."""
    sys.stdout.write(text)
    raise HelpRequested


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting; its help goes to stdout (argparse's own
    choice), its errors are one `CLIError` line."""

    def error(self, message: str) -> NoReturn:
        raise CLIError(f"{self.prog.removeprefix('dracpu ')}: {message}", code=2)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        # Only help (and a version action) end here: error() raises before.
        if message:
            sys.stderr.write(message)
        raise HelpRequested

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        # argparse's own writer swallows OSError: a closed stdout must reach main().
        (file or sys.stdout).write(self.format_help())


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps the description as argparse does, keeps the example's lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("example:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def command_parser(prog: str, description: str, example: str) -> argparse.ArgumentParser:
    """The parser of one subcommand; its help ends with one example (lines of it indented)."""
    indented = "\n".join(f"  {line}" for line in example.splitlines())
    return _Parser(
        prog=prog,
        description=description,
        epilog=f"example:\n{indented}",
        formatter_class=_HelpFormatter,
    )


def positive_int(text: str) -> int:
    """An argparse type: a whole number of 1 or more (the message names the bad value)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def parse_root(argv: Sequence[str]) -> ParsedFlags:
    """Root flags with Go's conventions: a bad flag is one line in Go's wording and exit 2,
    as a subcommand's bad flag is. -h prints the usage and --version the version, both on
    stdout with exit 0 (`HelpRequested`)."""
    from dracpu.flags import FlagError, parse_root_flags, usage_text

    try:
        parsed = parse_root_flags(list(argv))
    except FlagError as err:
        raise CLIError(f"{err} (see dracpu --help)", code=2) from err
    if parsed.help:
        print_help_text(usage_text())
    if parsed.version:
        from dracpu.cli.version import version_line

        print_help_text(version_line() + "\n")
    return parsed


def require_simulator(command: str) -> None:
    """The simulated node is installed, or one line saying how to get it.

    The simulator (`dracpu_sim`: demo, sim, chaos, fleet) is its own distribution in the
    repository's `sim/` directory, with its own dependencies (grpcio, cel-python); the
    daemon's wheel and image hold neither. `make .venv` installs it from a checkout.
    """
    import importlib.util

    def installed(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ImportError:
            return False

    if not installed("dracpu_sim"):
        raise CLIError(
            f"{command} runs the simulated node, which is not installed: from a dracpu "
            "checkout, run make .venv (or pip install ./sim)"
        )
    missing = [
        dist
        for module, dist in (("grpc", "grpcio"), ("celpy", "cel-python"))
        if not installed(module)
    ]
    if missing:
        raise CLIError(
            f"{command} runs the simulated node, which needs {' and '.join(missing)}; "
            "install them with: pip install ./sim"
        )


# -- the node a command looks at ----------------------------------------------------------


def host_path(name: str) -> Path:
    """`/sys` or `/proc`, under `$HOST_ROOT` when the driver's host is mounted elsewhere."""
    return Path(os.environ.get("HOST_ROOT", "") + "/" + name)


def sysfs_root(value: str | None) -> Path:
    """A sysfs root directory, or a gatherinfo report whose `sysfs` section is unpacked."""
    if value is None:
        return host_path("sys")
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


def discover(root: Path, *, overlay: str | None = None, pcie: bool = True) -> Topology:
    """The topology under sysfs `root`; a discovery failure is a `CLIError`."""
    from dracpu.topology import TopologyError, discover_from_root

    try:
        return discover_from_root(root, overlay=overlay, expose_pcie_roots=pcie)
    except TopologyError as err:
        raise CLIError(str(err)) from err


def load_driver_config(path: str | None) -> DriverConfig:
    """The driver config from `path` (defaults when None) without any flag layer."""
    from dracpu.config import ConfigError, load_config

    try:
        return load_config(path or "", {})
    except ConfigError as err:
        raise CLIError(str(err)) from err


def reserved_cpuset(text: str) -> CPUSet:
    from dracpu.cpuset import CPUSet, CPUSetParseError

    try:
        return CPUSet.parse(text)
    except CPUSetParseError as err:
        raise CLIError(f"failed to parse reserved CPUs: {err}") from err
