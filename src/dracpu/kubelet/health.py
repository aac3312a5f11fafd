"""The device health stream, ``NodeWatchResources`` (behavior.md §14; protocols.md §3.4).

Served on both health packages (``v1`` and ``v1alpha1``). A device is ``HEALTHY`` unless the
daemon marked it otherwise (a claim on it holds a CPU taken offline); a stream gets the
full report as soon as it opens, again whenever the device list or a device's health
changes, and every ``interval`` seconds from ``run()``'s loop so the kubelet never marks a
device Unknown. Each subscriber has a queue of ``queue_size`` reports; when a
slow subscriber's queue is full the report is dropped for it. When ``run()`` ends every
stream ends with status OK.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec
import trio
from grpclib.const import Handler

from dracpu.proto.health.v1 import api_grpc as v1_grpc
from dracpu.proto.health.v1 import api_pb2 as v1_pb
from dracpu.proto.health.v1alpha1 import api_grpc as v1alpha1_grpc
from dracpu.proto.health.v1alpha1 import api_pb2 as v1alpha1_pb

__all__ = ["HealthReport", "HealthService"]

log = logging.getLogger(__name__)

RESEND_INTERVAL = 10.0
HEALTH_CHECK_TIMEOUT_SECONDS = 20
QUEUE_SIZE = 4
HEALTHY_MESSAGE = "device initialized"


class HealthReport(msgspec.Struct, frozen=True, kw_only=True):
    """One full report: every device of the pool, observed at ``timestamp`` (unix s)."""

    pool_name: str
    devices: tuple[str, ...]
    timestamp: int
    unhealthy: tuple[tuple[str, str], ...] = ()  # (device, why), sorted


class HealthService:
    """Publishes full health reports to every open ``NodeWatchResources`` stream."""

    def __init__(
        self,
        *,
        node_name: str,
        devices: Iterable[str] = (),
        interval: float = RESEND_INTERVAL,
        queue_size: int = QUEUE_SIZE,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_name = node_name
        self.interval = interval
        self.queue_size = queue_size
        self._wall_clock = wall_clock
        self._devices = tuple(devices)
        self._unhealthy: dict[str, str] = {}
        self._subscribers: set[trio.MemorySendChannel[HealthReport]] = set()
        self._closed = False
        self.dropped = 0  # reports not queued because a subscriber's queue was full

    @property
    def devices(self) -> tuple[str, ...]:
        return self._devices

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def report(self) -> HealthReport:
        return HealthReport(
            pool_name=self.node_name,
            devices=self._devices,
            timestamp=int(self._wall_clock()),
            unhealthy=tuple(sorted(self._unhealthy.items())),
        )

    def set_devices(self, names: Iterable[str], unhealthy: Mapping[str, str] | None = None) -> None:
        """Replace the device list and which of them are unhealthy (device -> why); a
        change goes out to every stream at once."""
        names = tuple(names)
        marks = dict(unhealthy or {})
        if names == self._devices and marks == self._unhealthy:
            return
        self._devices = names
        self._unhealthy = marks
        self.publish()

    def publish(self) -> None:
        """Queue a full report for every subscriber; full queues drop it."""
        report = self.report()
        for channel in list(self._subscribers):
            try:
                channel.send_nowait(report)
            except trio.WouldBlock:
                self.dropped += 1
                log.debug("health report dropped for a slow subscriber")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.discard(channel)

    def close(self) -> None:
        """End every stream (status OK) and refuse new ones."""
        self._closed = True
        for channel in self._subscribers:
            channel.close()
        self._subscribers.clear()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Resend the full report every ``interval`` seconds until cancelled."""
        self._closed = False
        task_status.started()
        try:
            while True:
                await trio.sleep(self.interval)
                self.publish()
        finally:
            self.close()

    async def _watch(self, stream: Any, pb: Any) -> None:
        await stream.recv_message()
        if self._closed:
            return
        send, receive = trio.open_memory_channel[HealthReport](self.queue_size)
        self._subscribers.add(send)
        try:
            await stream.send_message(_message(pb, self.report()))
            async with receive:
                async for report in receive:
                    await stream.send_message(_message(pb, report))
        finally:
            self._subscribers.discard(send)
            send.close()

    def grpc_handlers(self) -> dict[str, Handler]:
        """``NodeWatchResources`` in both health packages."""
        return {**_HealthV1(self).__mapping__(), **_HealthV1alpha1(self).__mapping__()}


def _message(pb: Any, report: HealthReport) -> Any:
    unhealthy = dict(report.unhealthy)
    return pb.NodeWatchResourcesResponse(
        devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=report.pool_name, device_name=name),
                health=pb.UNHEALTHY if name in unhealthy else pb.HEALTHY,
                last_updated_time=report.timestamp,
                health_check_timeout_seconds=HEALTH_CHECK_TIMEOUT_SECONDS,
                message=unhealthy.get(name, HEALTHY_MESSAGE),
            )
            for name in report.devices
        ]
    )


class _HealthV1(v1_grpc.DRAResourceHealthBase):
    def __init__(self, service: HealthService) -> None:
        self._service = service

    async def NodeWatchResources(self, stream: Any) -> None:
        await self._service._watch(stream, v1_pb)


class _HealthV1alpha1(v1alpha1_grpc.DRAResourceHealthBase):
    def __init__(self, service: HealthService) -> None:
        self._service = service

    async def NodeWatchResources(self, stream: Any) -> None:
        await self._service._watch(stream, v1alpha1_pb)
