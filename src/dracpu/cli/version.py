"""`dracpu version` and `dracpu --version`: one line, the same for both."""

from __future__ import annotations

from collections.abc import Sequence

from dracpu import __version__
from dracpu.cli.common import command_parser

__all__ = ["cmd_version", "version_line"]


def version_line() -> str:
    """What both spellings print (SECURITY.md asks reporters for it)."""
    return f"dracpu {__version__}"


def cmd_version(argv: Sequence[str]) -> int:
    p = command_parser(
        "dracpu version",
        "Print the dracpu version (the same line as dracpu --version).",
        "dracpu version",
    )
    p.parse_args(argv)
    print(version_line())
    return 0
