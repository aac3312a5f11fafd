"""The simulated node's kubelet: plugin registration over the real registration socket,
NodePrepareResources / NodeUnprepareResources over real gRPC (``grpcio``), and containers
started through a ``ContainerRuntime`` with the claims' CDI env applied."""

from __future__ import annotations

from dracpu_sim.kubelet.dra import ClaimRef, PreparedDevice
from dracpu_sim.kubelet.kubelet import RegisteredPlugin, RegistrationEvent, SimKubelet
from dracpu_sim.kubelet.pods import Backoff, ContainerState, PodState, PreparedClaim
from dracpu_sim.kubelet.registration import PluginRejected, validate_plugin
from dracpu_sim.kubelet.runtime import (
    ContainerRuntime,
    ContainerRuntimeError,
    MemoryRuntime,
    PodRuntimeAdapter,
)

__all__ = [
    "Backoff",
    "ClaimRef",
    "ContainerRuntime",
    "ContainerRuntimeError",
    "ContainerState",
    "MemoryRuntime",
    "PluginRejected",
    "PodRuntimeAdapter",
    "PodState",
    "PreparedClaim",
    "PreparedDevice",
    "RegisteredPlugin",
    "RegistrationEvent",
    "SimKubelet",
    "validate_plugin",
]
