"""What the simulated kubelet needs from a container runtime, and an in-memory one.

``ContainerRuntime`` is the CRI subset the kubelet drives. ``PodRuntimeAdapter`` puts the
NRI runtime simulator (``dracpu_sim.runtime.RuntimeSimulator``: ``create_pod`` /
``remove_pod``) behind it, so containers go through real NRI hooks. ``MemoryRuntime`` only
records what it was asked to do, for tests and for a demo without NRI.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["ContainerRuntime", "ContainerRuntimeError", "MemoryRuntime", "PodRuntimeAdapter"]


class ContainerRuntimeError(Exception):
    """A runtime call failed; ``str()`` is what the kubelet records for the pod."""


class ContainerRuntime(Protocol):
    async def run_pod_sandbox(
        self, pod_uid: str, namespace: str, name: str, qos: str = "burstable"
    ) -> None:
        """Run the pod's sandbox in the cgroup of its QoS class."""
        ...

    async def create_container(self, pod_uid: str, name: str, env: list[str]) -> str:
        """Create and start a container; returns its id."""
        ...

    async def stop_container(self, container_id: str) -> None: ...

    async def remove_container(self, container_id: str) -> None: ...

    async def remove_pod_sandbox(self, pod_uid: str) -> None: ...


class PodRuntime(Protocol):
    """The runtime simulator's own names for the sandbox calls."""

    async def create_pod(
        self, pod_uid: str, name: str, namespace: str = "default", *, qos: str | None = None
    ) -> str: ...

    async def create_container(self, pod_uid: str, name: str, env: Sequence[str] = ()) -> str: ...

    async def stop_container(self, container_id: str) -> None: ...

    async def remove_container(self, container_id: str) -> None: ...

    async def remove_pod(self, pod_uid: str) -> None: ...


class PodRuntimeAdapter:
    """A ``ContainerRuntime`` over a ``PodRuntime`` (the NRI runtime simulator)."""

    def __init__(self, runtime: PodRuntime) -> None:
        self.runtime = runtime

    async def run_pod_sandbox(
        self, pod_uid: str, namespace: str, name: str, qos: str = "burstable"
    ) -> None:
        await self.runtime.create_pod(pod_uid, name, namespace, qos=qos)

    async def create_container(self, pod_uid: str, name: str, env: list[str]) -> str:
        return await self.runtime.create_container(pod_uid, name, env)

    async def stop_container(self, container_id: str) -> None:
        await self.runtime.stop_container(container_id)

    async def remove_container(self, container_id: str) -> None:
        await self.runtime.remove_container(container_id)

    async def remove_pod_sandbox(self, pod_uid: str) -> None:
        await self.runtime.remove_pod(pod_uid)


@dataclass
class MemoryContainer:
    id: str
    pod_uid: str
    name: str
    env: list[str]
    running: bool = True


@dataclass
class MemoryRuntime:
    """Keeps sandboxes and containers in dicts and logs every call in ``calls``."""

    sandboxes: dict[str, tuple[str, str]] = field(default_factory=dict)
    qos: dict[str, str] = field(default_factory=dict)  # pod uid -> QoS class of its sandbox
    containers: dict[str, MemoryContainer] = field(default_factory=dict)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def run_pod_sandbox(
        self, pod_uid: str, namespace: str, name: str, qos: str = "burstable"
    ) -> None:
        self.calls.append(("run_pod_sandbox", pod_uid, namespace, name))
        self.sandboxes[pod_uid] = (namespace, name)
        self.qos[pod_uid] = qos

    async def create_container(self, pod_uid: str, name: str, env: list[str]) -> str:
        self.calls.append(("create_container", pod_uid, name))
        if pod_uid not in self.sandboxes:
            raise ContainerRuntimeError(f"pod sandbox {pod_uid} does not exist")
        container_id = f"ctr-{next(self._ids):04d}"
        self.containers[container_id] = MemoryContainer(container_id, pod_uid, name, list(env))
        return container_id

    async def stop_container(self, container_id: str) -> None:
        self.calls.append(("stop_container", container_id))
        if container_id in self.containers:
            self.containers[container_id].running = False

    async def remove_container(self, container_id: str) -> None:
        self.calls.append(("remove_container", container_id))
        self.containers.pop(container_id, None)

    async def remove_pod_sandbox(self, pod_uid: str) -> None:
        self.calls.append(("remove_pod_sandbox", pod_uid))
        self.sandboxes.pop(pod_uid, None)
        for cid in [c.id for c in self.containers.values() if c.pod_uid == pod_uid]:
            del self.containers[cid]
