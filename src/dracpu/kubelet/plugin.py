"""The kubelet plugin: the DRA socket and the registration socket (behavior.md §7;
protocols.md §2.3).

``run()`` serves DRA v1, v1beta1 and both health packages on
``<root>/plugins/<driver>/dra.sock`` first, then registration on
``<root>/plugins_registry/<driver>-reg.sock`` (the kubelet may dial the DRA endpoint as soon
as registration succeeds), and reports started once both listen. Cancelling it ends the
health streams, drains in-flight calls and removes both socket files.
"""

from __future__ import annotations

import logging
import os
from functools import partial

import trio

from dracpu import DRIVER_NAME
from dracpu.cgroupfs.inotify import wait_for_removal
from dracpu.config import kubelet_paths_under
from dracpu.grpc import serve_unix
from dracpu.grpc.server import DEFAULT_GRACE_PERIOD
from dracpu.kubelet.dra import DRAService
from dracpu.kubelet.health import HealthService
from dracpu.kubelet.registration import RegistrationService

log = logging.getLogger(__name__)

__all__ = ["KubeletPlugin"]


def _make_dir(path: str) -> None:
    # serve_unix creates missing parents too, but through the umask; §7 wants exactly 0750.
    if not os.path.isdir(path):
        os.makedirs(path, mode=0o750, exist_ok=True)
        os.chmod(path, 0o750)


class KubeletPlugin:
    """Both kubelet-facing sockets of one driver under ``kubelet_root``."""

    def __init__(
        self,
        kubelet_root: str,
        dra: DRAService,
        health: HealthService,
        registration: RegistrationService | None = None,
        *,
        driver_name: str = DRIVER_NAME,
        grace_period: float = DEFAULT_GRACE_PERIOD,
    ) -> None:
        self.kubelet_root = kubelet_root
        paths = kubelet_paths_under(kubelet_root, driver_name)
        self.registrar_dir = paths.registrar_dir
        self.plugin_dir = paths.plugin_dir
        self.registration_socket = paths.registrar_socket
        self.dra_socket = paths.dra_socket
        self.dra = dra
        self.health = health
        self.registration = registration or RegistrationService(
            endpoint=self.dra_socket, driver_name=driver_name, registrar_dir=self.registrar_dir
        )
        self.grace_period = grace_period
        self.registration_recreated = 0

    async def _serve_registration(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Serve the registration socket, and bind it again whenever it disappears.

        The kubelet deregisters a plugin whose registration socket is removed (and wipes
        its ResourceSlices after a delay); it registers it again when the socket is
        created anew. A restarted kubelet keeps the directory and rediscovers sockets.
        """
        name = os.path.basename(self.registration_socket)
        started = False
        while True:
            _make_dir(self.registrar_dir)
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    partial(
                        serve_unix,
                        self.registration_socket,
                        self.registration.grpc_handlers(),
                        grace_period=self.grace_period,
                    )
                )
                if not started:
                    task_status.started()
                    started = True
                await wait_for_removal(self.registrar_dir, name)
                log.warning(
                    "registration socket %s was removed: creating it again",
                    self.registration_socket,
                )
                self.registration_recreated += 1
                nursery.cancel_scope.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``ServerError`` when a socket cannot be created."""
        _make_dir(self.plugin_dir)
        _make_dir(self.registrar_dir)
        dra_handlers = {**self.dra.grpc_handlers(), **self.health.grpc_handlers()}
        async with trio.open_nursery() as nursery:
            await nursery.start(self.health.run)
            await nursery.start(
                partial(serve_unix, self.dra_socket, dra_handlers, grace_period=self.grace_period)
            )
            await nursery.start(self._serve_registration)
            task_status.started()
