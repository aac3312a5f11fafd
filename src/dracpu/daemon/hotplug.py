"""CPU hotplug: the daemon follows CPUs taken offline and brought back.

Every ``interval`` seconds (one small sysfs read) the watcher compares the kernel's online
list with the owner's (or, while a change it sent is not applied yet, with that change's:
each change is sent once). On a change it discovers the topology again (a CPU's topology files
are readable only while it is online) and sends one ``TopologyChanged`` on its channel; it
changes nothing itself. Whoever receives it (the daemon's ``follow_topology`` task) applies
it in one step on the Trio thread:

- the state owner (``NodeState.apply_topology``) plans with the new topology and learns
  which allocatable CPUs are offline: claims keep theirs (the checkpoint keeps every
  claim), the shared pool loses or regains the rest (``SharedPoolChanged``), no new claim
  gets an offline CPU;
- the devices are built again and the ResourceSlices republished without offline CPUs;
- ``report_health``: the health stream reports every device of a claim that holds an
  offline CPU UNHEALTHY, with the CPUs in its message, and HEALTHY again once they are
  back; ``dracpu_claims_on_offline_cpus`` follows.

``unhealthy_devices`` is the pure part.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import trio

from dracpu.allocation.store import ClaimRecord
from dracpu.cpuset import CPUSet
from dracpu.kubelet.health import HealthService
from dracpu.logs import get_logger
from dracpu.messages import TopologyChanged
from dracpu.metrics import DriverMetrics
from dracpu.state.view import NodeView
from dracpu.topology.discover import discover_from_root, read_online
from dracpu.topology.sysfs import SysfsReader, TopologyError

__all__ = ["HotplugWatcher", "SysfsSource", "report_health", "unhealthy_devices"]

log = get_logger("dracpu.hotplug")


class SysfsSource(msgspec.Struct, frozen=True, kw_only=True):
    """Where the topology is read from (the daemon's ``sysfsRoot``, ``sysfsOverlay`` and
    ``exposePCIeRoots``)."""

    root: str
    overlay: str = ""
    expose_pcie_roots: bool = False


def unhealthy_devices(records: Iterable[ClaimRecord], offline: CPUSet) -> dict[str, str]:
    """Device name -> why, for every device of a claim holding an offline CPU."""
    out: dict[str, str] = {}
    for record in records:
        lost = record.cpus & offline
        if not lost:
            continue
        who = f"{record.namespace}/{record.name}" if record.name else record.uid
        why = f"claim {who} holds CPU(s) {lost.format()}, which are offline"
        for device in record.devices:
            out[device.device_name] = why
    return out


def report_health(
    view: NodeView, published: Iterable[str], health: HealthService, metrics: DriverMetrics
) -> None:
    """Health and the offline-claims gauge from the state owner's claims now;
    ``published`` are the device names published now."""
    records = view.claims()
    offline = view.offline
    marks = unhealthy_devices(records, offline)
    held = [d.device_name for r in records for d in r.devices]
    health.set_devices(_union(published, held), marks)
    metrics.claims_on_offline_cpus.set(sum(1 for r in records if r.cpus & offline))
    for device, why in sorted(marks.items()):
        log.warning("device unhealthy", device=device, reason=why)


class HotplugWatcher:
    """Polls the online CPUs and sends each change (see the module docstring)."""

    def __init__(
        self,
        source: SysfsSource,
        view: NodeView,
        changes: trio.MemorySendChannel[TopologyChanged],
        *,
        interval: float = 2.0,
    ) -> None:
        """The online CPUs are compared with the owner's (``view.online``: their one
        holder); ``changes`` is where each change goes (a restarted watcher keeps sending
        there: each run holds a clone of it, so the receiver ends once the watcher stops
        for good and ``close`` was called)."""
        if interval <= 0:
            raise ValueError(f"hotplug check interval must be positive, got {interval}")
        self.source = source
        self.interval = interval
        self.events = 0
        self._view = view
        self._changes = changes
        # The online CPUs of the last change sent. The owner's change only once the
        # receiver applied it: until then a poll compares with this, or it would send
        # the same change again at every poll in between.
        self._last_sent: CPUSet | None = None
        # sysfs reads are abandoned on cancel; a thread left behind on a hung read keeps
        # this limiter's token, not one of Trio's shared pool (nursery/threads.py).
        self._reads = trio.CapacityLimiter(1)

    def _expected_online(self) -> CPUSet:
        """The online CPUs the owner will have once what was sent is applied."""
        owner = self._view.online
        if self._last_sent is not None and owner != self._last_sent:
            return self._last_sent  # a change sent and not applied yet
        return owner

    def close(self) -> None:
        """No run will send again: the receiver ends once every run's clone is closed."""
        self._changes.close()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with self._changes.clone() as out:
            task_status.started()
            src = self.source
            reader = SysfsReader.with_overlay_file(src.root, src.overlay or None)
            while True:
                await trio.sleep(self.interval)
                try:
                    # sysfs reads: abandoned on cancel, so a stop never waits for them.
                    online = await trio.to_thread.run_sync(
                        read_online, reader, abandon_on_cancel=True, limiter=self._reads
                    )
                except TopologyError as exc:
                    log.warning("cannot read the online CPUs", err=exc)
                    continue
                if online != self._expected_online():
                    await self._changed(online, out)

    async def _changed(self, online: CPUSet, out: trio.MemorySendChannel[TopologyChanged]) -> None:
        src = self.source
        try:
            topo = await trio.to_thread.run_sync(
                lambda: discover_from_root(
                    src.root,
                    overlay=src.overlay or None,
                    expose_pcie_roots=src.expose_pcie_roots,
                ),
                abandon_on_cancel=True,  # reads only, like the poll
                limiter=self._reads,
            )
        except TopologyError as exc:
            log.warning("CPU hotplug: cannot discover the topology again", err=exc)
            return
        # What changed since the owner's CPUs, or since the last change sent if the
        # receiver has not applied that one yet (they are applied in order).
        known = self._expected_online()
        went, came = known - online, online - known
        self.events += 1
        log.warning(
            "online CPUs changed",
            offline=went.format() or None,
            online=came.format() or None,
            nowOnline=online.format(),
        )
        await out.send(TopologyChanged(topology=topo, went=went.format(), came=came.format()))
        self._last_sent = online


def _union(first: Iterable[str], second: Iterable[str]) -> list[str]:
    return list(dict.fromkeys([*first, *second]))
