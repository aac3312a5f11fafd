"""The node's devices as ResourceSlice objects (behavior.md §6.4; protocols.md §4).

JSON-ready dicts: the pool is cut into slices of at most 128 devices (64 when list
attributes may appear), each owned by the Node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from dracpu import DRIVER_NAME, RESOURCE_API_VERSION
from dracpu.devices.model import (
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_LIST_ATTRS,
    DeviceInventory,
)

__all__ = ["build_slices", "pool_device_names", "slice_index_prefix"]


def slice_index_prefix(index: int, count: int) -> str:
    """Lowercase hex, zero-padded to max(5, digits of count-1) (behavior.md §6.4)."""
    width = max(5, len(f"{max(count - 1, 0):x}"))
    return f"{index:0{width}x}"


def _slice(
    *,
    index: int,
    count: int,
    node_name: str,
    node_uid: str,
    generation: int,
    devices: list[Any],
) -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {
            "generateName": f"{slice_index_prefix(index, count)}-{DRIVER_NAME}-{node_name}-",
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node_name,
                    "uid": node_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "driver": DRIVER_NAME,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        },
    }


def build_slices(
    inv: DeviceInventory,
    *,
    node_name: str,
    node_uid: str,
    generation: int = 1,
    expose_pcie_roots: bool,
) -> list[dict[str, Any]]:
    """The node's pool as ResourceSlice objects; no devices → no slices (§6.4).

    The chunk size follows the flag, not whether a root was found: a slice that may carry
    list attributes is held to the smaller limit either way.
    """
    if not inv.devices:
        return []
    per_slice = MAX_DEVICES_PER_SLICE_LIST_ATTRS if expose_pcie_roots else MAX_DEVICES_PER_SLICE
    # One encode for all devices: fresh plain dicts the caller may keep or mutate.
    encoded: list[Any] = msgspec.to_builtins(list(inv.devices))
    count = -(-len(encoded) // per_slice)
    return [
        _slice(
            index=index,
            count=count,
            node_name=node_name,
            node_uid=node_uid,
            generation=generation,
            devices=encoded[index * per_slice : (index + 1) * per_slice],
        )
        for index in range(count)
    ]


def pool_device_names(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every device name of a pool, in slice order (for tests and introspection)."""
    return [d["name"] for s in slices for d in s["spec"]["devices"]]
