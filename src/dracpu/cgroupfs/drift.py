"""The drift watcher's decisions, without I/O: which containers drifted and which cgroups
belong to containers (whether a finding is still wanted when written is the writer's one
rule, ``intent_view.py``).

``DriftWatcher`` (``watcher.py``) reads the tree and the state owner and writes; everything
it decides in between is here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from dracpu.cpuset import CPUSet
from dracpu.messages import ContainerIntent

__all__ = [
    "DriftReport",
    "container_id_of",
    "find_drift",
    "is_container_dir",
]


class DriftReport(msgspec.Struct, frozen=True, kw_only=True):
    """The result of one check, as ``/debug/state`` shows it."""

    checked: int = 0
    drifted: int = 0
    repaired: int = 0
    errors: int = 0
    unknown_found: int = 0
    unknown_confined: int = 0
    missing: int = 0
    error_messages: tuple[str, ...] = ()


def find_drift(
    intended: Sequence[ContainerIntent], effective: Mapping[str, CPUSet]
) -> list[ContainerIntent]:
    """Pure: the intents whose container's effective set (by container id) differs.

    A container absent from ``effective`` (its cgroup is gone) is not drift.
    """
    drifted = []
    for intent in intended:
        current = effective.get(intent.container_id)
        if current is not None and current != CPUSet.parse(intent.cpus):
            drifted.append(intent)
    return drifted


def is_container_dir(parent_name: str, name: str) -> bool:
    """Pure: does a leaf cgroup look like a container's (not a QoS or pod level)?

    systemd driver: containers are ``.scope`` units (pods are ``.slice``); cgroupfs driver:
    containers sit directly below a ``pod<uid>`` directory.
    """
    if name.endswith(".scope"):
        return True
    return parent_name.startswith("pod") and not name.endswith(".slice")


def container_id_of(leaf_name: str) -> str:
    """Pure: the runtime's container id in a leaf cgroup's name.

    cgroupfs driver: the name is the id; systemd driver: ``<prefix>-<id>.scope`` (ids are
    hex, so the id is what follows the last dash).
    """
    if leaf_name.endswith(".scope"):
        return leaf_name.removesuffix(".scope").rsplit("-", 1)[-1]
    return leaf_name
