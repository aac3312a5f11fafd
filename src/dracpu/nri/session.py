"""The NRI session: dracpu as a plugin of containerd or CRI-O, over the runtime's socket.

A thin shell around two pure parts: `MuxPeer` (`nri.peer`) moves the socket's bytes, and
`PluginHandlers` (`nri.handlers`) turns each request into its reply. `NRISession` dials the
runtime, serves `nri.pkg.api.v1alpha1.Plugin` on mux connection 1 *before* registering on
connection 2 (Configure and even Synchronize may arrive before the RegisterPlugin reply,
protocols.md 6.4), answers each request from the handlers (no await between a request and
its decision; the only await before one is the final Synchronize's read of the CDI specs,
in a worker thread), and starts over with jittered exponential backoff whenever the runtime
goes away. Every new connection gets a fresh Synchronize, which rebuilds the plugin's view.

Its lifecycle is one `SessionState`:

    DISCONNECTED --dial--> CONNECTED --RegisterPlugin answered--> REGISTERED
    CONNECTED or REGISTERED --Synchronize answered--> SYNCHRONIZED
    any --socket ends--> DISCONNECTED

Updates to other containers found while handling a runtime request travel in that
request's reply. Unsolicited UpdateContainers (`update_containers`) are only sent from the
caller's own task (the pool pusher): calling the runtime while it waits for one of our
replies deadlocks it (6.6). Whatever the runtime cannot apply, or cannot be sent, comes back
to the caller as a `CpusetUpdateFailed` (the pusher hands them to the cgroupfs writer in
the change's one verification pass).
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Final

import trio
from google.protobuf.message import DecodeError

from dracpu import DRIVER_NAME, cdi
from dracpu.cgroupfs.inotify import EntryWatch
from dracpu.cpuset import CPUSet
from dracpu.logs import operation
from dracpu.messages import ContainerIntent, CpusetUpdateFailed, UpdateFailure, VerifyCpusets
from dracpu.metrics import DriverMetrics
from dracpu.nri.errors import ProtocolError
from dracpu.nri.handlers import NRI_API_VERSION, PluginHandlers, fill_updates
from dracpu.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN
from dracpu.nri.peer import PLUGIN_SERVICE, RUNTIME_SERVICE, CallFailed, MuxPeer, PeerClosed
from dracpu.nri.plugin import NRIPlugin, NRIPluginError
from dracpu.nri.ttrpc import (
    RequestReceived,
    Status,
    StatusCode,
    unimplemented_method,
    unimplemented_service,
)
from dracpu.nursery.backoff import restart_delay
from dracpu.nursery.pulse import Pulse
from dracpu.nursery.readiness import ReadyFlag
from dracpu.proto.nri import api_pb2

__all__ = ["NRISession", "SessionState"]

log = logging.getLogger(__name__)

_NAME_RE: Final = re.compile(r"[A-Za-z0-9_.+-]+")
_IDX_RE: Final = re.compile(r"[0-9]{2}")
SLOW_HANDLER_SECONDS: Final = 0.5
# How long a refused dial is retried at once before the backoff takes over.
QUICK_REDIAL: Final = 0.2

# behavior.md §16.1: the hooks whose lines share an operation id, with begin/end lines at
# these verbosities; every other request still gets an id of its own.
_OPERATIONS: dict[str, tuple[str, int]] = {
    "Synchronize": ("synchronize state with the runtime", 0),
    "CreateContainer": ("CreateContainer", 2),
    "StopContainer": ("StopContainer", 2),
    "RemoveContainer": ("RemoveContainer", 2),
}


class SessionState(StrEnum):
    DISCONNECTED = "disconnected"
    CONNECTED = "connected"
    REGISTERED = "registered"
    SYNCHRONIZED = "synchronized"


# The readiness component the session sets, and its reasons (what /readyz shows).
READY_COMPONENT = "nri"
NOT_CONNECTED = "runtime not connected"
NOT_SYNCHRONIZED = "not synchronized"


def _read_cdi_claims(cdi_dir: str | None) -> Mapping[str, CPUSet]:
    return cdi.read_claim_specs(cdi_dir).claims if cdi_dir else {}


class NRISession:
    """dracpu's NRI plugin connection, kept up for the life of the daemon.

    `run` never returns on its own: when the runtime closes or drops the session it dials
    again after a jittered exponential delay (the attempt counter resets after a session
    that reached Synchronize) and counts `metrics.nri_reconnects`. ``cdi_dir`` is where
    Synchronize finds the driver's CDI specs (None: no specs, as in tests).
    """

    def __init__(
        self,
        socket_path: str,
        plugin: NRIPlugin,
        *,
        cdi_dir: str | None = None,
        plugin_name: str = DRIVER_NAME,
        plugin_idx: str = "00",
        verify: trio.MemorySendChannel[VerifyCpusets] | None = None,
        metrics: DriverMetrics | None = None,
        reconnect_backoff: tuple[float, float] = (0.5, 30.0),
        registration_timeout: float = 5.0,
        update_timeout: float = 2.0,
        rand: Callable[[], float] | None = None,
        ready: ReadyFlag | None = None,
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
        self._cdi_dir = cdi_dir
        self._plugin_name = plugin_name
        self._plugin_idx = plugin_idx
        self._verify = verify
        self._metrics = metrics
        self._backoff = (initial, maximum)
        self._registration_timeout = registration_timeout
        self._update_timeout = update_timeout
        self._rand = rand or random.Random().random
        self.state = SessionState.DISCONNECTED
        # Synchronized or not is the daemon's "nri" readiness, set with every state change.
        self.ready = ready or ReadyFlag.standalone(READY_COMPONENT, NOT_CONNECTED)
        self._state_changed = Pulse()
        self._peer: MuxPeer | None = None
        self._handlers = PluginHandlers(plugin)
        self.sessions = 0

    # -- lifecycle ------------------------------------------------------------------------
    def _enter(self, state: SessionState) -> None:
        self.state = state
        if state is SessionState.SYNCHRONIZED:
            self.ready.set_ready()
        elif state is SessionState.DISCONNECTED:
            self.ready.set_not_ready(NOT_CONNECTED)
        else:
            self.ready.set_not_ready(NOT_SYNCHRONIZED)
        self._state_changed.fire()

    @property
    def is_synchronized(self) -> bool:
        """True while connected and the runtime's Synchronize of this session was answered."""
        return self.state is SessionState.SYNCHRONIZED

    @property
    def connected(self) -> bool:
        return self.state is not SessionState.DISCONNECTED

    @property
    def runtime_name(self) -> str:
        return self._handlers.runtime_name

    @property
    def runtime_version(self) -> str:
        return self._handlers.runtime_version

    @property
    def runtime_nri_version(self) -> str:
        """The NRI version the runtime announced in this session's Configure ("": none)."""
        return self._handlers.runtime_nri_version

    def describe(self) -> dict[str, Any]:
        """The NRI part of ``/debug/state``."""
        return {
            "connected": self.connected,
            "synchronized": self.is_synchronized,
            "state": str(self.state),
            "sessions": self.sessions,
            "runtime": f"{self.runtime_name} {self.runtime_version}".strip(),
            "runtime_nri_version": self.runtime_nri_version,
        }

    async def wait_synchronized(self) -> None:
        """Return once a session is synchronized (at once if one is now)."""
        await self._state_changed.wait_until(lambda: self.is_synchronized)

    # -- the reconnect loop -----------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        directory, name = os.path.split(os.path.abspath(self._socket_path))
        # One watch for the life of the session, in place before the first dial: a socket
        # bound at any moment after a dial looked is seen by the wait that follows it.
        with EntryWatch(directory, name) as socket_watch:
            task_status.started()
            failures = 0
            while True:
                # Creations before this dial are answered by the dial itself.
                socket_watch.clear()
                try:
                    stream = await self._dial()
                except OSError as exc:
                    log.info("cannot reach the NRI socket %s: %s", self._socket_path, exc)
                else:
                    if self.sessions and self._metrics is not None:
                        self._metrics.nri_reconnects.inc()
                    self.sessions += 1
                    reason, synchronized = await self._serve(stream)
                    log.warning("NRI session ended: %s", reason)
                    if synchronized:
                        failures = 0
                failures += 1
                await self._wait_to_dial(socket_watch, failures)

    async def _dial(self) -> trio.SocketStream:
        """Connect; a socket that was just bound may not listen yet (the runtime binds,
        then listens), so a refusal is tried again for a moment before it counts."""
        deadline = trio.current_time() + QUICK_REDIAL
        while True:
            try:
                return await trio.open_unix_socket(self._socket_path)
            except ConnectionRefusedError:
                if trio.current_time() >= deadline:
                    raise
                await trio.sleep(0.01)

    async def _wait_to_dial(self, socket_watch: EntryWatch, failures: int) -> None:
        """Dial again as soon as the runtime's socket is (re)created after the last dial;
        back off only while a socket that exists refuses or drops us (a runtime restart
        removes and re-creates it, so rejoining does not wait out a backoff)."""
        initial, maximum = self._backoff
        delay = restart_delay(
            failures, initial=initial, factor=2.0, cap=maximum, jitter=0.5, rand=self._rand
        )
        # A missing socket can only come back by being created: wait for that, up to the
        # cap. Without inotify nothing would tell us, so keep to the backoff.
        exists = os.path.exists(self._socket_path)
        timeout = delay if exists or not socket_watch.available else maximum
        if await socket_watch.wait(timeout):
            log.info(
                "NRI socket %s %s: dialing now",
                self._socket_path,
                "re-created" if exists else "appeared",
            )

    async def _serve(self, stream: trio.SocketStream) -> tuple[str, bool]:
        peer = MuxPeer(
            stream,
            serve_conn=PLUGIN_SERVICE_CONN,
            call_conn=RUNTIME_SERVICE_CONN,
            on_request=self._on_request,
        )
        self._handlers = PluginHandlers(self._plugin)
        reason = "the runtime closed the connection"
        self._peer = peer
        self._enter(SessionState.CONNECTED)
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
                    error = await self._register(peer)
                    if error:
                        reason = error
                        nursery.cancel_scope.cancel()

                # Serve conn 1 first: Configure and Synchronize may arrive before the
                # RegisterPlugin reply (protocols.md 6.4).
                await nursery.start(read)
                nursery.start_soon(register)
        finally:
            synchronized = self.is_synchronized
            self._peer = None
            self._enter(SessionState.DISCONNECTED)
        return reason, synchronized

    async def _register(self, peer: MuxPeer) -> str:
        """RegisterPlugin on connection 2; returns the error that ends the session, or ""."""
        request = api_pb2.RegisterPluginRequest(
            plugin_name=self._plugin_name,
            plugin_idx=self._plugin_idx,
            nri_version=NRI_API_VERSION,
        )
        try:
            await peer.call(
                RUNTIME_SERVICE,
                "RegisterPlugin",
                request.SerializeToString(),
                timeout=self._registration_timeout,
            )
        except (PeerClosed, CallFailed, trio.TooSlowError) as exc:
            return f"RegisterPlugin failed: {exc}"
        log.info(
            "registered with the runtime as NRI plugin %s-%s", self._plugin_idx, self._plugin_name
        )
        if self.state is SessionState.CONNECTED:
            self._enter(SessionState.REGISTERED)
        return ""

    # -- serving the Plugin service ----------------------------------------------------------
    async def _on_request(self, request: RequestReceived) -> None:
        peer = self._peer
        assert peer is not None
        result: bytes | Status
        synchronized = False
        if request.service != PLUGIN_SERVICE:
            result = unimplemented_service(request.service)
        elif not self._handlers.handles(request.method):
            result = unimplemented_method(request.method)
        else:
            started = time.perf_counter()
            message, v = _OPERATIONS.get(request.method, (None, 4))
            try:
                with operation(message, v=v):
                    if request.method == "Synchronize":
                        result, synchronized = await self._synchronize(request.payload)
                    else:
                        result = self._handlers.handle(request.method, request.payload)
            except DecodeError as exc:
                result = Status(
                    StatusCode.INVALID_ARGUMENT, f"undecodable {request.method} request: {exc}"
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
        # Taken whatever the outcome, so a refused request's leftovers never ride along
        # with the next reply.
        applied, self._handlers.applied = self._handlers.applied, []
        try:
            await peer.respond(request.stream_id, result)
        except PeerClosed:
            return
        if isinstance(result, bytes):
            self._verify_applied(applied)
        if synchronized and peer is self._peer:
            self._enter(SessionState.SYNCHRONIZED)

    def _verify_applied(self, applied: list[ContainerIntent]) -> None:
        """Have the verifier read back what the reply asked for (CreateContainer,
        Synchronize) or what only dracpu writes (the pod sandboxes of RunPodSandbox and
        Synchronize)."""
        if applied and self._verify is not None:
            self._verify.send_nowait(VerifyCpusets(intents=tuple(applied), cause="create"))

    async def _synchronize(self, payload: bytes) -> tuple[bytes, bool]:
        """A chunk of Synchronize: `MORE`, or the final reply (True: the sync is done)."""
        pending = self._handlers.sync_chunk(payload)
        if pending is None:
            return PluginHandlers.MORE, False
        cdi_claims: Mapping[str, CPUSet] = {}
        if self._cdi_dir and self._plugin.needs_cdi_specs(pending.containers):
            # Reads only: abandoned when the session is cancelled (shutdown), so a hung
            # filesystem cannot hold up the daemon's stop.
            cdi_claims = await trio.to_thread.run_sync(
                _read_cdi_claims, self._cdi_dir, abandon_on_cancel=True
            )
        return self._handlers.finish_sync(pending, cdi_claims), True

    # -- unsolicited updates -----------------------------------------------------------------
    async def update_containers(
        self, updates: Sequence[ContainerIntent]
    ) -> list[CpusetUpdateFailed]:
        """Send `updates` with Runtime.UpdateContainers; return those that failed, each
        with why (error status, listed in `failed`, timeout, session down), except those
        of containers the plugin stopped tracking meanwhile (stopped or removed: nothing to
        pin). Call it from a task of its own, never while a runtime request is handled.
        """
        if not updates:
            return []
        failed, reason, detail = await self._send_updates(updates)
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
        out = [CpusetUpdateFailed(intent=u, reason=reason, detail=detail) for u in failed]
        for message in out:
            log.warning(
                "cpuset update of container %s failed: %s", message.intent.container_id, message.why
            )
        return out

    async def _send_updates(
        self, updates: Sequence[ContainerIntent]
    ) -> tuple[list[ContainerIntent], UpdateFailure, str]:
        """One UpdateContainers call: the updates that failed, why, and the detail."""
        peer = self._peer
        if peer is None or not self.is_synchronized:
            return list(updates), "NRI session down", ""
        request = api_pb2.UpdateContainersRequest()
        fill_updates(request.update, updates)
        try:
            payload = await peer.call(
                RUNTIME_SERVICE,
                "UpdateContainers",
                request.SerializeToString(),
                timeout=self._update_timeout,
            )
        except trio.TooSlowError:
            return list(updates), "timed out", ""
        except CallFailed as exc:
            return list(updates), "UpdateContainers failed", exc.status.message
        except PeerClosed:
            return list(updates), "NRI session down", ""
        try:
            response = api_pb2.UpdateContainersResponse.FromString(payload)
        except DecodeError as exc:
            return list(updates), "undecodable UpdateContainers reply", str(exc)
        failed_ids = {u.container_id for u in response.failed}
        failed = [u for u in updates if u.container_id in failed_ids]
        return failed, "listed as failed by the runtime", ""
