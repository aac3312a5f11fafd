"""The NRI session: dracpu as a plugin of containerd or CRI-O, over the runtime's socket.

Two layers, both thin shells around the sans-IO codecs:

- `MuxPeer` drives one NRI socket: it feeds socket bytes to the `Multiplexer`, hands each
  logical connection's bytes to its ttrpc object (a server on the connection we serve, a
  client on the one we call), passes every inbound request to a callback, and matches
  replies to outstanding calls. The runtime simulator (`dracpu.sim.runtime`) uses it with
  the connections swapped.
- `NRISession` is the plugin: it dials the runtime, serves `nri.pkg.api.v1alpha1.Plugin` on
  mux connection 1 *before* registering on connection 2 (Configure and even Synchronize may
  arrive before the RegisterPlugin reply, protocols.md 6.4), answers each request at once
  from the pure `NRIPlugin` (no await between the request and the decision), and starts over
  with exponential backoff and jitter whenever the runtime goes away. Every new connection
  gets a fresh Synchronize from the runtime, which rebuilds the plugin's view.

Updates to other containers found while handling a runtime request travel in that request's
reply. Unsolicited UpdateContainers (`update_containers`) are only sent from the caller's own
task: calling the runtime while it waits for one of our replies deadlocks it (6.6). Whatever
the runtime cannot apply, or cannot be sent, becomes a `CpusetUpdateFailed` message for the
cgroupfs writer.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import trio
from google.protobuf.message import DecodeError, Message

from dracpu.cpuset import CPUSet
from dracpu.logs import operation
from dracpu.messages import CpusetUpdateFailed
from dracpu.metrics import DriverMetrics
from dracpu.nri.errors import FrameTooLarge, ProtocolError
from dracpu.nri.mux import (
    PLUGIN_SERVICE_CONN,
    RUNTIME_SERVICE_CONN,
    Multiplexer,
    MuxFrameDropped,
)
from dracpu.nri.plugin import NRIPlugin, NRIPluginError, Update
from dracpu.nri.ttrpc import (
    RequestReceived,
    ResponseReceived,
    Status,
    StatusCode,
    TTRPCClientConnection,
    TTRPCServerConnection,
    unimplemented_method,
    unimplemented_service,
)
from dracpu.proto.nri import api_pb2

__all__ = [
    "EVENT_MASK",
    "PLUGIN_SERVICE",
    "RUNTIME_SERVICE",
    "CallFailed",
    "MuxPeer",
    "NRISession",
    "PeerClosed",
    "reconnect_delay",
    "update_to_proto",
]

log = logging.getLogger(__name__)

PLUGIN_SERVICE: Final = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE: Final = "nri.pkg.api.v1alpha1.Runtime"


def _mask(*events: int) -> int:
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


EVENT_MASK: Final = _mask(
    api_pb2.CREATE_CONTAINER, api_pb2.STOP_CONTAINER, api_pb2.REMOVE_CONTAINER
)
"""The events dracpu handles (0x0608). Synchronize needs no bit; never 0 (= all, 6.5)."""

_NAME_RE: Final = re.compile(r"[A-Za-z0-9_.+-]+")
_IDX_RE: Final = re.compile(r"[0-9]{2}")
_READ_SIZE: Final = 65536
SLOW_HANDLER_SECONDS: Final = 0.5


# behavior.md §16.1: the hooks whose lines share an operation id, with begin/end lines at
# these verbosities; every other request still gets an id of its own.
_OPERATIONS: dict[str, tuple[str, int]] = {
    "Synchronize": ("synchronize state with the runtime", 0),
    "CreateContainer": ("CreateContainer", 2),
    "StopContainer": ("StopContainer", 2),
    "RemoveContainer": ("RemoveContainer", 2),
}


class PeerClosed(Exception):
    """The socket ended (or broke) before the call finished."""


class CallFailed(Exception):
    """The peer answered a call with an error status."""

    def __init__(self, method: str, status: Status) -> None:
        super().__init__(f"{method}: code {status.code}: {status.message}")
        self.status = status


@dataclass
class _Pending:
    done: trio.Event = field(default_factory=trio.Event)
    result: bytes | Status | None = None
    error: str = ""


class MuxPeer:
    """One NRI socket: a ttrpc server on `serve_conn`, a ttrpc client on `call_conn`.

    `run` is the read loop; it returns the reason the socket ended and raises
    `ProtocolError` when the peer breaks the wire format. Requests are handed to
    `on_request` in arrival order, from the read loop itself: it must answer (or hand the
    work to a task of its own) without waiting on the peer.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        serve_conn: int,
        call_conn: int,
        on_request: Callable[[RequestReceived], Awaitable[None]],
    ) -> None:
        self._stream = stream
        self._serve_conn = serve_conn
        self._call_conn = call_conn
        self._on_request = on_request
        self._mux = Multiplexer((serve_conn, call_conn))
        self._server = TTRPCServerConnection()
        self._client = TTRPCClientConnection()
        self._send_lock = trio.Lock()
        self._pending: dict[int, _Pending] = {}
        self._closed: str | None = None

    @property
    def closed(self) -> bool:
        return self._closed is not None

    async def run(self) -> str:
        reason = "the peer closed the socket"
        try:
            while True:
                try:
                    data = await self._stream.receive_some(_READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    reason = f"socket error: {exc}"
                    break
                if not data:
                    self._mux.receive_eof()
                    break
                await self._receive(bytes(data))
        except PeerClosed as exc:
            reason = str(exc)
        except ProtocolError as exc:
            reason = f"protocol error: {exc}"
            raise
        finally:
            self._close_pending(reason)
        return reason

    async def _receive(self, data: bytes) -> None:
        for event in self._mux.receive_data(data):
            if isinstance(event, MuxFrameDropped):
                log.debug("dropped a mux frame for unused connection %d", event.conn_id)
                continue
            if event.conn_id == self._serve_conn:
                for request in self._server.receive_data(event.payload):
                    if isinstance(request, RequestReceived):
                        await self._on_request(request)
                    else:
                        log.warning(
                            "rejected a request on stream %d: %s",
                            request.stream_id,
                            request.status.message,
                        )
                        await self.flush()
            else:
                for reply in self._client.receive_data(event.payload):
                    if not isinstance(reply, ResponseReceived):
                        log.debug("dropped a late reply on stream %d", reply.stream_id)
                        continue
                    pending = self._pending.pop(reply.stream_id, None)
                    if pending is not None:
                        pending.result = reply.result
                        pending.done.set()

    def _close_pending(self, reason: str) -> None:
        self._closed = reason
        for pending in self._pending.values():
            pending.error = reason
            pending.done.set()
        self._pending.clear()

    async def flush(self) -> None:
        """Send everything both ttrpc connections have queued."""
        async with self._send_lock:
            for message in self._server.messages_to_send():
                self._mux.send(self._serve_conn, message)
            for message in self._client.messages_to_send():
                self._mux.send(self._call_conn, message)
            data = self._mux.data_to_send()
            if not data:
                return
            try:
                await self._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise PeerClosed(f"socket error: {exc}") from exc

    async def respond(self, stream_id: int, result: bytes | Status) -> None:
        """Answer a request; a reply too large for ttrpc becomes RESOURCE_EXHAUSTED."""
        try:
            self._server.send_response(stream_id, result)
        except FrameTooLarge as exc:
            self._server.send_response(stream_id, Status(StatusCode.RESOURCE_EXHAUSTED, str(exc)))
        await self.flush()

    async def call(self, service: str, method: str, payload: bytes, *, timeout: float) -> bytes:
        """A unary call; raises `trio.TooSlowError`, `CallFailed` or `PeerClosed`."""
        if self._closed is not None:
            raise PeerClosed(self._closed)
        try:
            stream_id = self._client.send_request(
                service, method, payload, timeout_nano=int(timeout * 1e9)
            )
        except FrameTooLarge as exc:
            raise CallFailed(method, Status(StatusCode.RESOURCE_EXHAUSTED, str(exc))) from exc
        pending = _Pending()
        self._pending[stream_id] = pending
        await self.flush()
        with trio.move_on_after(timeout):
            await pending.done.wait()
        if not pending.done.is_set():
            self._pending.pop(stream_id, None)
            self._client.abandon(stream_id)
            raise trio.TooSlowError(f"{method} got no reply within {timeout:g}s")
        if pending.error:
            raise PeerClosed(pending.error)
        result = pending.result
        if isinstance(result, Status):
            raise CallFailed(method, result)
        assert result is not None
        return result

    async def aclose(self) -> None:
        await self._stream.aclose()


def reconnect_delay(
    attempt: int, *, initial: float, maximum: float, rand: Callable[[], float]
) -> float:
    """Exponential backoff capped at `maximum`, jittered into [50 %, 100 %] of it."""
    base: float = min(maximum, initial * (2 ** min(attempt, 62)))
    return base * (0.5 + 0.5 * rand())


def _serialize(message: Message) -> bytes:
    return bytes(message.SerializeToString())


def _fill_updates(target: Any, updates: Sequence[Update]) -> None:
    """Append `updates` to a repeated ContainerUpdate field (in place: much faster than
    building each nested message with keyword arguments, which counts at 1,000 updates)."""
    formatted: dict[CPUSet, str] = {}
    for update in updates:
        cpus = formatted.get(update.cpus)
        if cpus is None:
            cpus = formatted[update.cpus] = update.cpus.format()
        message = target.add()
        message.container_id = update.container_id
        cpu = message.linux.resources.cpu
        cpu.cpus = cpus
        if update.mems:
            cpu.mems = update.mems
        if update.ignore_failure:
            message.ignore_failure = True


def update_to_proto(update: Update) -> api_pb2.ContainerUpdate:
    return api_pb2.ContainerUpdate(
        container_id=update.container_id,
        linux=api_pb2.LinuxContainerUpdate(
            resources=api_pb2.LinuxResources(
                cpu=api_pb2.LinuxCPU(cpus=update.cpus.format(), mems=update.mems)
            )
        ),
        ignore_failure=update.ignore_failure,
    )


class NRISession:
    """dracpu's NRI plugin connection, kept up for the life of the daemon.

    `run` never returns on its own: when the runtime closes or drops the session it dials
    again after `reconnect_delay` (the attempt counter resets after a session that reached
    Synchronize) and counts `metrics.nri_reconnects`.
    """

    def __init__(
        self,
        socket_path: str,
        plugin: NRIPlugin,
        *,
        plugin_name: str = "dra.cpu",
        plugin_idx: str = "00",
        failed_updates: trio.MemorySendChannel[CpusetUpdateFailed] | None = None,
        metrics: DriverMetrics | None = None,
        reconnect_backoff: tuple[float, float] = (0.5, 30.0),
        registration_timeout: float = 5.0,
        update_timeout: float = 2.0,
        rand: Callable[[], float] | None = None,
    ) -> None:
        if not _NAME_RE.fullmatch(plugin_name):
            raise ValueError(f"invalid NRI plugin name {plugin_name!r}: use [A-Za-z0-9_.+-]")
        if not _IDX_RE.fullmatch(plugin_idx):
            raise ValueError(f"invalid NRI plugin index {plugin_idx!r}: want two digits")
        initial, maximum = reconnect_backoff
        if not 0 < initial <= maximum:
            raise ValueError(f"invalid reconnect backoff {reconnect_backoff!r}")
        self._socket_path = socket_path
        self._plugin = plugin
        self._plugin_name = plugin_name
        self._plugin_idx = plugin_idx
        self._failed_updates = failed_updates
        self._metrics = metrics
        self._backoff = (initial, maximum)
        self._registration_timeout = registration_timeout
        self._update_timeout = update_timeout
        self._rand = rand or random.Random().random
        self._peer: MuxPeer | None = None
        self._synchronized = False
        self._sync_changed = trio.Event()
        self._sync_done = False
        self._sync_pods: list[api_pb2.PodSandbox] = []
        self._sync_containers: list[api_pb2.Container] = []
        self.runtime_name = ""
        self.runtime_version = ""
        self.sessions = 0
        self._handlers: dict[str, Callable[[bytes], bytes]] = {
            "Configure": self._configure,
            "Synchronize": self._synchronize,
            "CreateContainer": self._create_container,
            "StopContainer": self._stop_container,
            "RemoveContainer": self._remove_container,
            "StateChange": self._state_change,
            "Shutdown": self._shutdown,
        }

    # -- readiness ------------------------------------------------------------------------
    @property
    def is_synchronized(self) -> bool:
        """True while connected and the runtime's Synchronize of this session was answered."""
        return self._synchronized

    async def wait_synchronized(self) -> None:
        """Return once a session is synchronized (at once if one is now)."""
        while not self._synchronized:
            await self._sync_changed.wait()

    def _set_synchronized(self, value: bool) -> None:
        self._synchronized = value
        self._sync_changed.set()
        self._sync_changed = trio.Event()

    @property
    def connected(self) -> bool:
        return self._peer is not None

    # -- the reconnect loop -----------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        attempt = 0
        initial, maximum = self._backoff
        while True:
            try:
                stream = await trio.open_unix_socket(self._socket_path)
            except OSError as exc:
                log.info("cannot reach the NRI socket %s: %s", self._socket_path, exc)
            else:
                if self.sessions and self._metrics is not None:
                    self._metrics.nri_reconnects.inc()
                self.sessions += 1
                reason, synchronized = await self._serve(stream)
                log.warning("NRI session ended: %s", reason)
                if synchronized:
                    attempt = 0
            delay = reconnect_delay(attempt, initial=initial, maximum=maximum, rand=self._rand)
            attempt += 1
            await trio.sleep(delay)

    async def _serve(self, stream: trio.SocketStream) -> tuple[str, bool]:
        peer = MuxPeer(
            stream,
            serve_conn=PLUGIN_SERVICE_CONN,
            call_conn=RUNTIME_SERVICE_CONN,
            on_request=self._on_request,
        )
        self._sync_pods, self._sync_containers = [], []
        self._sync_done = False
        reason = "the runtime closed the connection"
        synchronized = False
        self._peer = peer
        try:
            async with stream, trio.open_nursery() as nursery:

                async def read(*, task_status: trio.TaskStatus[None]) -> None:
                    nonlocal reason
                    task_status.started()
                    try:
                        reason = await peer.run()
                    except ProtocolError as exc:
                        reason = f"protocol error: {exc}"
                    finally:
                        nursery.cancel_scope.cancel()

                async def register() -> None:
                    nonlocal reason
                    request = api_pb2.RegisterPluginRequest(
                        plugin_name=self._plugin_name, plugin_idx=self._plugin_idx
                    )
                    try:
                        await peer.call(
                            RUNTIME_SERVICE,
                            "RegisterPlugin",
                            request.SerializeToString(),
                            timeout=self._registration_timeout,
                        )
                    except (PeerClosed, CallFailed, trio.TooSlowError) as exc:
                        reason = f"RegisterPlugin failed: {exc}"
                        nursery.cancel_scope.cancel()
                        return
                    log.info(
                        "registered with the runtime as NRI plugin %s-%s",
                        self._plugin_idx,
                        self._plugin_name,
                    )

                # Serve conn 1 first: Configure and Synchronize may arrive before the
                # RegisterPlugin reply (protocols.md 6.4).
                await nursery.start(read)
                nursery.start_soon(register)
        finally:
            synchronized = self._synchronized
            self._peer = None
            self._set_synchronized(False)
        return reason, synchronized

    # -- serving the Plugin service ----------------------------------------------------------
    async def _on_request(self, request: RequestReceived) -> None:
        peer = self._peer
        assert peer is not None
        result: bytes | Status
        if request.service != PLUGIN_SERVICE:
            result = unimplemented_service(request.service)
        else:
            handler = self._handlers.get(request.method)
            if handler is None:
                result = unimplemented_method(request.method)
            else:
                started = time.perf_counter()
                message, v = _OPERATIONS.get(request.method, (None, 4))
                try:
                    with operation(message, v=v):
                        result = handler(request.payload)
                except DecodeError as exc:
                    result = Status(
                        StatusCode.INVALID_ARGUMENT,
                        f"undecodable {request.method} request: {exc}",
                    )
                except NRIPluginError as exc:
                    log.warning("%s refused: %s", request.method, exc)
                    result = Status(StatusCode.UNKNOWN, str(exc))
                except Exception as exc:
                    log.exception("%s failed", request.method)
                    result = Status(StatusCode.INTERNAL, f"{request.method}: internal error: {exc}")
                took = time.perf_counter() - started
                if took > SLOW_HANDLER_SECONDS:
                    # The runtime drops plugins that miss its 2 s request timeout.
                    log.warning("%s took %.3fs to decide", request.method, took)
        try:
            await peer.respond(request.stream_id, result)
        except PeerClosed:
            return
        if request.method == "Synchronize" and self._sync_done:
            self._sync_done = False
            self._set_synchronized(True)

    def _configure(self, payload: bytes) -> bytes:
        request = api_pb2.ConfigureRequest.FromString(payload)
        self.runtime_name = request.runtime_name
        self.runtime_version = request.runtime_version
        log.info(
            "configured by runtime %s %s (request timeout %d ms)",
            request.runtime_name,
            request.runtime_version,
            request.request_timeout,
        )
        return _serialize(api_pb2.ConfigureResponse(events=EVENT_MASK))

    def _synchronize(self, payload: bytes) -> bytes:
        request = api_pb2.SynchronizeRequest.FromString(payload)
        self._sync_pods.extend(request.pods)
        self._sync_containers.extend(request.containers)
        if request.more:
            # A chunk of a split Synchronize: echo `more`, no updates (6.7).
            return _serialize(api_pb2.SynchronizeResponse(more=True))
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers = [], []
        updates = self._plugin.synchronize(pods, containers)
        log.info(
            "synchronized with %d pods and %d containers: %d updates",
            len(pods),
            len(containers),
            len(updates),
        )
        self._sync_done = True
        response = api_pb2.SynchronizeResponse()
        _fill_updates(response.update, updates)
        return _serialize(response)

    def _create_container(self, payload: bytes) -> bytes:
        request = api_pb2.CreateContainerRequest.FromString(payload)
        decision = self._plugin.create_container(request.pod, request.container)
        response = api_pb2.CreateContainerResponse(
            adjust=api_pb2.ContainerAdjustment(
                linux=api_pb2.LinuxContainerAdjustment(
                    resources=api_pb2.LinuxResources(
                        cpu=api_pb2.LinuxCPU(cpus=decision.cpus.format(), mems=decision.mems)
                    )
                )
            ),
        )
        _fill_updates(response.update, decision.updates)
        return _serialize(response)

    def _stop_container(self, payload: bytes) -> bytes:
        request = api_pb2.StopContainerRequest.FromString(payload)
        self._plugin.stop_container(request.pod, request.container)
        return b""  # StopContainerResponse with no updates (§13.4)

    def _remove_container(self, payload: bytes) -> bytes:
        request = api_pb2.RemoveContainerRequest.FromString(payload)
        self._plugin.remove_container(request.pod, request.container)
        return b""

    def _state_change(self, payload: bytes) -> bytes:
        # NRI < v0.12 runtimes deliver RemoveContainer only through StateChange.
        event = api_pb2.StateChangeEvent.FromString(payload)
        if event.event == api_pb2.REMOVE_CONTAINER:
            self._plugin.remove_container(event.pod, event.container)
        return b""

    def _shutdown(self, payload: bytes) -> bytes:
        log.info("runtime shutting down")
        return b""

    # -- unsolicited updates -----------------------------------------------------------------
    async def update_containers(self, updates: Sequence[Update]) -> list[str]:
        """Send `updates` with Runtime.UpdateContainers; return the ids that failed.

        Call it from a task of its own, never while a runtime request is being handled.
        Every failed update (error status, listed in `failed`, timeout, session down) is
        also sent to `failed_updates` as a `CpusetUpdateFailed`, except those of containers
        the plugin stopped tracking meanwhile (stopped or removed: nothing to pin).
        """
        if not updates:
            return []
        peer = self._peer
        failed: list[Update]
        if peer is None or not self.is_synchronized:
            failed, reason = list(updates), "NRI session down"
        else:
            request = api_pb2.UpdateContainersRequest()
            _fill_updates(request.update, updates)
            try:
                payload = await peer.call(
                    RUNTIME_SERVICE,
                    "UpdateContainers",
                    request.SerializeToString(),
                    timeout=self._update_timeout,
                )
            except trio.TooSlowError:
                failed, reason = list(updates), "timed out"
            except CallFailed as exc:
                failed, reason = list(updates), f"UpdateContainers failed: {exc.status.message}"
            except PeerClosed:
                failed, reason = list(updates), "NRI session down"
            else:
                try:
                    response = api_pb2.UpdateContainersResponse.FromString(payload)
                except DecodeError as exc:
                    failed, reason = list(updates), f"undecodable UpdateContainers reply: {exc}"
                else:
                    failed_ids = {u.container_id for u in response.failed}
                    failed = [u for u in updates if u.container_id in failed_ids]
                    reason = "listed as failed by the runtime"
        # A container stopped or removed while the update was on its way is no longer
        # ours to pin: its failure is expected and nothing falls back to cgroupfs for it.
        gone = [u for u in failed if not self._plugin.knows(u.container_id)]
        if gone:
            log.debug(
                "cpuset update of %d container(s) gone meanwhile not retried: %s",
                len(gone),
                ",".join(u.container_id for u in gone),
            )
            failed = [u for u in failed if self._plugin.knows(u.container_id)]
        for update in failed:
            log.warning("cpuset update of container %s failed: %s", update.container_id, reason)
            if self._failed_updates is not None:
                await self._failed_updates.send(
                    CpusetUpdateFailed(intent=update.intent(), reason=reason)
                )
        return [u.container_id for u in failed]
