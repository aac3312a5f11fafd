"""Typed messages that travel between the daemon's services on Trio memory channels.

Each service owns its state; what crosses a service boundary is one of these frozen
msgspec Structs. Cpusets travel as Linux list strings so a message is plain data that can
be logged, encoded and compared without importing the allocator.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "ContainerIntent",
    "CpusetUpdateFailed",
    "FallbackResult",
    "SharedPoolChanged",
]


class ContainerIntent(msgspec.Struct, frozen=True, kw_only=True):
    """The cpuset dracpu intends a container to run on.

    ``cgroups_path`` is the runtime's ``linux.cgroups_path`` as NRI reports it (systemd
    ``slice:prefix:name`` or a cgroupfs path); ``mems`` is empty unless memory alignment
    is on.
    """

    container_id: str
    cgroups_path: str
    cpus: str
    mems: str = ""
    pod_uid: str = ""
    name: str = ""


class CpusetUpdateFailed(msgspec.Struct, frozen=True, kw_only=True):
    """The runtime could not apply an update: the cgroupfs writer applies it instead.

    ``reason`` says why (the UpdateContainers error, ``listed as failed by the runtime``,
    ``timed out``, ``NRI session down``).
    """

    intent: ContainerIntent
    reason: str


class FallbackResult(msgspec.Struct, frozen=True, kw_only=True):
    """What the cgroupfs writer did with one ``CpusetUpdateFailed``."""

    container_id: str
    cpus: str
    ok: bool
    error: str = ""


class SharedPoolChanged(msgspec.Struct, frozen=True, kw_only=True):
    """The shared pool is now ``cpus``: shared containers should follow it."""

    cpus: str
