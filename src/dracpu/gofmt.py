"""Go's `%q` (strconv.Quote), shared by every module whose messages match the Go driver."""

from __future__ import annotations

__all__ = ["go_quote"]

_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def go_quote(text: str) -> str:
    """``text`` as Go's ``strconv.Quote`` writes it, so messages match upstream byte for byte."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif 0xDC80 <= code <= 0xDCFF:
            # A byte that was not valid UTF-8 (surrogateescape): Go shows the raw byte.
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            # Any other lone surrogate is not a valid rune; Go prints the replacement character.
            out.append("\\ufffd")
        elif ch.isprintable():
            out.append(ch)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)
