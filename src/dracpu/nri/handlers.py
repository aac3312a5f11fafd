"""The Plugin service's requests as pure steps: request bytes in, reply bytes out.

`PluginHandlers` decodes each runtime request, asks the pure `NRIPlugin` for the decision
and encodes the reply; it never awaits and touches no socket, so every request can be
tested (and fuzzed) without a runtime. One object serves one NRI session: it keeps the
chunks of a split Synchronize (protocols.md 6.7) until the last one arrives. The final
Synchronize step takes the driver's CDI claims as an argument: the session reads them off
the Trio thread first, when `NRIPlugin.needs_cdi_specs` says they matter.

Errors: `google.protobuf.message.DecodeError` for undecodable bytes and `NRIPluginError`
for a refused event; the session turns them into ttrpc statuses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf.message import Message

from dracpu.bounded import remember
from dracpu.cpuset import CPUSet
from dracpu.messages import ContainerIntent
from dracpu.nri.plugin import NRIPlugin
from dracpu.proto.nri import api_pb2

__all__ = ["EVENT_MASK", "NRI_API_VERSION", "PendingSync", "PluginHandlers", "fill_updates"]

log = logging.getLogger(__name__)


def _mask(*events: int) -> int:
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


EVENT_MASK: Final = _mask(
    api_pb2.RUN_POD_SANDBOX,
    api_pb2.STOP_POD_SANDBOX,
    api_pb2.REMOVE_POD_SANDBOX,
    api_pb2.CREATE_CONTAINER,
    api_pb2.STOP_CONTAINER,
    api_pb2.REMOVE_CONTAINER,
)
"""The events dracpu handles (0x060f): the pod sandboxes' (their cgroups are kept on the
shared pool) and the containers'. Synchronize needs no bit; never 0 (= all, 6.5)."""

# The NRI API level announced in RegisterPluginRequest.nri_version. The official stub
# sends the containerd/nri Go module version it was built with (pkg/version
# GetFromBuildInfo, e.g. "v0.12.2"; containerd/nri#271), and the runtime only logs it:
# `registered as "00-dra.cpu" (with NRI version unknown)` when the field is empty
# (pkg/adaptation/plugin.go RegisterPlugin). Ours names the newest containerd/nri release
# whose messages proto/nri/api.proto declares (Container.image, NRI >= v0.12.2); raise it
# together with that file.
NRI_API_VERSION: Final = "v0.12.2"

_MORE: Final = api_pb2.SynchronizeResponse(more=True).SerializeToString()


def _serialize(message: Message) -> bytes:
    return bytes(message.SerializeToString())


def fill_updates(target: Any, updates: Sequence[ContainerIntent]) -> None:
    """Append `updates` to a repeated ContainerUpdate field (in place: much faster than
    building each nested message with keyword arguments, which counts at 1,000 updates)."""
    for update in updates:
        message = target.add()
        message.container_id = update.container_id
        cpu = message.linux.resources.cpu
        cpu.cpus = update.cpus
        if update.mems:
            cpu.mems = update.mems
        if update.ignore_failure:
            message.ignore_failure = True


def _adjustment(cpus: str, mems: str, updates: Sequence[ContainerIntent]) -> bytes:
    """A CreateContainerResponse: the new container's cpuset, other containers' updates."""
    response = api_pb2.CreateContainerResponse()
    cpu = response.adjust.linux.resources.cpu
    cpu.cpus = cpus
    cpu.mems = mems
    fill_updates(response.update, updates)
    return _serialize(response)


_REPLY_CACHE_LIMIT: Final = 256


@dataclass(frozen=True, slots=True)
class PendingSync:
    """Every chunk of one Synchronize, ready for the decision."""

    pods: list[api_pb2.PodSandbox]
    containers: list[api_pb2.Container]


class PluginHandlers:
    """Bytes -> decision -> bytes for one NRI session (see the module docstring)."""

    def __init__(self, plugin: NRIPlugin) -> None:
        self.plugin = plugin
        self.runtime_name = ""
        self.runtime_version = ""
        self.runtime_nri_version = ""
        self.applied: list[ContainerIntent] = []
        """What the last request asks to verify: a CreateContainer reply's cpusets (the new
        claim holder's and other containers' updates), or pod sandboxes a RunPodSandbox or
        Synchronize reported, whose cgroups only dracpu writes. The session hands them to
        the verifier once the reply is sent."""
        self._pods: list[api_pb2.PodSandbox] = []
        self._containers: list[api_pb2.Container] = []
        self._replies: dict[tuple[str, str], bytes] = {}
        self._handlers: dict[str, Callable[[bytes], bytes]] = {
            "Configure": self._configure,
            "CreateContainer": self._create_container,
            "StopContainer": self._stop_container,
            "RemoveContainer": self._remove_container,
            "RunPodSandbox": self._run_pod_sandbox,
            "StopPodSandbox": self._stop_pod_sandbox,
            "RemovePodSandbox": self._remove_pod_sandbox,
            "StateChange": self._state_change,
            "Shutdown": self._shutdown,
        }

    def handles(self, method: str) -> bool:
        return method == "Synchronize" or method in self._handlers

    def handle(self, method: str, payload: bytes) -> bytes:
        """Every request but Synchronize (see `sync_chunk` and `finish_sync`)."""
        return self._handlers[method](payload)

    # -- Synchronize ------------------------------------------------------------------------
    def sync_chunk(self, payload: bytes) -> PendingSync | None:
        """Keep one chunk; None while the runtime says more follow (reply `MORE`)."""
        request = api_pb2.SynchronizeRequest.FromString(payload)
        self._pods.extend(request.pods)
        self._containers.extend(request.containers)
        if request.more:
            return None
        pending = PendingSync(self._pods, self._containers)
        self._pods, self._containers = [], []
        return pending

    MORE: Final = _MORE
    """The reply to a chunk with `more` set: echo it, no updates (6.7)."""

    def finish_sync(self, pending: PendingSync, cdi_claims: Mapping[str, CPUSet]) -> bytes:
        updates = self.plugin.synchronize(pending.pods, pending.containers, cdi_claims)
        log.info(
            "synchronized with %d pods and %d containers: %d updates",
            len(pending.pods),
            len(pending.containers),
            len(updates),
        )
        response = api_pb2.SynchronizeResponse()
        fill_updates(response.update, updates)
        # Read back what the reply asks for (a runtime may drop it) and the sandboxes.
        self.applied = [*updates, *self.plugin.sandbox_intents()]
        return _serialize(response)

    # -- the other requests -----------------------------------------------------------------
    def _configure(self, payload: bytes) -> bytes:
        request = api_pb2.ConfigureRequest.FromString(payload)
        self.runtime_name = request.runtime_name
        self.runtime_version = request.runtime_version
        self.runtime_nri_version = request.nri_version  # field 6, sent since NRI v0.12
        log.info(
            "configured by runtime %s %s (request timeout %d ms)",
            request.runtime_name,
            request.runtime_version,
            request.request_timeout,
        )
        if request.nri_version:
            log.info(
                "the runtime speaks NRI %s; dracpu announces %s",
                request.nri_version,
                NRI_API_VERSION,
            )
        else:
            log.info("the runtime did not announce its NRI version (NRI before v0.12)")
        return _serialize(api_pb2.ConfigureResponse(events=EVENT_MASK))

    def _create_container(self, payload: bytes) -> bytes:
        request = api_pb2.CreateContainerRequest.FromString(payload)
        container = request.container
        decision = self.plugin.create_container(request.pod, container)
        cpus = decision.cpus.format()
        self.applied = list(decision.updates)
        if decision.claim_uids and container.linux.cgroups_path:
            self.applied.append(
                ContainerIntent(
                    container_id=container.id,
                    cgroups_path=container.linux.cgroups_path,
                    cpus=cpus,
                    mems=decision.mems,
                    pod_uid=request.pod.uid,
                    name=container.name,
                )
            )
        if decision.updates:
            return _adjustment(cpus, decision.mems, decision.updates)
        # Most replies are one of a few adjustments (the pool, a claim's CPUs): keep their
        # bytes rather than build the nested messages on every container start.
        key = (cpus, decision.mems)
        reply = self._replies.get(key)
        if reply is None:
            reply = _adjustment(cpus, decision.mems, ())
            remember(self._replies, key, reply, _REPLY_CACHE_LIMIT)
        return reply

    def _stop_container(self, payload: bytes) -> bytes:
        request = api_pb2.StopContainerRequest.FromString(payload)
        self.plugin.stop_container(request.pod, request.container)
        return b""  # StopContainerResponse with no updates (§13.4)

    def _remove_container(self, payload: bytes) -> bytes:
        request = api_pb2.RemoveContainerRequest.FromString(payload)
        self.plugin.remove_container(request.pod, request.container)
        return b""

    def _sandbox_started(self, pod: api_pb2.PodSandbox) -> bytes:
        intent = self.plugin.run_pod_sandbox(pod)
        self.applied = [intent] if intent is not None else []
        return b""  # RunPodSandboxResponse and Empty both encode as no bytes

    def _run_pod_sandbox(self, payload: bytes) -> bytes:
        return self._sandbox_started(api_pb2.RunPodSandboxRequest.FromString(payload).pod)

    def _stop_pod_sandbox(self, payload: bytes) -> bytes:
        self.plugin.forget_pod_sandbox(api_pb2.StopPodSandboxRequest.FromString(payload).pod)
        return b""

    def _remove_pod_sandbox(self, payload: bytes) -> bytes:
        self.plugin.forget_pod_sandbox(api_pb2.RemovePodSandboxRequest.FromString(payload).pod)
        return b""

    def _state_change(self, payload: bytes) -> bytes:
        # Older NRI runtimes deliver RemoveContainer and the pod sandbox events only
        # through StateChange, and newer ones fall back to it for a plugin that answers
        # their RunPodSandbox, StopPodSandbox or RemovePodSandbox as unimplemented
        # (containerd/nri pkg/adaptation/plugin.go).
        event = api_pb2.StateChangeEvent.FromString(payload)
        if event.event == api_pb2.REMOVE_CONTAINER:
            self.plugin.remove_container(event.pod, event.container)
        elif event.event == api_pb2.RUN_POD_SANDBOX:
            return self._sandbox_started(event.pod)
        elif event.event in (api_pb2.STOP_POD_SANDBOX, api_pb2.REMOVE_POD_SANDBOX):
            self.plugin.forget_pod_sandbox(event.pod)
        return b""

    def _shutdown(self, payload: bytes) -> bytes:
        log.info("runtime shutting down")
        return b""
