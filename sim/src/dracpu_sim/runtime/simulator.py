"""`RuntimeSimulator`: the runtime side of NRI (containerd's ``pkg/adaptation``) over the wire.

It listens on a unix socket, accepts a plugin, and speaks the real byte format (mux + ttrpc,
protocols.md 5-6): it serves ``Runtime`` (RegisterPlugin, UpdateContainers) on mux connection
2 and calls ``Plugin`` on connection 1 (Configure, Synchronize - paged with ``more`` when
asked or when one message would exceed 4 MiB - CreateContainer, StopContainer,
RemoveContainer). Like the real adaptation layer it

- closes a plugin that does not register within the registration timeout;
- enforces the request timeout on every plugin call: a plugin that does not answer in time is
  dropped and the operation goes on as if it had not answered (container created unadjusted);
- fails the operation when the plugin answers with an error status;
- holds one lock across every event and while applying unsolicited UpdateContainers, so a
  plugin that calls UpdateContainers from inside an event handler deadlocks until the
  request timeout drops it.

Pods and containers live in memory; their cpusets live in a `CgroupTree` (cgroup v1 or v2,
laid out for the cgroupfs or the systemd driver as the kubelet and containerd do:
``layout.py``). Each pod has a sandbox (the pause container) with its own id and cgroup,
created with the pod and reported to plugins as containerd does: in Synchronize's ``pods``
and, to a plugin that subscribed to them, as RunPodSandbox, StopPodSandbox and
RemovePodSandbox (``StateChange`` for a plugin without those methods, as the NRI adaptation
falls back). Fault knobs make UpdateContainers fail, go unanswered or report every update as
failed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket as stdlib_socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar

import trio
from google.protobuf.message import DecodeError, Message

from dracpu.nri.errors import ProtocolError
from dracpu.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN
from dracpu.nri.peer import PLUGIN_SERVICE, RUNTIME_SERVICE, CallFailed, MuxPeer, PeerClosed
from dracpu.nri.ttrpc import (
    MAX_DATA_LENGTH,
    RequestReceived,
    Status,
    StatusCode,
    unimplemented_method,
    unimplemented_service,
)
from dracpu.proto.nri import api_pb2
from dracpu_sim.runtime.cgroups import CgroupTree, CgroupTreeError
from dracpu_sim.runtime.layout import (
    check_cgroup_flavor,
    container_cgroups_path,
    pod_cgroup_parent,
)

__all__ = [
    "ContainerCreateError",
    "PodSandboxError",
    "RuntimeSimulator",
    "SimContainer",
    "SimPod",
]

log = logging.getLogger(__name__)

_VALID_EVENTS: Final = (1 << (api_pb2.LAST - 1)) - 1
_M = TypeVar("_M", bound=Message)


class ContainerCreateError(Exception):
    """The plugin failed the creation (kubelet would show CreateContainerError)."""


class PodSandboxError(Exception):
    """The plugin failed RunPodSandbox; containerd then fails the sandbox's creation."""


@dataclass
class SimPod:
    """A pod sandbox. ``id`` is the sandbox (pause) container's id, which NRI calls the pod's.

    ``cgroup_parent`` is the pod's cgroup as the kubelet names it (``layout.pod_cgroup_parent``),
    ``cgroups_path`` the sandbox container's own below it (containerd's ``getCgroupsPath``);
    containerd reports both in ``PodSandbox.linux`` (``internal/cri/nri/nri_api_linux.go``:
    ``GetCgroupParent`` from the sandbox config, ``GetCgroupsPath`` from its OCI spec).
    """

    id: str
    uid: str
    name: str
    namespace: str
    qos: str = "burstable"
    cgroup_parent: str = ""
    cgroups_path: str = ""
    ready: bool = True

    def proto(self) -> api_pb2.PodSandbox:
        return api_pb2.PodSandbox(
            id=self.id,
            uid=self.uid,
            name=self.name,
            namespace=self.namespace,
            linux=api_pb2.LinuxPodSandbox(
                cgroup_parent=self.cgroup_parent, cgroups_path=self.cgroups_path
            ),
        )


@dataclass
class SimContainer:
    id: str
    pod_uid: str
    pod_id: str
    name: str
    env: list[str]
    cgroups_path: str
    state: int = api_pb2.CONTAINER_CREATED
    cpus: str = ""
    mems: str = ""

    def proto(self) -> api_pb2.Container:
        return api_pb2.Container(
            id=self.id,
            pod_sandbox_id=self.pod_id,
            name=self.name,
            state=self.state,  # type: ignore[arg-type]
            env=self.env,
            linux=api_pb2.LinuxContainer(
                cgroups_path=self.cgroups_path,
                resources=api_pb2.LinuxResources(
                    cpu=api_pb2.LinuxCPU(cpus=self.cpus, mems=self.mems)
                ),
            ),
        )


@dataclass(eq=False)
class _Plugin:
    peer: MuxPeer
    stream: trio.SocketStream
    name: str = ""
    idx: str = ""
    nri_version: str = ""
    events: int = 0
    registered: trio.Event = field(default_factory=trio.Event)
    ready: trio.Event = field(default_factory=trio.Event)
    nursery: trio.Nursery | None = None

    def subscribed(self, event: int) -> bool:
        return bool(self.events & (1 << (event - 1)))


def _serialize(message: Message) -> bytes:
    return bytes(message.SerializeToString())


UPDATE_MODES = ("apply", "containerd-drop", "report", "cgroup-differs")


class RuntimeSimulator:
    """A container runtime with NRI, for tests and the demo. Constructing it does no I/O."""

    def __init__(
        self,
        socket_path: str,
        cgroup_root: str,
        *,
        request_timeout: float = 2.0,
        registration_timeout: float = 5.0,
        node_cpus: str = "0-7",
        node_mems: str = "0",
        sync_page_size: int | None = None,
        remove_via_state_change: bool = False,
        register_reply_after_sync: bool = False,
        runtime_name: str = "dracpu-sim",
        runtime_version: str = "0.1.0",
        cgroup_version: int = 1,
        cgroup_driver: str = "cgroupfs",
        default_qos: str = "burstable",
    ) -> None:
        check_cgroup_flavor(cgroup_version, cgroup_driver)
        pod_cgroup_parent(cgroup_driver, default_qos, "check")  # a bad class fails here
        self.default_qos = default_qos
        self.socket_path = socket_path
        self.cgroup_version = cgroup_version
        self.cgroup_driver = cgroup_driver
        self.tree = CgroupTree(cgroup_root, version=cgroup_version)
        self.request_timeout = request_timeout
        self.registration_timeout = registration_timeout
        self.node_cpus = node_cpus
        self.node_mems = node_mems
        self.sync_page_size = sync_page_size
        self.remove_via_state_change = remove_via_state_change
        self.register_reply_after_sync = register_reply_after_sync
        self.runtime_name = runtime_name
        self.runtime_version = runtime_version
        # The NRI release the simulated adaptation layer speaks (ConfigureRequest field 6).
        self.nri_version = "v0.12.2"
        self._pods: dict[str, SimPod] = {}
        self._containers: dict[str, SimContainer] = {}
        self._lock = trio.Lock()
        self._plugin: _Plugin | None = None
        self._connections: set[_Plugin] = set()
        self._plugin_changed = trio.Event()
        self._listener: trio.SocketListener | None = None
        self._listener_changed = trio.Event()
        self._fail_updates = 0
        self._drop_updates = 0
        self._mark_failed_updates = 0
        self.update_mode = "apply"
        self.update_delay = 0.0
        """Seconds each container's update takes to apply (0: all at once)."""
        self._update_mode_calls: int | None = None
        self.accepted: list[float] = []
        """`trio.current_time()` of every accepted plugin connection."""
        self.sync_chunks: list[tuple[int, int, bool]] = []
        """(pods, containers, more) of every Synchronize chunk sent."""
        self.update_requests: list[list[str]] = []
        """Container ids of every UpdateContainers request received."""
        self.dropped_reasons: list[str] = []

    # -- views ----------------------------------------------------------------------------
    @property
    def containers(self) -> list[SimContainer]:
        return list(self._containers.values())

    def container(self, container_id: str) -> SimContainer:
        return self._containers[container_id]

    def cpuset_of(self, container_id: str) -> str:
        """The CPUs the kernel would let the container use (its cgroup's effective set)."""
        return self.tree.effective_cpus(self._containers[container_id].cgroups_path).format()

    def mems_of(self, container_id: str) -> str:
        return self.tree.effective_mems(self._containers[container_id].cgroups_path).format()

    @property
    def pods(self) -> list[SimPod]:
        return list(self._pods.values())

    def pod(self, pod_uid: str) -> SimPod:
        return self._pods[pod_uid]

    def sandbox_cpuset_of(self, pod_uid: str) -> str:
        """The CPUs the kernel would let the pod's sandbox (pause container) use."""
        return self.tree.effective_cpus(self._pods[pod_uid].cgroups_path).format()

    @property
    def plugin_nri_version(self) -> str:
        """The NRI version the connected plugin announced at RegisterPlugin ("" if none)."""
        return self._plugin.nri_version if self._plugin is not None else ""

    @property
    def plugin_ready(self) -> bool:
        return self._plugin is not None and self._plugin.ready.is_set()

    async def wait_plugin_ready(self) -> None:
        while not self.plugin_ready:
            await self._plugin_changed.wait()

    async def wait_plugin_gone(self) -> None:
        while self._plugin is not None:
            await self._plugin_changed.wait()

    def _set_plugin(self, plugin: _Plugin | None) -> None:
        self._plugin = plugin
        self._notify_plugin()

    def _notify_plugin(self) -> None:
        self._plugin_changed.set()
        self._plugin_changed = trio.Event()

    # -- fault knobs ------------------------------------------------------------------------
    def fail_updates(self, n: int) -> None:
        """Answer the next `n` UpdateContainers calls with an error status."""
        self._fail_updates = n

    def drop_updates(self, n: int) -> None:
        """Never answer the next `n` UpdateContainers calls."""
        self._drop_updates = n

    def set_update_mode(self, mode: str, calls: int | None = None) -> None:
        """How updates to existing containers (UpdateContainers, and the updates in a
        CreateContainer reply) are applied, for the next ``calls`` batches (None: until
        changed):

        - ``apply``: applied; those that cannot be are listed as failed;
        - ``containerd-drop``: as containerd's NRI adaptation when the update cannot be
          applied: nothing changes, and updates marked ``ignore_failure`` are left out of
          the failed list (the plugin hears success);
        - ``report``: nothing changes and every update is listed as failed (a runtime that
          reports each failure, as CRI-O does);
        - ``cgroup-differs``: the runtime records the update as applied and reports
          success, but the cgroup keeps the value it had.
        """
        if mode not in UPDATE_MODES:
            raise ValueError(f"unknown update mode {mode!r}: want one of {', '.join(UPDATE_MODES)}")
        self.update_mode = mode
        self._update_mode_calls = calls

    def _take_update_mode(self) -> str:
        mode = self.update_mode
        if self._update_mode_calls is not None:
            self._update_mode_calls -= 1
            if self._update_mode_calls <= 0:
                self.update_mode, self._update_mode_calls = "apply", None
        return mode

    def mark_failed_updates(self, n: int) -> None:
        """List every update of the next `n` UpdateContainers calls as failed."""
        self._mark_failed_updates = n

    # -- listening --------------------------------------------------------------------------
    async def _listen(self) -> trio.SocketListener:
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        # Bound with the stdlib socket: trio binds unix sockets in a worker thread, and a
        # MockClock would jump ahead while that thread runs.
        raw = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
        try:
            raw.bind(self.socket_path)
            raw.listen(16)
        except OSError:
            raw.close()
            raise
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(raw))
        await trio.lowlevel.checkpoint()
        self._listener = listener
        self._listener_changed.set()
        self._listener_changed = trio.Event()
        return listener

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.tree.ensure_root(self.node_cpus, self.node_mems)
        try:
            async with trio.open_nursery() as nursery:
                await self._listen()
                task_status.started()
                while True:
                    listener = self._listener
                    if listener is None:
                        await self._listener_changed.wait()
                        continue
                    try:
                        stream = await listener.accept()
                    except (trio.ClosedResourceError, OSError):
                        if self._listener is listener:
                            self._listener = None
                        continue
                    nursery.start_soon(self._serve_plugin, stream)
        finally:
            if self._listener is not None:
                with trio.CancelScope(shield=True):
                    await self._listener.aclose()
            if os.path.exists(self.socket_path):
                os.unlink(self.socket_path)

    async def drop_connection(self) -> None:
        """Close the plugin's connection (the plugin should reconnect)."""
        plugin = self._plugin
        if plugin is not None:
            await self._drop(plugin, "dropped on request")

    async def restart(self, downtime: float = 0.0) -> None:
        """A runtime restart: the plugin is disconnected, the socket is gone for `downtime`
        seconds and comes back; pods and containers survive (as containerd's do)."""
        listener = self._listener
        self._listener = None
        if listener is not None:
            await listener.aclose()
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        for plugin in list(self._connections):
            await self._drop(plugin, "runtime restarting")
        await trio.sleep(downtime)
        await self._listen()

    async def _drop(self, plugin: _Plugin, reason: str) -> None:
        log.warning("dropping plugin %s-%s: %s", plugin.idx, plugin.name, reason)
        self.dropped_reasons.append(reason)
        if self._plugin is plugin:
            self._set_plugin(None)
        await plugin.stream.aclose()
        if plugin.nursery is not None:
            plugin.nursery.cancel_scope.cancel()

    # -- one plugin connection -------------------------------------------------------------
    async def _serve_plugin(self, stream: trio.SocketStream) -> None:
        self.accepted.append(trio.current_time())
        holder: list[_Plugin] = []

        async def on_request(request: RequestReceived) -> None:
            await self._on_runtime_request(holder[0], request)

        peer = MuxPeer(
            stream,
            serve_conn=RUNTIME_SERVICE_CONN,
            call_conn=PLUGIN_SERVICE_CONN,
            on_request=on_request,
        )
        plugin = _Plugin(peer=peer, stream=stream)
        holder.append(plugin)
        self._connections.add(plugin)
        try:
            await self._run_connection(plugin)
        finally:
            self._connections.discard(plugin)

    async def _run_connection(self, plugin: _Plugin) -> None:
        peer = plugin.peer
        async with plugin.stream, trio.open_nursery() as nursery:
            plugin.nursery = nursery

            async def read() -> None:
                try:
                    reason = await peer.run()
                except ProtocolError as exc:
                    reason = f"protocol error: {exc}"
                log.info("plugin connection ended: %s", reason)
                if self._plugin is plugin:
                    self._set_plugin(None)
                nursery.cancel_scope.cancel()

            async def registration_deadline() -> None:
                with trio.move_on_after(self.registration_timeout):
                    await plugin.registered.wait()
                    return
                await self._drop(plugin, "plugin registration timed out")

            nursery.start_soon(read)
            nursery.start_soon(registration_deadline)

    async def _on_runtime_request(self, plugin: _Plugin, request: RequestReceived) -> None:
        if request.service != RUNTIME_SERVICE:
            await plugin.peer.respond(request.stream_id, unimplemented_service(request.service))
            return
        if request.method == "RegisterPlugin":
            reg = await self._decode(plugin, request, api_pb2.RegisterPluginRequest)
            if reg is None:
                return
            plugin.name, plugin.idx = reg.plugin_name, reg.plugin_idx
            plugin.nri_version = reg.nri_version
            # As containerd's adaptation logs it (pkg/adaptation/plugin.go RegisterPlugin).
            log.info(
                "plugin %s-%s registered (with NRI version %s)",
                reg.plugin_idx,
                reg.plugin_name,
                reg.nri_version or "unknown",
            )
            if plugin.registered.is_set():
                await plugin.peer.respond(request.stream_id, b"")
                return
            plugin.registered.set()
            late_reply: int | None = request.stream_id
            if not self.register_reply_after_sync:
                await plugin.peer.respond(request.stream_id, b"")
                late_reply = None
            assert plugin.nursery is not None
            plugin.nursery.start_soon(self._set_up, plugin, late_reply)
            return
        if request.method == "UpdateContainers":
            assert plugin.nursery is not None
            # Handled in its own task: it waits for the event lock, like pkg/adaptation.
            plugin.nursery.start_soon(self._update_containers, plugin, request)
            return
        await plugin.peer.respond(request.stream_id, unimplemented_method(request.method))

    async def _set_up(self, plugin: _Plugin, late_reply: int | None) -> None:
        """Configure, then Synchronize; only then is the plugin sent events. With
        `late_reply` the RegisterPlugin reply goes out only after all that, as a live
        runtime sometimes has it reach the plugin (protocols.md 6.4)."""
        try:
            await self._configure_and_sync(plugin)
        finally:
            if late_reply is not None:
                with contextlib.suppress(PeerClosed, trio.ClosedResourceError):
                    await plugin.peer.respond(late_reply, b"")

    async def _configure_and_sync(self, plugin: _Plugin) -> None:
        configure = api_pb2.ConfigureRequest(
            runtime_name=self.runtime_name,
            runtime_version=self.runtime_version,
            registration_timeout=int(self.registration_timeout * 1000),
            request_timeout=int(self.request_timeout * 1000),
            nri_version=self.nri_version,
        )
        async with self._lock:
            try:
                reply = await self._call(plugin, "Configure", configure, api_pb2.ConfigureResponse)
            except CallFailed as exc:
                await self._drop(plugin, f"Configure failed: {exc}")
                return
            if reply is None:
                return
            events = reply.events or _VALID_EVENTS
            if events & ~_VALID_EVENTS:
                await self._drop(plugin, f"invalid event mask 0x{reply.events:x}")
                return
            plugin.events = events
            if not await self._synchronize(plugin):
                return
            previous = self._plugin
            self._set_plugin(plugin)
            plugin.ready.set()
            self._notify_plugin()
        if previous is not None and previous is not plugin:
            await self._drop(previous, "replaced by a new connection")

    async def _call(
        self, plugin: _Plugin, method: str, request: Message, reply_type: type[_M]
    ) -> _M | None:
        """One plugin call under the request timeout. None when the plugin was dropped
        (timeout, closed socket, bad reply); raises `CallFailed` for an error status."""
        try:
            payload = await plugin.peer.call(
                PLUGIN_SERVICE, method, _serialize(request), timeout=self.request_timeout
            )
        except trio.TooSlowError:
            await self._drop(plugin, f"{method}: context deadline exceeded")
            return None
        except PeerClosed as exc:
            await self._drop(plugin, f"{method}: {exc}")
            return None
        try:
            reply: _M = reply_type.FromString(payload)
        except DecodeError as exc:
            await self._drop(plugin, f"{method}: undecodable reply: {exc}")
            return None
        return reply

    async def _synchronize(self, plugin: _Plugin) -> bool:
        pods = [p.proto() for p in self._pods.values()]
        containers = [c.proto() for c in self._containers.values()]
        chunks = self._sync_chunks(pods, containers)
        updates: list[api_pb2.ContainerUpdate] = []
        with trio.move_on_after(self.request_timeout) as scope:
            for i, (chunk_pods, chunk_containers) in enumerate(chunks):
                more = i < len(chunks) - 1
                self.sync_chunks.append((len(chunk_pods), len(chunk_containers), more))
                request = api_pb2.SynchronizeRequest(
                    pods=chunk_pods, containers=chunk_containers, more=more
                )
                try:
                    reply = await self._call(
                        plugin, "Synchronize", request, api_pb2.SynchronizeResponse
                    )
                except CallFailed as exc:
                    await self._drop(plugin, f"Synchronize failed: {exc}")
                    return False
                if reply is None:
                    return False
                if more and (not reply.more or reply.update):
                    await self._drop(plugin, "plugin does not handle split sync requests")
                    return False
                updates.extend(reply.update)
        if scope.cancelled_caught:
            await self._drop(plugin, "Synchronize: context deadline exceeded")
            return False
        self._apply_updates(updates)
        return True

    def _sync_chunks(
        self, pods: list[api_pb2.PodSandbox], containers: list[api_pb2.Container]
    ) -> list[tuple[list[api_pb2.PodSandbox], list[api_pb2.Container]]]:
        page = self.sync_page_size
        if page is None:
            size = api_pb2.SynchronizeRequest(pods=pods, containers=containers).ByteSize()
            if size <= MAX_DATA_LENGTH:
                return [(pods, containers)]
            scale = min(0.9, MAX_DATA_LENGTH / size)
            page = max(1, int(len(containers) * scale))
        n = max(1, math.ceil(len(containers) / page))
        pod_page = max(1, math.ceil(len(pods) / n))
        return [
            (pods[i * pod_page : (i + 1) * pod_page], containers[i * page : (i + 1) * page])
            for i in range(n)
        ]

    # -- applying adjustments and updates ----------------------------------------------------
    def _apply_one(self, container_id: str, cpus: str, mems: str) -> str:
        """Apply one update; returns an error text, or "" when applied."""
        container = self._containers.get(container_id)
        if container is None:
            return f"container {container_id} not found"
        if container.state != api_pb2.CONTAINER_RUNNING:
            return f"container {container_id} is not running"
        try:
            self.tree.write(container.cgroups_path, cpus=cpus, mems=mems)
        except CgroupTreeError as exc:
            return str(exc)
        if cpus:
            container.cpus = cpus
        if mems:
            container.mems = mems
        return ""

    def _apply_updates(
        self, updates: Sequence[api_pb2.ContainerUpdate], mode: str | None = None
    ) -> list[api_pb2.ContainerUpdate]:
        if not updates:
            return []
        if mode is None:
            mode = self._take_update_mode()
        if mode == "report":
            return list(updates)
        if mode == "containerd-drop":
            return [u for u in updates if not u.ignore_failure]
        failed: list[api_pb2.ContainerUpdate] = []
        for update in updates:
            cpu = update.linux.resources.cpu
            if mode == "cgroup-differs":
                container = self._containers.get(update.container_id)
                if container is not None and cpu.cpus:
                    container.cpus = cpu.cpus  # recorded as applied; the cgroup keeps its value
                continue
            error = self._apply_one(update.container_id, cpu.cpus, cpu.mems)
            if error:
                log.warning("update of container %s failed: %s", update.container_id, error)
                failed.append(update)
        return failed

    async def _decode(
        self, plugin: _Plugin, request: RequestReceived, message_type: type[_M]
    ) -> _M | None:
        """The request's message; None when it did not decode (answered INVALID_ARGUMENT)."""
        try:
            message: _M = message_type.FromString(request.payload)
        except DecodeError as exc:
            await plugin.peer.respond(
                request.stream_id, Status(StatusCode.INVALID_ARGUMENT, str(exc))
            )
            return None
        return message

    async def _update_containers(self, plugin: _Plugin, request: RequestReceived) -> None:
        body = await self._decode(plugin, request, api_pb2.UpdateContainersRequest)
        if body is None:
            return
        self.update_requests.append([u.container_id for u in body.update])
        if self._drop_updates > 0:
            self._drop_updates -= 1
            return
        if self._fail_updates > 0:
            self._fail_updates -= 1
            await plugin.peer.respond(
                request.stream_id, Status(StatusCode.UNKNOWN, "simulated UpdateContainers failure")
            )
            return
        async with self._lock:
            if self._mark_failed_updates > 0:
                self._mark_failed_updates -= 1
                failed = list(body.update)
            elif self.update_delay > 0:
                # As containerd does: one `runc update` per container, each taking its time.
                mode = self._take_update_mode()
                failed = []
                for update in body.update:
                    await trio.sleep(self.update_delay)
                    failed += self._apply_updates([update], mode)
            else:
                failed = self._apply_updates(body.update)
        reply = api_pb2.UpdateContainersResponse(failed=failed)
        with contextlib.suppress(PeerClosed):
            await plugin.peer.respond(request.stream_id, _serialize(reply))

    # -- lifecycles ---------------------------------------------------------------------------
    def _active(self, event: int) -> _Plugin | None:
        plugin = self._plugin
        if plugin is None or not plugin.ready.is_set() or not plugin.subscribed(event):
            return None
        return plugin

    async def create_pod(
        self, pod_uid: str, name: str, namespace: str = "default", *, qos: str | None = None
    ) -> str:
        """Run a pod sandbox; returns its id (the pause container's).

        As on a node: the kubelet creates the pod's cgroup for its QoS class, runc the
        sandbox's below it (v1: copying the parent's sets; v2: empty, so the parent's), and
        then containerd tells a plugin subscribed to RunPodSandbox. Raises
        `PodSandboxError` (and leaves nothing behind) when the plugin fails that event.
        ``qos`` is the pod's QoS class (``default_qos`` when None).
        """
        if pod_uid in self._pods:
            raise ValueError(f"pod {pod_uid} already exists")
        qos = qos or self.default_qos
        parent = pod_cgroup_parent(self.cgroup_driver, qos, pod_uid)
        sandbox_id = uuid.uuid4().hex
        pod = SimPod(
            id=sandbox_id,
            uid=pod_uid,
            name=name,
            namespace=namespace,
            qos=qos,
            cgroup_parent=parent,
            cgroups_path=container_cgroups_path(parent, sandbox_id),
        )
        async with self._lock:
            self.tree.ensure_root(self.node_cpus, self.node_mems)
            self.tree.ensure(parent)
            self.tree.ensure(pod.cgroups_path)
            self._pods[pod_uid] = pod
            try:
                await self._pod_event(api_pb2.RUN_POD_SANDBOX, pod)
            except CallFailed as exc:
                # containerd: "NRI RunPodSandbox failed" fails the sandbox's creation.
                del self._pods[pod_uid]
                self.tree.remove(pod.cgroups_path)
                self.tree.remove(parent)
                raise PodSandboxError(f"NRI RunPodSandbox failed: {exc.status.message}") from None
        return pod.id

    _POD_EVENTS: Final[dict[int, tuple[str, type[Message], type[Message]]]] = {
        api_pb2.RUN_POD_SANDBOX: (
            "RunPodSandbox",
            api_pb2.RunPodSandboxRequest,
            api_pb2.RunPodSandboxResponse,
        ),
        api_pb2.STOP_POD_SANDBOX: (
            "StopPodSandbox",
            api_pb2.StopPodSandboxRequest,
            api_pb2.StopPodSandboxResponse,
        ),
        api_pb2.REMOVE_POD_SANDBOX: (
            "RemovePodSandbox",
            api_pb2.RemovePodSandboxRequest,
            api_pb2.RemovePodSandboxResponse,
        ),
    }

    async def _pod_event(self, event: int, pod: SimPod) -> None:
        """Send one sandbox event to a plugin subscribed to it (under the event lock).

        Raises `CallFailed` for an error status. A plugin without the method (UNIMPLEMENTED)
        gets it as ``StateChange``, as does every plugin with ``remove_via_state_change``
        (an older runtime).
        """
        plugin = self._active(event)
        if plugin is None:
            return
        method, request_type, reply_type = self._POD_EVENTS[event]
        if not self.remove_via_state_change:
            try:
                await self._call(plugin, method, request_type(pod=pod.proto()), reply_type)
                return
            except CallFailed as exc:
                if exc.status.code != StatusCode.UNIMPLEMENTED:
                    raise
        change = api_pb2.StateChangeEvent(event=event, pod=pod.proto())  # type: ignore[arg-type]
        await self._call(plugin, "StateChange", change, api_pb2.Empty)

    async def create_container(self, pod_uid: str, name: str, env: Sequence[str] = ()) -> str:
        """Create and start a container; returns its id.

        Raises `ContainerCreateError` when the plugin refuses it. A plugin that times out
        is dropped and the container runs on every CPU, as with a real runtime. Without an
        adjustment runc writes no set: v1 keeps the copy of the parent's, v2 inherits.
        """
        pod = self._pods.get(pod_uid)
        if pod is None:
            raise ValueError(f"pod {pod_uid} does not exist")
        container_id = uuid.uuid4().hex
        container = SimContainer(
            id=container_id,
            pod_uid=pod_uid,
            pod_id=pod.id,
            name=name,
            env=list(env),
            cgroups_path=container_cgroups_path(pod.cgroup_parent, container_id),
        )
        async with self._lock:
            reply: api_pb2.CreateContainerResponse | None = None
            plugin = self._active(api_pb2.CREATE_CONTAINER)
            if plugin is not None:
                request = api_pb2.CreateContainerRequest(
                    pod=pod.proto(), container=container.proto()
                )
                try:
                    reply = await self._call(
                        plugin, "CreateContainer", request, api_pb2.CreateContainerResponse
                    )
                except CallFailed as exc:
                    raise ContainerCreateError(exc.status.message) from None
            cpus = mems = ""
            if reply is not None:
                adjusted = reply.adjust.linux.resources.cpu
                cpus, mems = adjusted.cpus, adjusted.mems
            try:
                self.tree.ensure(container.cgroups_path)
                self.tree.write(container.cgroups_path, cpus=cpus, mems=mems)
            except CgroupTreeError as exc:
                self.tree.remove(container.cgroups_path)
                raise ContainerCreateError(f"failed to apply cpuset: {exc}") from None
            container.cpus, container.mems = cpus, mems
            container.state = api_pb2.CONTAINER_RUNNING
            self._containers[container_id] = container
            if reply is not None:
                self._apply_updates(reply.update)
        return container_id

    async def stop_container(self, container_id: str) -> None:
        container = self._containers[container_id]
        async with self._lock:
            container.state = api_pb2.CONTAINER_STOPPED
            plugin = self._active(api_pb2.STOP_CONTAINER)
            if plugin is None:
                return
            request = api_pb2.StopContainerRequest(
                pod=self._pods[container.pod_uid].proto(), container=container.proto()
            )
            try:
                reply = await self._call(
                    plugin, "StopContainer", request, api_pb2.StopContainerResponse
                )
            except CallFailed as exc:
                log.warning("StopContainer of %s failed: %s", container_id, exc)
                return
            if reply is not None:
                self._apply_updates(reply.update)

    async def remove_container(self, container_id: str) -> None:
        container = self._containers[container_id]
        if container.state != api_pb2.CONTAINER_STOPPED:
            await self.stop_container(container_id)
        async with self._lock:
            del self._containers[container_id]
            self.tree.remove(container.cgroups_path)
            plugin = self._active(api_pb2.REMOVE_CONTAINER)
            if plugin is None:
                return
            pod = self._pods[container.pod_uid].proto()
            try:
                if not self.remove_via_state_change:
                    try:
                        await self._call(
                            plugin,
                            "RemoveContainer",
                            api_pb2.RemoveContainerRequest(pod=pod, container=container.proto()),
                            api_pb2.RemoveContainerResponse,
                        )
                        return
                    except CallFailed as exc:
                        if exc.status.code != StatusCode.UNIMPLEMENTED:
                            raise
                event = api_pb2.StateChangeEvent(
                    event=api_pb2.REMOVE_CONTAINER, pod=pod, container=container.proto()
                )
                await self._call(plugin, "StateChange", event, api_pb2.Empty)
            except CallFailed as exc:
                log.warning("RemoveContainer of %s failed: %s", container_id, exc)

    async def stop_pod(self, pod_uid: str) -> None:
        """StopPodSandbox: stop the pod's containers, then its sandbox (the event is sent
        once, to a plugin subscribed to it; a failure is only logged, as containerd does)."""
        for container in [c for c in self._containers.values() if c.pod_uid == pod_uid]:
            if container.state != api_pb2.CONTAINER_STOPPED:
                await self.stop_container(container.id)
        pod = self._pods[pod_uid]
        async with self._lock:
            if not pod.ready:
                return
            pod.ready = False
            try:
                await self._pod_event(api_pb2.STOP_POD_SANDBOX, pod)
            except CallFailed as exc:
                log.warning("StopPodSandbox of %s failed: %s", pod.id, exc)

    async def remove_pod(self, pod_uid: str) -> None:
        """RemovePodSandbox: containers removed, sandbox stopped and removed (events), then
        the sandbox's cgroup (runc) and the pod's (kubelet) go away."""
        for container in [c for c in self._containers.values() if c.pod_uid == pod_uid]:
            await self.remove_container(container.id)
        pod = self._pods.get(pod_uid)
        if pod is None:
            return
        await self.stop_pod(pod_uid)
        async with self._lock:
            try:
                await self._pod_event(api_pb2.REMOVE_POD_SANDBOX, pod)
            except CallFailed as exc:
                log.warning("RemovePodSandbox of %s failed: %s", pod.id, exc)
            del self._pods[pod_uid]
            self.tree.remove(pod.cgroups_path)
            self.tree.remove(pod.cgroup_parent)


async def main_runtime(
    socket_path: str,
    cgroup_root: str,
    *,
    node_cpus: str = "0-7",
    update_mode: str = "apply",
    cgroup_version: int = 1,
    cgroup_driver: str = "cgroupfs",
) -> None:
    """``dracpu sim runtime``: serve until SIGINT or SIGTERM, then remove the socket."""
    simulator = RuntimeSimulator(
        socket_path,
        cgroup_root,
        node_cpus=node_cpus,
        cgroup_version=cgroup_version,
        cgroup_driver=cgroup_driver,
    )
    simulator.set_update_mode(update_mode)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(simulator.run)
            print(f"NRI runtime simulator listening on {socket_path}", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break
