"""Kubelet plugin registration, ``pluginregistration.Registration`` (behavior.md §7;
protocols.md §2).

``GetInfo`` answers with the same name, endpoint and versions for the plugin's whole life
(the kubelet's connection monitor keeps calling it). ``NotifyRegistrationStatus`` is
remembered and sets the ``kubelet-registration`` readiness component (``ready``, the
daemon's one readiness source); a rejection is answered with ``failed registration
process: <error>``. ``wait_registered`` is the start-up wait of §7: it sleeps until the
kubelet's answer that accepts the plugin, or the timeout. Upstream polls its stored status
every second (kubeletplugin's ``wait.PollUntilContextTimeout``); here the answer itself
wakes the waiter, so the wait ends at that moment, with the same timeout message.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import trio
from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError

from dracpu import DRIVER_NAME
from dracpu.gofmt import go_quote
from dracpu.logs import get_logger
from dracpu.nursery.readiness import ReadyFlag
from dracpu.proto.pluginregistration import api_grpc as reg_grpc
from dracpu.proto.pluginregistration import api_pb2 as reg_pb

__all__ = [
    "PLUGIN_TYPE",
    "READY_COMPONENT",
    "SUPPORTED_VERSIONS",
    "WAITING_REASON",
    "RegistrationError",
    "RegistrationService",
]

log = logging.getLogger(__name__)
klog = get_logger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# protocols.md §2.4, in its order: kubelets take the first DRA service they know, so v1
# leads; both health packages are served, and listing them lets a 1.37 kubelet pick one.
SUPPORTED_VERSIONS = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1alpha1.DRAResourceHealth",
    "v1.DRAResourceHealth",
)
REGISTRATION_TIMEOUT = 30.0
# The readiness component this service sets, and what /readyz says before any answer.
READY_COMPONENT = "kubelet-registration"
WAITING_REASON = "waiting for the kubelet"
# What Go's wait.PollUntilContextTimeout reports when it gives up.
_TIMEOUT_ERROR = "context deadline exceeded"


class RegistrationError(Exception):
    """The kubelet did not accept the plugin in time; ``str()`` says what is known."""


class RegistrationService(reg_grpc.RegistrationBase):
    """The registration socket's service; it reports the plugin's registration to
    ``ready``, the ``kubelet-registration`` component of the daemon's readiness (one of
    its own when none is given)."""

    def __init__(
        self,
        *,
        endpoint: str,
        driver_name: str = DRIVER_NAME,
        supported_versions: Sequence[str] = SUPPORTED_VERSIONS,
        registrar_dir: str = "",
        ready: ReadyFlag | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.driver_name = driver_name
        self.supported_versions = tuple(supported_versions)
        self.registrar_dir = registrar_dir
        self.ready = ready or ReadyFlag.standalone(READY_COMPONENT, WAITING_REASON)
        self.registered = False
        self.status_received = False
        self.last_error: str | None = None

    def info(self) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=self.supported_versions,
        )

    def record_status(self, registered: bool, error: str) -> None:
        """Remember what the kubelet said and report it as readiness (waking
        ``wait_registered``); a new rejection reason is logged."""
        self.status_received = True
        self.registered = registered
        if registered:
            self.ready.set_ready()
            log.info("kubelet registered the plugin endpoint=%s", self.endpoint)
            return
        if error and error != self.last_error:
            if self.last_error is not None:
                log.warning(
                    "kubelet rejected the plugin with a new reason: %s (before: %s)",
                    error,
                    self.last_error,
                )
            else:
                log.warning("kubelet rejected the plugin: %s", error)
            self.last_error = error
        self.ready.set_not_ready(
            f"rejected by the kubelet: {self.last_error}" if self.last_error else WAITING_REASON
        )

    async def GetInfo(self, stream: Any) -> None:
        await stream.recv_message()
        await stream.send_message(self.info())

    async def NotifyRegistrationStatus(self, stream: Any) -> None:
        status = await stream.recv_message()
        self.record_status(status.plugin_registered, status.error)
        if not status.plugin_registered:
            raise GRPCError(Status.UNKNOWN, f"failed registration process: {status.error}")
        await stream.send_message(reg_pb.RegistrationStatusResponse())

    def grpc_handlers(self) -> dict[str, Handler]:
        return self.__mapping__()

    def timeout_message(self) -> str:
        """Why registration did not happen, in the §7 wording."""
        if self.last_error is not None:
            return (
                "kubelet did not register the plugin, last rejection was "
                f"{go_quote(self.last_error)}: {_TIMEOUT_ERROR}"
            )
        if self.status_received:
            return f"kubelet did not register the plugin and reported no reason: {_TIMEOUT_ERROR}"
        return (
            "kubelet never reported a registration status, check that it watches "
            f"{self.registrar_dir}: {_TIMEOUT_ERROR}"
        )

    async def report_until_registered(
        self,
        every: float = REGISTRATION_TIMEOUT,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The ``registration`` service: say why the kubelet has not registered the
        plugin, every ``every`` seconds until it does.

        Upstream exits when registration takes longer than 30 s (behavior.md §7); dracpu
        keeps serving (NRI pinning and the cgroupfs writer do not need the kubelet) and
        stays not ready, with the same message in the log and on ``/readyz``.
        """
        task_status.started()
        while True:
            try:
                await self.wait_registered(every)
            except RegistrationError as exc:
                klog.warning("plugin not registered yet", err=str(exc))
                continue
            await trio.sleep_forever()

    async def wait_registered(self, timeout: float = REGISTRATION_TIMEOUT) -> None:
        """Return once the kubelet accepted the plugin (at once if it has), woken by the
        answer itself; ``RegistrationError`` after ``timeout`` seconds without one."""
        with trio.move_on_after(timeout):
            await self.ready.wait_ready()
            return
        raise RegistrationError(self.timeout_message())
