"""Opaque device configs of a claim: the machine-mode cpuset override and allocation options.

Two kinds of ``opaque.parameters`` objects for driver ``dra.cpu`` can sit side by side in a
claim's allocation:

- the **cpuset override** of upstream's opaque API (behavior.md §8.3), used only in
  ``groupBy: machine``: ``{"apiVersion": "v1alpha1", "cpuConfig": {"cpuset": "4-7"}}``.
  It has no ``kind``. Keys match case-insensitively and unknown fields are ignored, as Go's
  ``encoding/json`` does;
- **allocation options** (options.py, docs/allocation-options.md), used only in
  ``groupBy: numanode`` / ``socket``: an object whose ``kind`` is ``AllocationOptions``.

The ``kind`` decides: a config whose parameters carry ``"kind": "AllocationOptions"`` is an
options config, every other config of this driver (malformed or empty ones included) is a
cpuset override candidate. So options configs never count towards the override's "exactly
one config" rule and are never parsed as an override, and an override is never parsed as
options. Options may come from a DeviceClass (an administrator's preset); the override may
not, as upstream requires.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import msgspec

from dracpu import DRIVER_NAME
from dracpu.allocation.options import (
    AllocationOptions,
    AllocationOptionsError,
    is_allocation_options,
    parse_allocation_options,
)
from dracpu.cpuset import CPUSet, CPUSetParseError, parse_cpuset
from dracpu.gofmt import go_quote

__all__ = [
    "FROM_CLAIM",
    "FROM_CLASS",
    "OVERRIDE_API_VERSION",
    "DeviceConfig",
    "OpaqueConfigError",
    "applies_to",
    "check_override",
    "is_options_config",
    "parse_cpuset_override",
    "select_allocation_options",
    "select_cpuset_override",
]

FROM_CLAIM = "FromClaim"
FROM_CLASS = "FromClass"
OVERRIDE_API_VERSION = "v1alpha1"


class OpaqueConfigError(ValueError):
    """An opaque config problem; the message is the claim's error, as upstream words it."""


class DeviceConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One ``status.allocation.devices.config[]`` entry.

    ``driver`` is ``opaque.driver``; None means the entry has no opaque section.
    ``parameters`` is the raw JSON of ``opaque.parameters`` (``b""`` when absent).
    """

    source: str
    requests: tuple[str, ...] = ()
    driver: str | None = None
    parameters: bytes = b""


def applies_to(config: DeviceConfig, request: str) -> bool:
    """§8.3 step 1: an opaque config for all requests, this request, or its main request."""
    if config.driver is None:
        return False
    if not config.requests:
        return True
    return request in config.requests or request.partition("/")[0] in config.requests


def _decode_dict(parameters: bytes) -> dict[str, object] | None:
    try:
        value = json.loads(parameters)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def is_options_config(config: DeviceConfig) -> bool:
    params = _decode_dict(config.parameters) if config.parameters else None
    return params is not None and is_allocation_options(params)


def _ours(configs: Iterable[DeviceConfig], request: str) -> list[DeviceConfig]:
    return [c for c in configs if applies_to(c, request) and c.driver == DRIVER_NAME]


# -- cpuset override (machine mode) ---------------------------------------------------------


def select_cpuset_override(configs: Sequence[DeviceConfig], request: str) -> DeviceConfig:
    """§8.3 steps 1-3: the one claim config that sets this result's cpuset."""
    candidates = [c for c in _ours(configs, request) if not is_options_config(c)]
    if any(c.source != FROM_CLAIM for c in candidates):
        raise OpaqueConfigError(
            "opaque config: configuration from DeviceClass is not supported by this driver, "
            "custom cpusets must be defined per ResourceClaim request"
        )
    if len(candidates) != 1:
        raise OpaqueConfigError(
            f"opaque config: request {go_quote(request)} is targeted by {len(candidates)} "
            "configurations, must be targeted by exactly 1"
        )
    return candidates[0]


class _Object(list[tuple[str, object]]):
    """A JSON object as its key/value pairs in document order (duplicates kept)."""


def _reject_constant(name: str) -> object:
    raise ValueError(f"invalid JSON value {name}")


def _go_fold(key: str) -> str:
    # Go matches struct fields with bytes.EqualFold-style simple folding; besides ASCII,
    # only U+017F (long s) and U+212A (Kelvin sign) fold onto the ASCII letters our keys use.
    return "".join(
        "s" if ch == "\u017f" else "k" if ch == "\u212a" else ch.lower() if ch.isascii() else ch
        for ch in key
    )


def _field(obj: _Object, name: str) -> object:
    """The value Go's decoder keeps for field ``name``: the last key that folds onto it."""
    value: object = None
    folded = name.lower()
    for key, item in obj:
        if _go_fold(key) == folded:
            value = item
    return value


def _string(obj: _Object, name: str, where: str) -> str:
    value = _field(obj, name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise OpaqueConfigError(
            f"failed to unmarshal opaque config: cannot unmarshal {_json_kind(value)} "
            f"into field {where} of type string"
        )
    return value


def _json_kind(value: object) -> str:
    if isinstance(value, _Object):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return "string"


def _load_object(parameters: bytes) -> _Object | None:
    try:
        value = json.loads(
            parameters.decode("utf-8", errors="replace"),
            object_pairs_hook=_Object,
            parse_constant=_reject_constant,
        )
    except RecursionError:
        raise OpaqueConfigError("failed to unmarshal opaque config: exceeded max depth") from None
    except ValueError as exc:
        raise OpaqueConfigError(f"failed to unmarshal opaque config: {exc}") from None
    if value is None or isinstance(value, _Object):
        return value  # null decodes to the zero value, as in Go
    raise OpaqueConfigError(
        f"failed to unmarshal opaque config: cannot unmarshal {_json_kind(value)} "
        "into a value of type object"
    )


def parse_cpuset_override(config: DeviceConfig, request: str) -> CPUSet:
    """§8.3 steps 4-5: the cpuset an override config names."""
    if not config.parameters:
        raise OpaqueConfigError(
            f"no opaque cpuset configuration found for allocation request {go_quote(request)}"
        )
    obj = _load_object(config.parameters) or _Object()
    api_version = _string(obj, "apiVersion", "apiVersion")
    cpu_config = _field(obj, "cpuConfig")
    if cpu_config is not None and not isinstance(cpu_config, _Object):
        raise OpaqueConfigError(
            f"failed to unmarshal opaque config: cannot unmarshal {_json_kind(cpu_config)} "
            "into field cpuConfig of type object"
        )
    text = _string(cpu_config or _Object(), "cpuset", "cpuConfig.cpuset")
    if api_version != OVERRIDE_API_VERSION:
        raise OpaqueConfigError(f"unsupported opaque config apiVersion: {go_quote(api_version)}")
    if not text:
        raise OpaqueConfigError("opaque config: cpuConfig.cpuset is empty or missing")
    try:
        return parse_cpuset(text)
    except CPUSetParseError as exc:
        raise OpaqueConfigError(
            f"opaque config: failed to parse cpuset {go_quote(text)}: {exc}"
        ) from None


def check_override(
    cpus: CPUSet,
    *,
    count: int,
    online: CPUSet,
    reserved: CPUSet,
    assigned: CPUSet,
    prepared: CPUSet,
) -> None:
    """§8.3 step 6, in upstream's order."""
    if len(cpus) != count:
        raise OpaqueConfigError(
            f"opaque config cpuset size {len(cpus)} does not match requested capacity {count}"
        )
    if not cpus <= online:
        raise OpaqueConfigError(
            f"requested CPUs {cpus} from opaque config contain offline cores: {cpus - online}"
        )
    if not cpus.isdisjoint(reserved):
        raise OpaqueConfigError(
            f"requested CPUs {cpus} from opaque config contain reserved cores: {cpus & reserved}"
        )
    if not cpus.isdisjoint(assigned):
        raise OpaqueConfigError(
            f"requested CPUs {cpus} from opaque config are already assigned to another device "
            "in this claim"
        )
    if not cpus.isdisjoint(prepared):
        raise OpaqueConfigError(
            f"requested CPUs {cpus} from opaque config conflict with already allocated claims"
        )


# -- allocation options (numanode / socket mode) --------------------------------------------


def select_allocation_options(
    configs: Sequence[DeviceConfig], request: str
) -> AllocationOptions | None:
    """The options that apply to a result, None when no options config targets it.

    Class configs come before claim configs, list order within each; the last one wins
    (protocols.md §4.2). Every applicable one is validated, so a broken preset is reported
    even when a claim config overrides it.
    """
    ours = [c for c in _ours(configs, request) if is_options_config(c)]
    ordered = [c for c in ours if c.source == FROM_CLASS] + [
        c for c in ours if c.source != FROM_CLASS
    ]
    chosen: AllocationOptions | None = None
    for config in ordered:
        try:
            chosen = parse_allocation_options(_decode_dict(config.parameters) or {})
        except AllocationOptionsError as exc:
            raise OpaqueConfigError(str(exc)) from None
    return chosen
