"""`dracpu version`."""

from __future__ import annotations

from collections.abc import Sequence

from dracpu import __version__
from dracpu.cli.common import command_parser

__all__ = ["cmd_version"]


def cmd_version(argv: Sequence[str]) -> int:
    p = command_parser("dracpu version", "Print the dracpu version.", "dracpu version")
    p.parse_args(argv)
    print(f"dracpu {__version__}")
    return 0
