"""Per-claim allocation options and their two input forms.

A claim chooses how its CPUs are picked with an opaque config entry of driver ``dra.cpu``
whose parameters are an ``AllocationOptions`` object (docs/allocation-options.md)::

    {"apiVersion": "dra.cpu/v1alpha1", "kind": "AllocationOptions",
     "fullPCPUsOnly": true, "distributeAcrossNUMA": false,
     "preferAlignByUncoreCache": true, "strategy": "packed", "sharedPoolAccess": false,
     "isolateIRQs": false}

``kind`` is what tells this object apart from the machine-mode cpuset override
(``{"apiVersion": "v1alpha1", "cpuConfig": {...}}``), which has none. The CLI spells the
same fields as repeated ``--option key=value`` pairs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

__all__ = [
    "API_VERSION",
    "DEFAULT_OPTIONS",
    "KIND",
    "AllocationOptions",
    "AllocationOptionsError",
    "Strategy",
    "decode_allocation_options",
    "is_allocation_options",
    "options_from_kv",
    "parse_allocation_options",
]

API_VERSION = "dra.cpu/v1alpha1"
KIND = "AllocationOptions"

Strategy = Literal["packed", "spread"]
_STRATEGIES: tuple[Strategy, ...] = ("packed", "spread")


class AllocationOptionsError(ValueError):
    """Allocation options that cannot be used; the message names the bad field or pair."""


class AllocationOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How ``take_cpus`` chooses CPUs. The defaults are what upstream's driver always uses."""

    strategy: Strategy = "packed"
    prefer_align_by_uncore_cache: bool = True
    full_pcpus_only: bool = False
    distribute_across_numa: bool = False
    # Not an allocation choice: the claim holder's cpuset is its exclusive CPUs plus the
    # shared pool (kept up to date), while DRA_CPUSET_<uid> names only the exclusive ones.
    shared_pool_access: bool = False
    # Not an allocation choice either: while the claim is prepared, device interrupts are
    # kept off its CPUs (dracpu.irq). Last, so the checkpoint codec can leave it out when
    # false and checkpoints of dracpu versions without it keep their checksum.
    isolate_irqs: bool = False

    def __post_init__(self) -> None:
        # kubelet rejects the same pair: spread hands out one thread per core on purpose.
        if self.full_pcpus_only and self.strategy == "spread":
            raise AllocationOptionsError(
                'fullPCPUsOnly cannot be combined with strategy "spread" '
                "(spread splits physical cores)"
            )


DEFAULT_OPTIONS = AllocationOptions()


class _Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The opaque-parameters shape, field names exactly as users write them."""

    api_version: str = msgspec.field(name="apiVersion")
    kind: str
    strategy: Strategy = "packed"
    prefer_align_by_uncore_cache: bool = msgspec.field(
        default=True, name="preferAlignByUncoreCache"
    )
    full_pcpus_only: bool = msgspec.field(default=False, name="fullPCPUsOnly")
    distribute_across_numa: bool = msgspec.field(default=False, name="distributeAcrossNUMA")
    shared_pool_access: bool = msgspec.field(default=False, name="sharedPoolAccess")
    isolate_irqs: bool = msgspec.field(default=False, name="isolateIRQs")


_JSON_DECODER = msgspec.json.Decoder(dict[str, object])


def is_allocation_options(params: Mapping[str, object]) -> bool:
    """True when opaque parameters claim to be an AllocationOptions object (by ``kind``)."""
    return params.get("kind") == KIND


def parse_allocation_options(params: Mapping[str, object]) -> AllocationOptions:
    """Validate decoded opaque parameters; errors carry msgspec's field path (``$.field``)."""
    try:
        wire = msgspec.convert(dict(params), _Wire)
    except msgspec.ValidationError as exc:
        raise AllocationOptionsError(f"invalid allocation options: {exc}") from None
    if wire.api_version != API_VERSION:
        raise AllocationOptionsError(
            f"invalid allocation options: unsupported apiVersion {wire.api_version!r} "
            f"(want {API_VERSION!r})"
        )
    if wire.kind != KIND:
        raise AllocationOptionsError(
            f"invalid allocation options: unsupported kind {wire.kind!r} (want {KIND!r})"
        )
    try:
        return AllocationOptions(
            strategy=wire.strategy,
            prefer_align_by_uncore_cache=wire.prefer_align_by_uncore_cache,
            full_pcpus_only=wire.full_pcpus_only,
            distribute_across_numa=wire.distribute_across_numa,
            shared_pool_access=wire.shared_pool_access,
            isolate_irqs=wire.isolate_irqs,
        )
    except AllocationOptionsError as exc:
        raise AllocationOptionsError(f"invalid allocation options: {exc}") from None


def decode_allocation_options(data: bytes | str) -> AllocationOptions:
    """Parse the raw JSON of ``opaque.parameters``."""
    try:
        params = _JSON_DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise AllocationOptionsError(f"invalid allocation options: {exc}") from None
    return parse_allocation_options(params)


# CLI key -> AllocationOptions attribute; strategy is the only non-boolean one.
_KV_FIELDS = {
    "fullPCPUsOnly": "full_pcpus_only",
    "distributeAcrossNUMA": "distribute_across_numa",
    "preferAlignByUncoreCache": "prefer_align_by_uncore_cache",
    "sharedPoolAccess": "shared_pool_access",
    "isolateIRQs": "isolate_irqs",
    "strategy": "strategy",
}
_BOOLS = {"true": True, "false": False}


def _kv_value(pair: str, key: str, raw: str) -> bool | str:
    if key == "strategy":
        if raw not in _STRATEGIES:
            raise AllocationOptionsError(f"invalid --option {pair!r}: expected packed or spread")
        return raw
    if raw not in _BOOLS:
        raise AllocationOptionsError(f"invalid --option {pair!r}: expected true or false")
    return _BOOLS[raw]


def options_from_kv(pairs: Iterable[str]) -> AllocationOptions:
    """Build options from ``key=value`` strings (the CLI's repeated ``--option``)."""
    values: dict[str, bool | str] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise AllocationOptionsError(f"invalid --option {pair!r}: expected key=value")
        if key not in _KV_FIELDS:
            known = ", ".join(_KV_FIELDS)
            raise AllocationOptionsError(
                f"invalid --option {pair!r}: unknown key {key!r} (known: {known})"
            )
        attr = _KV_FIELDS[key]
        if attr in values:
            raise AllocationOptionsError(f"invalid --option {pair!r}: {key} given twice")
        values[attr] = _kv_value(pair, key, raw)
    try:
        return msgspec.convert(values, AllocationOptions)
    except msgspec.ValidationError as exc:
        raise AllocationOptionsError(f"invalid --option set: {exc}") from None
