"""What every `dracpu` subcommand shares: the user-facing error, argparse set up the way
behavior.md §2.3 wants it, the root-flag parser, and the node inputs (sysfs root or a
gatherinfo report, topology discovery, the config file, reserved CPUs)."""

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
    from dracpu.config import DriverConfig
    from dracpu.cpuset import CPUSet
    from dracpu.flags import ParsedFlags
    from dracpu.topology import Topology

__all__ = [
    "CLIError",
    "HelpRequested",
    "UsageError",
    "command_parser",
    "discover",
    "host_path",
    "load_driver_config",
    "parse_root",
    "reserved_cpuset",
    "sysfs_root",
]


class CLIError(Exception):
    """A user-facing error: printed as `dracpu: <message>`; exit code in ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class HelpRequested(Exception):
    """Help was asked for and is already on stderr: exit 0."""


class UsageError(Exception):
    """A root flag could not be parsed; the message and usage are already on stderr."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, and prints help to stderr (behavior.md §2.3)."""

    def error(self, message: str) -> NoReturn:
        raise CLIError(f"{self.prog.removeprefix('dracpu ')}: {message}", code=2)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            sys.stderr.write(message)
        raise HelpRequested

    def print_help(self, file: object = None) -> None:
        sys.stderr.write(self.format_help())


def command_parser(prog: str, description: str, example: str) -> argparse.ArgumentParser:
    """The parser of one subcommand; its help ends with one example."""
    return _Parser(
        prog=prog,
        description=description,
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def parse_root(argv: Sequence[str]) -> ParsedFlags:
    """Root flags with Go's conventions: usage on stderr for -h (exit 0) and errors (exit 2)."""
    from dracpu.flags import FlagError, parse_root_flags, usage_text

    try:
        parsed = parse_root_flags(list(argv))
    except FlagError as err:
        sys.stderr.write(f"{err}\n{usage_text()}")
        raise UsageError from err
    if parsed.help:
        sys.stderr.write(usage_text())
        raise HelpRequested
    return parsed


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
