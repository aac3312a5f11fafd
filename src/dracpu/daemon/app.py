"""`dracpu run`: the services of one node, started in order under the root supervisor.

Start order (ARCHITECTURE.md): HTTP endpoints (so ``/healthz`` says 503 while starting) →
topology and devices → state restore (checkpoint + CDI specs) → the kubelet sockets and the
NRI session side by side, neither waiting for the other, with the one cgroupfs writer task
and the drift watcher beside them → ResourceSlice publication. ``/readyz`` turns ready once the
kubelet registered the plugin, the runtime synchronized and the slices are published.

The allocation state has one owner, ``NodeState`` (``dracpu.state``). The kubelet service
and the NRI plugin change it through its methods; what changed reaches the other services
as messages: ``ClaimsChanged`` to the checkpoint writer, ``SharedPoolChanged`` to the pool
pusher, ``VerifyCpusets`` (with the runtime's ``CpusetUpdateFailed``) from the pool pusher
and the NRI session to the cgroupfs writer (docs/dev/architecture.md draws each channel).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

import trio
from prometheus_client import CollectorRegistry

from dracpu.allocation.floor import SharedFloor, shared_floor, unpublished_cpus
from dracpu.allocation.store import AllocationStore
from dracpu.cgroupfs.watcher import DriftWatcher
from dracpu.cgroupfs.writer import CgroupWriter
from dracpu.config import DriverConfig, config_fingerprint, kubelet_paths, parse_reserved_cpus
from dracpu.cpuset import CPUSet
from dracpu.daemon.hotplug import HotplugWatcher, SysfsSource, report_health
from dracpu.daemon.recovery import RecoveryPlan
from dracpu.daemon.views import DaemonView
from dracpu.devices import DeviceInventory, DeviceSettings, build_inventory, build_slices
from dracpu.http.address import parse_bind_address
from dracpu.http.app import HTTPApp
from dracpu.http.server import serve_http
from dracpu.irq import IrqIsolation
from dracpu.irq.metrics import IrqMetrics
from dracpu.k8s.claim_status import ClaimStatusWriter
from dracpu.k8s.client import K8sError, KubeClient
from dracpu.k8s.nodes import get_node_uid
from dracpu.k8s.slices import NOT_PUBLISHED, SliceReconciler
from dracpu.kubelet.claims import ApiClaimSource
from dracpu.kubelet.dra import DRAService
from dracpu.kubelet.health import HealthService
from dracpu.kubelet.metadata_proc import MetadataProcess
from dracpu.kubelet.plugin import KubeletPlugin
from dracpu.kubelet.registration import WAITING_REASON, RegistrationService
from dracpu.logs import get_logger
from dracpu.messages import TopologyChanged
from dracpu.metrics import DriverMetrics
from dracpu.nri.plugin import NRIPlugin
from dracpu.nri.pusher import PoolPusher
from dracpu.nri.session import NOT_CONNECTED, NRISession
from dracpu.nursery.backoff import restart_delay
from dracpu.nursery.readiness import ReadyFlag
from dracpu.nursery.supervisor import Service, Supervisor
from dracpu.state import CheckpointFile, NodeState, read_boot_id
from dracpu.state.durable import recorded_claim_cpus
from dracpu.topology.discover import discover_from_root
from dracpu.topology.model import Topology

__all__ = ["Daemon", "DaemonError"]

log = get_logger("dracpu.daemon")
T = TypeVar("T")

READY_REGISTRATION = "kubelet-registration"
READY_NRI = "nri"
READY_SLICES = "slices"
# How long to wait for the kubelet's registration before saying so in the log (§7).
REGISTRATION_WAIT = 30.0
# Shorter than the supervisor's 5 s so a draining gRPC server is never abandoned.
GRPC_GRACE = 4.0


class DaemonError(Exception):
    """The daemon cannot start; the message says which step failed and why."""


class Daemon:
    """One node's driver. The constructor does no I/O; ``startup`` does it all."""

    def __init__(
        self,
        config: DriverConfig,
        *,
        kube: KubeClient,
        node_name: str,
        proc_root: str = "/proc",
        registry: CollectorRegistry | None = None,
        drift_interval: float = 10.0,
        slice_resync: float = 30.0,
        hotplug_interval: float = 2.0,
    ) -> None:
        self.config = config
        self.kube = kube
        self.node_name = node_name
        self.proc_root = proc_root
        self.registry = registry or CollectorRegistry()
        self.metrics = DriverMetrics(self.registry)
        # The claims' status.devices, written beside prepares (k8s/claim_status.py)
        # from the owner's claim events (subscribed once the state exists).
        self.claim_status = ClaimStatusWriter(
            kube,
            node_name=node_name,
            topology=lambda: self.topology,
            count=self.metrics.count_claim_status_write,
            enabled=config.claimStatus,
        )
        self.drift_interval = drift_interval
        self.slice_resync = slice_resync
        self.supervisor: Supervisor | None = None
        self.topology: Topology | None = None
        self.inventory: DeviceInventory | None = None
        self.state: NodeState | None = None
        self.checkpoint: CheckpointFile | None = None
        self.recovery: RecoveryPlan | None = None
        self.kubelet: KubeletPlugin | None = None
        self.session: NRISession | None = None
        self.plugin: NRIPlugin | None = None
        self.writer: CgroupWriter | None = None
        self.watcher: DriftWatcher | None = None
        self.floor = SharedFloor(cpus=CPUSet(), kept=False)
        self.slices: SliceReconciler | None = None
        self.node_uid = ""
        self.hotplug_interval = hotplug_interval
        self.hotplug: HotplugWatcher | None = None
        self.nothing_to_publish = False
        # Device interrupts kept off claims' CPUs (dracpu.irq), built with the state.
        self.irq: IrqIsolation | None = None
        self.http_port: int | None = None
        self.debug_port: int | None = None
        # Built in startup, around the supervisor's readiness (the daemon's one source).
        self.main_app: HTTPApp | None = None
        self._ready: dict[str, ReadyFlag] = {}
        self.view = DaemonView(self)

    # -- start-up -----------------------------------------------------------------------

    def _unpublished(self, topo: Topology, reserved: CPUSet) -> CPUSet:
        return unpublished_cpus(
            topo, reserved, self.floor, publish_isolated=self.config.publishIsolatedCPUs
        )

    def _device_settings(self, topo: Topology, reserved: CPUSet) -> DeviceSettings:
        cfg = self.config
        return DeviceSettings(
            mode=cfg.cpuDeviceMode,  # type: ignore[arg-type]
            group_by=cfg.groupBy,  # type: ignore[arg-type]
            reserved=self._unpublished(topo, reserved),
            expose_pcie_roots=cfg.exposePCIeRoots,
            publish_node_allocatable=cfg.publishNodeAllocatableResourceMapping,
        )

    def apply_topology(self, topo: Topology) -> None:
        """The topology after CPU hotplug (daemon/hotplug.py): devices, slices, what the
        DRA service plans with, and the offline CPUs for the state owner. No await."""
        assert self.state is not None
        reserved = parse_reserved_cpus(self.config)
        inventory = build_inventory(topo, self._device_settings(topo, reserved))
        self.topology, self.inventory = topo, inventory
        # What prepare plans with and the online CPUs live in the owner.
        self.state.apply_topology(topo, inventory)
        if self.slices is not None and self.node_uid:
            self.slices.set_desired(self._desired_slices())

    async def _follow_topology(
        self,
        changes: trio.MemoryReceiveChannel[TopologyChanged],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Apply each ``TopologyChanged`` the hotplug watcher sends; ends when it stops."""
        task_status.started()
        async for change in changes:
            self.apply_topology(change.topology)
            self.metrics.hotplug_events.inc()
            self._report_health()

    def _report_health(self) -> None:
        assert self.state is not None and self.kubelet is not None
        published = [d.name for d in self.inventory.devices] if self.inventory else []
        report_health(self.state.view, published, self.kubelet.health, self.metrics)

    def _desired_slices(self) -> list[dict[str, Any]]:
        assert self.inventory is not None
        return build_slices(
            self.inventory,
            node_name=self.node_name,
            node_uid=self.node_uid,
            expose_pcie_roots=self.config.exposePCIeRoots,
        )

    def _build_node(self) -> None:
        """Topology, devices and the allocation store (blocking: reads sysfs)."""
        cfg = self.config
        try:
            reserved = parse_reserved_cpus(cfg)
            topo = discover_from_root(
                cfg.sysfsRoot,
                overlay=cfg.sysfsOverlay or None,
                expose_pcie_roots=cfg.exposePCIeRoots,
            )
        except Exception as exc:
            raise DaemonError(f"driver failed to initialize: {exc}") from exc
        if not topo.cpus:
            raise DaemonError("driver failed to initialize: no CPU topology discovered")
        # Fixed for the life of the process, as the allocatable set is: hotplug takes floor
        # CPUs offline (the pool shrinks) but never moves the floor onto claimable CPUs.
        self.floor = shared_floor(
            topo, reserved, held=recorded_claim_cpus(cfg.stateDir, cfg.cdiDir)
        )
        try:
            inventory = build_inventory(topo, self._device_settings(topo, reserved))
        except Exception as exc:
            raise DaemonError(f"driver failed to initialize: {exc}") from exc
        self.topology = topo
        self.inventory = inventory
        # Present CPUs that are offline stay allocatable (a restored claim keeps them; they
        # are offline for the state owner until they come back).
        allocatable = (topo.all_cpus | (topo.present - topo.online)) - self._unpublished(
            topo, reserved
        )
        store = AllocationStore(
            allocatable, reserved, isolated=topo.isolated, floor=self.floor.cpus
        )

        def mems_of(cpus: CPUSet) -> str:
            return CPUSet(topo.cpus[c].numa for c in cpus if c in topo.cpus).format()

        self.state = NodeState(
            store, metrics=self.metrics, mems_of=mems_of if cfg.alignMemory else None
        )
        self.checkpoint = CheckpointFile(
            self.state,
            cfg.stateDir,
            boot_id=read_boot_id(self.proc_root),
            config_fingerprint=config_fingerprint(cfg),
        )
        view = self.state.view
        self.irq = IrqIsolation(
            self.proc_root,
            cfg.stateDir,
            boot_id=self.checkpoint.boot_id,
            # The prepared claims, and the online CPUs every mask must keep one of (a
            # hotplug change wakes a pass): read from the owner's view (irq/service.py).
            view=view,
            isolate_all=cfg.isolateIRQs,
            metrics=IrqMetrics(self.registry),
        )
        log.info(
            "discovered CPU topology",
            cpus=topo.num_cpus,
            sockets=topo.num_sockets,
            numaNodes=topo.num_numa_nodes,
            devices=len(inventory.devices),
            reserved=reserved.format(),
        )
        log.info(self.floor.describe())

    def _restore(self) -> None:
        assert self.checkpoint is not None and self.state is not None
        assert self.topology is not None
        try:
            self.recovery = self.checkpoint.restore(self.config.cdiDir)
            self.state.set_offline(self.topology.present - self.topology.online)
        except Exception as exc:
            raise DaemonError(f"driver failed to restore its state: {exc}") from exc

    async def startup(self, sup: Supervisor) -> None:
        """Start every service in order; ``run_daemon(daemon.startup)`` runs the daemon."""
        self.supervisor = sup
        cfg = self.config
        try:
            host, port = parse_bind_address(cfg.bindAddress)
            debug_host, debug_port = parse_bind_address(cfg.debugAddress)
        except ValueError as exc:
            raise DaemonError(str(exc)) from exc
        # Services report ready through the supervisor: each holds its component's flag.
        readiness = sup.readiness
        self._ready = {
            READY_REGISTRATION: readiness.declare(READY_REGISTRATION, WAITING_REASON),
            READY_NRI: readiness.declare(READY_NRI, NOT_CONNECTED),
            READY_SLICES: readiness.declare(READY_SLICES, NOT_PUBLISHED),
        }
        self.main_app = HTTPApp(registry=self.registry, readiness=readiness.view())
        self.http_port = await sup.start(
            Service(name="http", run=partial(serve_http, host, port, self.main_app))
        )
        debug_app = HTTPApp.debug_only(self.view)
        self.debug_port = await sup.start(
            Service(name="debug-http", run=partial(serve_http, debug_host, debug_port, debug_app))
        )
        log.info("serving HTTP", bindAddress=cfg.bindAddress, port=self.http_port)

        # Start-up's blocking steps run in worker threads abandoned on cancel, so a SIGTERM
        # during start-up never waits for a hung sysfs or procfs read. Each may be cut
        # short: discovery and the hierarchy check only read, and the restore writes whole
        # files (CDI specs, the checkpoint: atomic renames) and removes orphans, all of it
        # planned again from the same files by the next start.
        async with trio.open_nursery() as nursery:
            # The resource.k8s.io API module takes ~0.1 s to import and build: beside the
            # topology discovery, not on the path of the first NodePrepareResources (its
            # claim GET) or the first slice.
            nursery.start_soon(partial(_in_thread, lambda: self.kube.resource))
            await _in_thread(self._build_node)
        await _in_thread(self._restore)
        assert self.state is not None and self.checkpoint is not None
        # Prepares and unprepares wait for the checkpoint writer: it runs before them.
        await sup.start(
            Service(
                name="checkpoint",
                run=partial(self.checkpoint.run, self.state.claims_changes()),
            )
        )
        # The owner's publishing lifetime. Services stop last started first: this one
        # stops after everything that changes the state or reads its channels and before
        # the checkpoint writer, and closes the owner's channels as it stops, so the
        # writer answers what is queued and ends on its own, as does any other receiver.
        await sup.start(Service(name="state", run=self.state.publishing))
        self._build_services()
        assert self.kubelet and self.plugin and self.session and self.writer and self.watcher
        problem = await _in_thread(self.writer.find_hierarchy)
        if problem:
            log.warning(
                "cpusets cannot be verified or repaired: the cgroupfs writer and the drift "
                "watcher stay idle until the hierarchy appears",
                err=problem,
            )
        # Bounded: the watcher waits while one change is being applied (it polls anyway).
        topology_out, topology_in = trio.open_memory_channel[TopologyChanged](1)
        source = SysfsSource(
            root=cfg.sysfsRoot, overlay=cfg.sysfsOverlay, expose_pcie_roots=cfg.exposePCIeRoots
        )
        self.hotplug = HotplugWatcher(
            source, self.state.view, topology_out, interval=self.hotplug_interval
        )
        self._report_health()  # claims restored with offline CPUs
        assert self.irq is not None
        pusher = PoolPusher(
            self.state.pool_changes(),
            self.plugin,
            self.session,
            verify=self.writer.inbox(),
            writer=self.writer,
            watcher=self.watcher,
        )
        services = [
            Service(name="kubelet", run=self.kubelet.run),
            Service(
                name="registration",
                run=partial(self.kubelet.registration.report_until_registered, REGISTRATION_WAIT),
            ),
            Service(name="nri", run=self.session.run),
            # The one cgroupfs writer: the runtime's failures, the passes, drift repairs.
            Service(name="cgroup-writer", run=partial(self.writer.run, self.state.view)),
            Service(name="drift", run=self.watcher.run),
            Service(name="pool", run=pusher.run),
            Service(name="hotplug", run=self.hotplug.run),
            # After the restore: its first pass bans what the restored claims ask for and
            # gives back what a crash left banned.
            Service(name="irq", run=partial(self.irq.run, self.state.claim_events())),
            Service(name="topology", run=partial(self._follow_topology, topology_in)),
            # Writes claims' status.devices from the owner's events, repeats included.
            Service(
                name="claim-status",
                run=partial(self.claim_status.run, self.state.claim_events(repeated_prepares=True)),
            ),
        ]
        writer = self.kubelet.dra.metadata_process
        if writer is not None:
            # Writes device metadata and deletes what unprepares set aside. Started before
            # the kubelet's sockets, so it stops after them: a prepare or unprepare still
            # running at a stop gets its metadata written or removed. Its grace covers the
            # writer's own STOP_TIMEOUT.
            await sup.start(Service(name="metadata-writer", run=writer.run, grace_period=10.0))
        # Kubelet sockets and NRI side by side: neither waits for the other.
        async with trio.open_nursery() as nursery:
            for service in services:
                nursery.start_soon(sup.start, service)
        await sup.start(Service(name="slices", run=self._run_slices))
        assert self.main_app is not None
        self.main_app.mark_started()
        log.info("driver started", node=self.node_name)

    def _build_services(self) -> None:
        """The kubelet plugin, the NRI plugin and session, the cgroupfs writer and watcher."""
        cfg = self.config
        state, topo, inventory = self.state, self.topology, self.inventory
        assert state is not None and topo is not None and inventory is not None
        paths = kubelet_paths(cfg)
        dra = DRAService(
            claims=ApiClaimSource(self.kube, pool=self.node_name),
            state=state,
            inventory=inventory,
            topology=topo,
            online=topo.online,
            cdi_dir=cfg.cdiDir,
            metrics=self.metrics,
            node_name=self.node_name,
            # Device metadata for the workload, as upstream's kubelet-plugin helper writes;
            # its files are written by a process of their own (kubelet/metadata_proc.py).
            plugin_data_dir=paths.plugin_dir,
            metadata_process=MetadataProcess(paths.plugin_dir),
        )
        health = HealthService(
            node_name=self.node_name, devices=[d.name for d in inventory.devices]
        )
        registration = RegistrationService(
            endpoint=paths.dra_socket,
            registrar_dir=paths.registrar_dir,
            ready=self._ready[READY_REGISTRATION],
        )
        self.kubelet = KubeletPlugin(
            cfg.kubeletRootDir, dra, health, registration, grace_period=GRPC_GRACE
        )
        self.writer = CgroupWriter(cfg.cgroupRoot, metrics=self.metrics)
        self.plugin = NRIPlugin(state)
        self.session = NRISession(
            cfg.nriSocket,
            self.plugin,
            ready=self._ready[READY_NRI],
            cdi_dir=cfg.cdiDir,
            verify=self.writer.inbox(),
            metrics=self.metrics,
        )
        self.watcher = DriftWatcher(
            self.writer, state.view, interval=self.drift_interval, metrics=self.metrics
        )

    # -- long-lived glue tasks ----------------------------------------------------------

    async def _run_slices(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Find the Node's UID for the owner reference, then keep the slices converged."""
        assert self.inventory is not None
        task_status.started()
        failures = 0
        while True:
            try:
                node_uid = await get_node_uid(self.kube, self.node_name)
                break
            except K8sError as exc:
                log.warning("cannot read the Node object yet", node=self.node_name, err=exc)
                failures += 1
                await trio.sleep(
                    restart_delay(
                        failures, initial=0.5, factor=2.0, cap=30.0, jitter=0.5, rand=random.random
                    )
                )
        self.node_uid = node_uid
        desired = self._desired_slices()
        if not desired:
            # As upstream: no devices, nothing published, and slices left by an earlier
            # run stay (a reconciler with nothing desired would delete them).
            log.warning("no devices to publish: every CPU is reserved or none was discovered")
            self.nothing_to_publish = True
            self._ready[READY_SLICES].set_ready()
            await trio.sleep_forever()
        self.slices = SliceReconciler(
            self.kube,
            node_name=self.node_name,
            desired=desired,
            resync_interval=self.slice_resync if self.slice_resync > 0 else math.inf,
            ready=self._ready[READY_SLICES],
        )
        await self.slices.run()


async def _in_thread(fn: Callable[[], T]) -> T:
    """``fn()`` in a worker thread, abandoned if the caller is cancelled."""
    return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


def claims_of_state(doc: Mapping[str, Any]) -> dict[str, CPUSet]:
    """``ns/name`` (or UID) -> CPUs from a ``/debug/state`` document."""
    out: dict[str, CPUSet] = {}
    for claim in doc.get("claims") or []:
        label = f"{claim['namespace']}/{claim['name']}" if claim.get("name") else claim["uid"]
        out[label] = CPUSet.parse(claim["cpus"])
    return out
