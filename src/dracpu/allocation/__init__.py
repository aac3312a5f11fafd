"""Allocation: choosing CPUs for claims (allocator, options).

Other modules of this package (store, checkpoint) append their exports below.
"""

from __future__ import annotations

from dracpu.allocation.allocator import (
    AllocationError,
    take_by_topology_numa_distributed,
    take_cpus,
)
from dracpu.allocation.options import (
    DEFAULT_OPTIONS,
    AllocationOptions,
    AllocationOptionsError,
    decode_allocation_options,
    is_allocation_options,
    options_from_kv,
    parse_allocation_options,
)

__all__ = [
    "DEFAULT_OPTIONS",
    "AllocationError",
    "AllocationOptions",
    "AllocationOptionsError",
    "decode_allocation_options",
    "is_allocation_options",
    "options_from_kv",
    "parse_allocation_options",
    "take_by_topology_numa_distributed",
    "take_cpus",
]
