"""Refuse YAML nested too deeply before PyYAML spends time or stack on it.

Two costs grow with nesting in PyYAML, which is pure Python here: its scanner keeps a
possible simple key per open flow collection and checks all of them on every token, and
it reads up to 1,024 characters ahead while one is pending, so ``[[[[...`` costs ~1,024^2
steps (~0.35 s) before the first event; and its composer recurses once per level, so deep
documents end in RecursionError at a depth set by whoever last changed the recursion
limit. `check_nesting` guards both: a linear pass over the raw text bounds the flow
nesting first (so the scanner never sees deep flow collections), then the event parser,
which does not recurse, bounds all nesting.

The raw pass follows the scanner's cost: a possible simple key goes stale at the end of
its line (or 1,024 characters on), so what the scanner checks on each token is the flow
collections opened on the current line and not yet closed. The pass counts those for
every line, skipping quoted scalars that open right after ``[``, ``{``, ``,`` or a value's
colon (exact: there a quote can only start one), also after a tag or an anchor
(``[!t 'x']``), and nothing else (comments and block scalars are counted as they come).
Brackets it counts that are text can only make it refuse a strange line; closing
brackets it counts that are text (a quote after a tag longer than 256 characters) hide a
level for 256 characters each, harmless. Flow collections spanning lines are bounded by
the event pass.
"""

from __future__ import annotations

import re

import yaml

__all__ = ["MAX_YAML_DEPTH", "YamlTooDeep", "check_nesting"]

# Deeper than any real config or scenario.
MAX_YAML_DEPTH = 100

# Longer tags and anchors are not looked past (their quotes count as text: more levels).
_PROPERTY_SCAN = 256
_TOKENS = re.compile(r"[\[\]{}\n'\"]")


class YamlTooDeep(ValueError):
    """The document nests collections deeper than ``MAX_YAML_DEPTH``."""

    def __init__(self, limit: int = MAX_YAML_DEPTH) -> None:
        super().__init__(f"the document is nested too deeply (more than {limit} levels)")


def check_nesting(text: str, loader: type = yaml.SafeLoader, limit: int = MAX_YAML_DEPTH) -> None:
    """Raise `YamlTooDeep` when ``text`` nests deeper than ``limit``; YAML syntax errors
    (``yaml.YAMLError``) are raised as the parser finds them."""
    if _flow_depth(text, limit) > limit:
        raise YamlTooDeep(limit)
    depth = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > limit:
                raise YamlTooDeep(limit)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _flow_depth(text: str, limit: int) -> int:
    """The most flow brackets any one line opens and leaves open (stops past ``limit``)."""
    depth = deepest = 0
    pos = 0
    while (match := _TOKENS.search(text, pos)) is not None:
        c = match.group()
        pos = match.end()
        if c == "\n":
            depth = 0
        elif c in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif c in "]}":
            depth = max(0, depth - 1)
        elif depth and _opens_scalar(text, match.start()):
            # Inside a flow collection a quote right after [ { , or a value's colon
            # starts a quoted scalar, whose brackets are text. Only this line's part is
            # skipped: a scalar going on is counted on the next line (more, never less).
            pos = _quoted_end(text, pos, c)
    return deepest


def _opens_scalar(text: str, index: int) -> bool:
    """Whether the quote at ``index`` (inside a flow collection) starts a quoted scalar:
    it follows ``[``, ``{`` or ``,``, or a colon that is a value indicator (followed by a
    space, or right after a quoted key as in JSON)."""
    mark = _previous_mark(text, index)
    if mark < 0:
        return False
    c = text[mark]
    if c in "[{,":
        return True
    return c == ":" and (mark + 1 < index or (mark > 0 and text[mark - 1] in "'\""))


def _previous_mark(text: str, index: int) -> int:
    """Where the indicator a scalar starting at ``index`` follows is: the character
    before it that is not a space or a tab, looking past tags and anchors (``!t``,
    ``&a``) of at most ``_PROPERTY_SCAN`` characters (-1 at the start of the text)."""
    i = index - 1
    while True:
        while i >= 0 and text[i] in " \t":
            i -= 1
        if i < 0:
            return -1
        j = i
        stop = max(-1, i - _PROPERTY_SCAN)
        while j > stop and text[j] not in " \t\n[{,":
            j -= 1
        if j < i and text[j + 1] in "!&" and (j < 0 or text[j] in " \t\n[{,"):
            i = j  # a tag or an anchor: what comes before it decides
            continue
        return i


def _quoted_end(text: str, pos: int, quote: str) -> int:
    """Where a quoted scalar opened just before ``pos`` ends on its line."""
    line_end = text.find("\n", pos)
    if line_end < 0:
        line_end = len(text)
    while pos < line_end:
        c = text[pos]
        if quote == '"' and c == "\\":
            pos += 2
        elif c == quote:
            if quote == "'" and text.startswith("''", pos):
                pos += 2  # a quote inside a single-quoted scalar
            else:
                return pos + 1
        else:
            pos += 1
    return min(pos, line_end)
