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

# -- claim state and preparation (store, checkpoint, prepare, opaque, quantity) --------------
from dracpu.allocation.checkpoint import (
    CHECKPOINT_VERSION,
    Checkpoint,
    CheckpointCorrupt,
    CheckpointError,
    CheckpointVersionError,
    decode_checkpoint,
    encode_checkpoint,
    is_driver_restart,
)
from dracpu.allocation.opaque import DeviceConfig, OpaqueConfigError
from dracpu.allocation.prepare import (
    AllocationResult,
    ClaimAllocation,
    ClaimPlan,
    PrepareError,
    plan_claim,
)
from dracpu.allocation.quantity import QuantityError, parse_quantity
from dracpu.allocation.store import (
    AllocationStore,
    ClaimRecord,
    ClaimTracker,
    ContainerRecord,
    ContainerState,
    Owner,
    OwnerError,
    PreparedDevice,
    StateError,
    StoreError,
    StoreSnapshot,
)

__all__ += [
    "CHECKPOINT_VERSION",
    "AllocationResult",
    "AllocationStore",
    "Checkpoint",
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointVersionError",
    "ClaimAllocation",
    "ClaimPlan",
    "ClaimRecord",
    "ClaimTracker",
    "ContainerRecord",
    "ContainerState",
    "DeviceConfig",
    "OpaqueConfigError",
    "Owner",
    "OwnerError",
    "PrepareError",
    "PreparedDevice",
    "QuantityError",
    "StateError",
    "StoreError",
    "StoreSnapshot",
    "decode_checkpoint",
    "encode_checkpoint",
    "is_driver_restart",
    "parse_quantity",
    "plan_claim",
]
