"""The simulated node's scheduler: kube-scheduler's DRA allocation (pure, ``allocator``),
its CEL environment (``cel``), the node's devices (``devices``) and the Trio shell that
allocates pending claims and binds pods (``shell``)."""

from __future__ import annotations

from dracpu_sim.scheduler.allocator import UnsatisfiableClaim, allocate, node_selector
from dracpu_sim.scheduler.cel import SelectorError, compile_selector
from dracpu_sim.scheduler.devices import AllocatedDevices, gather_devices
from dracpu_sim.scheduler.shell import ScheduleOutcome, Scheduler

__all__ = [
    "AllocatedDevices",
    "ScheduleOutcome",
    "Scheduler",
    "SelectorError",
    "UnsatisfiableClaim",
    "allocate",
    "compile_selector",
    "gather_devices",
    "node_selector",
]
