"""Fenced blocks of the docs pages, with the `docs-check` marker above each one.

A marker is an HTML comment on the line directly above a fence (invisible when the page is
rendered): `<!-- docs-check: run -->`. docs/development.md lists the markers and what the
docs tests do with each.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SHELL_LANGS = frozenset({"sh", "bash", "shell", "console"})
_MARKER = re.compile(r"^<!-- docs-check: (?P<marker>[a-z-]+(?: [a-z-]+)?) -->$")
_FENCE = re.compile(r"^(?P<fence>`{3,})(?P<lang>[\w-]*)\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    marker: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    def commands(self) -> list[str]:
        """The block's command lines: continuations joined, comments and blanks dropped."""
        joined: list[str] = []
        pending = ""
        for raw in self.text.splitlines():
            line = raw.rstrip()
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            line = pending + line
            pending = ""
            if line.strip() and not line.lstrip().startswith("#"):
                joined.append(line.strip())
        return joined


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def marker_above(lines: list[str], index: int) -> str | None:
    """The docs-check marker on the line directly above line `index` (0-based), if any."""
    if index == 0:
        return None
    match = _MARKER.match(lines[index - 1].strip())
    return match.group("marker") if match else None


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        fence, lang = match.group("fence"), match.group("lang")
        end = next(
            (j for j in range(i + 1, len(lines)) if lines[j].strip() == fence),
            None,
        )
        if end is None:
            raise ValueError(f"{page}:{i + 1}: unclosed code fence")
        text = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(page, i + 1, lang, marker_above(lines, i), text))
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]


def words(command: str) -> list[str]:
    """A command line split like the shell, up to the first pipe, redirect or `||`."""
    out: list[str] = []
    for word in shlex.split(command, comments=True):
        if word in ("|", "||", "&&", ">", "2>", "&", ";") or word.startswith(">"):
            break
        out.append(word)
    return out
