"""Kubernetes resource quantities, as much as claim preparation needs (behavior.md §8.4).

A quantity is ``<sign?><number><suffix>``: the number is ``12``, ``1.5``, ``1.`` or ``.5``;
the suffix is a decimal SI prefix (``n u m k M G T P E`` or none), a binary one
(``Ki Mi Gi Ti Pi Ei``) or a decimal exponent (``e3``, ``E-2``). Values are exact
fractions, so ``1500m`` is 3/2 and never rounds to 2 by accident.

The API server stores quantities in canonical form, so this parser follows the documented
grammar strictly instead of reproducing every leniency of apimachinery's (which reads a
lone ``.`` or ``-`` as zero).
"""

from __future__ import annotations

import re
from fractions import Fraction

from dracpu.gofmt import go_quote

__all__ = ["FORMAT_WRONG", "OUT_OF_RANGE", "QuantityError", "is_whole", "parse_quantity"]


class QuantityError(ValueError):
    """Not a Kubernetes quantity; the message quotes the text and gives apimachinery's reason."""

    def __init__(self, text: str, reason: str) -> None:
        self.text = text
        self.reason = reason
        super().__init__(f"invalid quantity {go_quote(text)}: {reason}")


# apimachinery's own wording for the two ways a quantity string can be wrong.
FORMAT_WRONG = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
OUT_OF_RANGE = "quantity is too large or too precise for a CPU count"


_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?))"
)

_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}

# Far beyond any CPU count; keeps "1e999999999" from building an enormous integer.
_MAX_EXPONENT = 64
_MAX_DIGITS = 64
# Plain digit strings this short (most capacities: "4") skip the regular expression.
_PLAIN_DIGITS = 18


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity string; QuantityError when it is not one."""
    if text.isascii() and text.isdigit() and len(text) <= _PLAIN_DIGITS:
        return Fraction(int(text))  # the usual "4": nothing to scale
    # fullmatch on ASCII only: str.isdigit-like classes would accept other scripts' digits.
    match = _QUANTITY.fullmatch(text) if text.isascii() else None
    if match is None:
        raise QuantityError(text, FORMAT_WRONG)
    digits = match["int"]
    frac = match["frac"] or ""
    if not digits and not frac:
        raise QuantityError(text, FORMAT_WRONG)
    if len(digits) + len(frac) > _MAX_DIGITS:
        raise QuantityError(text, OUT_OF_RANGE)
    value = Fraction(int(digits + frac or "0"), 10 ** len(frac))
    if match["exp"] is not None:
        exponent = int(match["exp"][1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(text, OUT_OF_RANGE)
        value *= Fraction(10) ** exponent
    elif match["suffix"] in _BINARY_SI:
        value *= 2 ** _BINARY_SI[match["suffix"]]
    else:
        value *= Fraction(10) ** _DECIMAL_SI[match["suffix"]]
    return -value if match["sign"] == "-" else value


def is_whole(value: Fraction) -> bool:
    """True when the quantity equals its rounded-up integer value (``2000m`` yes, ``1500m`` no)."""
    return value.denominator == 1
