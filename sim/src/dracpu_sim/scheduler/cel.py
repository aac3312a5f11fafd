"""CEL device selectors as kube-scheduler's DRA allocator evaluates them, on ``celpy``.

The environment exposes one variable, ``device``, with ``driver``, ``attributes`` and
``capacity``. Attribute and capacity names are published as ``domain/name``; unqualified
names belong to the device's driver, so ``numaNode`` published by ``dra.cpu`` is
``device.attributes["dra.cpu"].numaNode``. Looking up a domain the device has nothing in
yields an empty map; an unknown name inside a domain is a runtime error, exactly as the
Kubernetes documentation says.

Capacities are quantities: the Kubernetes library functions work on them
(``quantity("4")``, ``compareTo``, ``isGreaterThan``, ``isLessThan``, ``asInteger``,
``asApproximateFloat``, ``sign``, ``add``, ``sub``, ``isInteger``). As a convenience of the
simulator they also compare directly with CEL numbers (``device.capacity["dra.cpu"].cpu >=
4``), which the real API server would reject as a type error.

``version`` attributes are exposed as strings (Kubernetes has a semver type for them).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, base_functions

from dracpu.allocation.quantity import QuantityError, parse_quantity

__all__ = [
    "CELQuantity",
    "CompiledSelector",
    "SelectorError",
    "compile_selector",
    "device_value",
    "format_quantity",
    "qualify",
]


class SelectorError(Exception):
    """A selector that does not compile, fails at runtime, or is not boolean."""


def qualify(name: str, driver: str) -> tuple[str, str]:
    """(domain, identifier) of a published attribute or capacity name."""
    domain, sep, ident = name.rpartition("/")
    return (domain, ident) if sep else (driver, name)


def format_quantity(value: Fraction) -> str:
    """A canonical Kubernetes quantity string for an exact value (``4``, ``500m``)."""
    sign = "-" if value < 0 else ""
    value = abs(value)
    for suffix, scale in (("", 1), ("m", 10**3), ("u", 10**6), ("n", 10**9)):
        scaled = value * scale
        if scaled.denominator == 1:
            return f"{sign}{scaled.numerator}{suffix}"
    # Kubernetes rounds sub-nano precision up.
    return f"{sign}{-(-value.numerator * 10**9 // value.denominator)}n"


@functools.total_ordering
class CELQuantity:
    """A Kubernetes quantity inside CEL, exact (a Fraction)."""

    __slots__ = ("value",)

    def __init__(self, value: Fraction) -> None:
        self.value = value

    @staticmethod
    def _other(other: object) -> Fraction | None:
        if isinstance(other, CELQuantity):
            return other.value
        if isinstance(other, bool | celtypes.BoolType):
            return None
        if isinstance(other, int):
            return Fraction(other)
        if isinstance(other, float):
            return Fraction(other)
        return None

    def __eq__(self, other: object) -> bool:
        value = self._other(other)
        if value is None:
            return NotImplemented
        return self.value == value

    def __lt__(self, other: object) -> bool:
        value = self._other(other)
        if value is None:
            raise TypeError(f"no such overload: quantity < {type(other).__name__}")
        return self.value < value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"quantity({format_quantity(self.value)!r})"

    def __str__(self) -> str:
        return format_quantity(self.value)


def _quantity(text: object) -> CELQuantity:
    if not isinstance(text, str):
        raise TypeError(f"quantity() takes a string, got {type(text).__name__}")
    try:
        return CELQuantity(parse_quantity(str(text)))
    except QuantityError as exc:
        raise ValueError(str(exc)) from None


def _q(value: object) -> Fraction:
    if not isinstance(value, CELQuantity):
        raise TypeError(f"expected a quantity, got {type(value).__name__}")
    return value.value


def _compare(a: object, b: object) -> celtypes.IntType:
    x, y = _q(a), _q(b)
    return celtypes.IntType((x > y) - (x < y))


def _as_integer(a: object) -> celtypes.IntType:
    value = _q(a)
    if value.denominator != 1:
        raise ValueError(f"quantity {format_quantity(value)} is not an integer")
    return celtypes.IntType(value.numerator)


def _lift(name: str) -> Callable[[Any, Any], Any]:
    """A comparison operator that also accepts a number on the left of a quantity."""
    base = base_functions[name]

    def op(a: Any, b: Any) -> Any:
        if isinstance(b, CELQuantity) and not isinstance(a, CELQuantity):
            number = CELQuantity._other(a)
            if number is not None:
                a = CELQuantity(number)
        return base(a, b)

    return op


_FUNCTIONS: dict[str, Any] = {
    "quantity": _quantity,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: celtypes.BoolType(_q(a) > _q(b)),
    "isLessThan": lambda a, b: celtypes.BoolType(_q(a) < _q(b)),
    "isInteger": lambda a: celtypes.BoolType(_q(a).denominator == 1),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda a: celtypes.DoubleType(float(_q(a))),
    "sign": lambda a: celtypes.IntType((_q(a) > 0) - (_q(a) < 0)),
    "add": lambda a, b: CELQuantity(_q(a) + (_q(b) if isinstance(b, CELQuantity) else int(b))),
    "sub": lambda a, b: CELQuantity(_q(a) - (_q(b) if isinstance(b, CELQuantity) else int(b))),
} | {name: _lift(name) for name in ("_<_", "_<=_", "_>_", "_>=_", "_==_", "_!=_")}


class _Domains(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain is an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType({})


def _attribute_value(attr: Mapping[str, Any]) -> Any:
    if "int" in attr:
        return celtypes.IntType(int(attr["int"]))
    if "bool" in attr:
        return celtypes.BoolType(bool(attr["bool"]))
    if "string" in attr:
        return celtypes.StringType(str(attr["string"]))
    if "version" in attr:
        return celtypes.StringType(str(attr["version"]))
    if "ints" in attr:
        return celtypes.ListType([celtypes.IntType(int(v)) for v in attr["ints"]])
    if "bools" in attr:
        return celtypes.ListType([celtypes.BoolType(bool(v)) for v in attr["bools"]])
    for kind in ("strings", "versions"):
        if kind in attr:
            return celtypes.ListType([celtypes.StringType(str(v)) for v in attr[kind]])
    raise ValueError(f"attribute has no known value kind: {sorted(attr)}")


def device_value(driver: str, device: Mapping[str, Any]) -> celtypes.MapType:
    """The CEL ``device`` variable for one published device (ResourceSlice JSON)."""
    attributes: dict[str, dict[Any, Any]] = {}
    for name, attr in (device.get("attributes") or {}).items():
        domain, ident = qualify(name, driver)
        attributes.setdefault(domain, {})[celtypes.StringType(ident)] = _attribute_value(attr)
    capacity: dict[str, dict[Any, Any]] = {}
    for name, cap in (device.get("capacity") or {}).items():
        domain, ident = qualify(name, driver)
        capacity.setdefault(domain, {})[celtypes.StringType(ident)] = CELQuantity(
            parse_quantity(str(cap["value"]))
        )
    return celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(driver),
            celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                bool(device.get("allowMultipleAllocations", False))
            ),
            celtypes.StringType("attributes"): _Domains(
                {celtypes.StringType(d): celtypes.MapType(v) for d, v in attributes.items()}
            ),
            celtypes.StringType("capacity"): _Domains(
                {celtypes.StringType(d): celtypes.MapType(v) for d, v in capacity.items()}
            ),
        }
    )


def _short(exc: BaseException) -> str:
    """celpy's messages carry a dump of the whole activation; keep the first sentence."""
    text = str(exc.args[0]) if exc.args else str(exc)
    return text.split(" (in activation", 1)[0]


# Results remembered per selector: celpy interprets a tree per evaluation (about a
# millisecond), and every scheduling round sees the same published devices again.
_MEMO_SIZE = 16384


class CompiledSelector:
    """One compiled CEL expression; ``matches(device)`` is True, False or SelectorError."""

    def __init__(self, expression: str, program: celpy.Runner) -> None:
        self.expression = expression
        self._program = program
        self._memo: OrderedDict[str, bool | str] = OrderedDict()

    def matches_cached(self, key: str, device: Callable[[], celtypes.MapType]) -> bool:
        """``matches(device())``, remembered under ``key`` (which must identify the
        device's whole content)."""
        found = self._memo.get(key)
        if found is None:
            try:
                found = self.matches(device())
            except SelectorError as exc:
                found = str(exc)
            self._memo[key] = found
            if len(self._memo) > _MEMO_SIZE:
                self._memo.popitem(last=False)
        if isinstance(found, str):
            raise SelectorError(found)
        return found

    def matches(self, device: celtypes.MapType) -> bool:
        try:
            result = self._program.evaluate({"device": device})
        except CELEvalError as exc:
            raise SelectorError(f"CEL runtime error: {_short(exc)}") from None
        except (TypeError, ValueError, KeyError, ArithmeticError) as exc:
            raise SelectorError(f"CEL runtime error: {exc}") from None
        if not isinstance(result, celtypes.BoolType):
            raise SelectorError(
                f"CEL expression must evaluate to bool, got {type(result).__name__}"
            )
        return bool(result)


_ENV = celpy.Environment()


@functools.lru_cache(maxsize=512)
def compile_selector(expression: str) -> CompiledSelector:
    """Compile once per distinct expression (celpy parsing is slow)."""
    if not expression.strip():
        raise SelectorError("CEL compile error: empty expression")
    try:
        ast = _ENV.compile(expression)
    except CELParseError as exc:
        detail = " ".join(str(exc).split())
        raise SelectorError(f"CEL compile error: {detail}") from None
    return CompiledSelector(expression, _ENV.program(ast, functions=_FUNCTIONS))
