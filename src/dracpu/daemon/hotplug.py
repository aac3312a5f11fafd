"""CPU hotplug: the daemon follows CPUs taken offline and brought back.

Every ``interval`` seconds (one small sysfs read) the watcher compares the kernel's online
list with the last one. On a change it discovers the topology again (a CPU's topology files
are readable only while it is online) and then, in one step on the Trio thread:

- the state owner learns which allocatable CPUs are offline: claims keep theirs (the
  checkpoint keeps every claim), the shared pool loses or regains the rest
  (``SharedPoolChanged``), no new claim gets an offline CPU;
- the devices are built again and the ResourceSlices republished without offline CPUs;
- the health stream reports every device of a claim that holds an offline CPU UNHEALTHY,
  with the CPUs in its message, and HEALTHY again once they are back;
- ``dracpu_cpu_hotplug_events_total`` and ``dracpu_claims_on_offline_cpus`` follow.

``unhealthy_devices`` is the pure part.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import trio

from dracpu.allocation.store import ClaimRecord
from dracpu.cpuset import CPUSet
from dracpu.logs import get_logger
from dracpu.topology.discover import discover_from_root, read_online
from dracpu.topology.sysfs import SysfsReader, TopologyError

if TYPE_CHECKING:
    from dracpu.daemon.app import Daemon

__all__ = ["HotplugWatcher", "unhealthy_devices"]

log = get_logger("dracpu.hotplug")


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


class HotplugWatcher:
    """Polls the online CPUs and applies a change (see the module docstring)."""

    def __init__(self, daemon: Daemon, *, interval: float = 2.0) -> None:
        if interval <= 0:
            raise ValueError(f"hotplug check interval must be positive, got {interval}")
        self._daemon = daemon
        self.interval = interval
        assert daemon.topology is not None
        self.online = daemon.topology.online
        self.events = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        cfg = self._daemon.config
        reader = SysfsReader.with_overlay_file(cfg.sysfsRoot, cfg.sysfsOverlay or None)
        while True:
            await trio.sleep(self.interval)
            try:
                online = await trio.to_thread.run_sync(read_online, reader)
            except TopologyError as exc:
                log.warning("cannot read the online CPUs", err=exc)
                continue
            if online != self.online:
                await self._changed(online)

    async def _changed(self, online: CPUSet) -> None:
        daemon = self._daemon
        cfg = daemon.config
        try:
            topo = await trio.to_thread.run_sync(
                lambda: discover_from_root(
                    cfg.sysfsRoot,
                    overlay=cfg.sysfsOverlay or None,
                    expose_pcie_roots=cfg.exposePCIeRoots,
                )
            )
        except TopologyError as exc:
            log.warning("CPU hotplug: cannot discover the topology again", err=exc)
            return
        went, came = self.online - online, online - self.online
        self.online = online
        self.events += 1
        log.warning(
            "online CPUs changed",
            offline=went.format() or None,
            online=came.format() or None,
            nowOnline=online.format(),
        )
        daemon.apply_topology(topo)
        daemon.metrics.hotplug_events.inc()
        self.report_health()

    def report_health(self) -> None:
        """Health and the offline-claims gauge from the state owner's claims now."""
        daemon = self._daemon
        assert daemon.state is not None and daemon.kubelet is not None
        records = daemon.state.store.records()
        offline = daemon.state.store.offline
        marks = unhealthy_devices(records, offline)
        held = [d.device_name for r in records for d in r.devices]
        published = [d.name for d in daemon.inventory.devices] if daemon.inventory else []
        daemon.kubelet.health.set_devices(_union(published, held), marks)
        daemon.metrics.claims_on_offline_cpus.set(sum(1 for r in records if r.cpus & offline))
        for device, why in sorted(marks.items()):
            log.warning("device unhealthy", device=device, reason=why)


def _union(first: Iterable[str], second: Iterable[str]) -> list[str]:
    return list(dict.fromkeys([*first, *second]))
