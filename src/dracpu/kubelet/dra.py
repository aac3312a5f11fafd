"""The DRA kubelet service: NodePrepareResources / NodeUnprepareResources (behavior.md §7,
§8, §10, §11; protocols.md §3).

``DRAService.prepare`` and ``unprepare`` are protocol-independent; ``grpc_handlers()``
serves them on both DRA API versions (v1 and v1beta1) from the generated ``__mapping__()``.

Prepare reads every claim first (outside the lock, as the Go helper does), then hands each
to the state owner, which runs it as one transaction (``NodeState.prepare``: plan, reserve
as pending, CDI spec, checkpoint, commit or undo; ``dracpu.state.claims``). This service
injects what the transaction needs from it (``ClaimSteps``: one call per claim, one lock
for planning and the spec, a shield for the commit, and the spec and metadata file I/O),
then turns the outcome into the reply: devices, CDI ids, device metadata, logs and
metrics. Unprepare likewise (``NodeState.unprepare``).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import msgspec
import trio
from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError

from dracpu import DRIVER_NAME
from dracpu.allocation.prepare import ClaimAllocation, ClaimPlan, DeviceNames
from dracpu.cdi import cdi_device_id, on_memory_filesystem, remove_claim_spec, write_claim_spec
from dracpu.cpuset import CPUSet
from dracpu.grpc.framing import MAX_MESSAGE_SIZE
from dracpu.k8s.claims import ClaimReadError
from dracpu.k8s.names import shorten
from dracpu.kubelet._aio import Serializer
from dracpu.kubelet.claims import ClaimSource
from dracpu.kubelet.metadata import (
    DeviceAttributes,
    MetadataPurger,
    metadata_files,
    remove_metadata_files,
    remove_metadata_specs,
    write_claim_files,
    write_metadata_specs,
)
from dracpu.kubelet.metadata_proc import MetadataProcess
from dracpu.kubelet.metadata_tree import SpareDirs
from dracpu.logs import operation
from dracpu.metrics import DriverMetrics
from dracpu.proto.dra.v1 import api_grpc as v1_grpc
from dracpu.proto.dra.v1 import api_pb2 as v1_pb
from dracpu.proto.dra.v1beta1 import api_grpc as v1beta1_grpc
from dracpu.proto.dra.v1beta1 import api_pb2 as v1beta1_pb
from dracpu.state.owner import NodeState
from dracpu.threadbatch import ThreadBatcher
from dracpu.topology.model import Topology

__all__ = [
    "MAX_CLAIMS_PER_CALL",
    "SMALLEST_KUBELET_CLAIM_BYTES",
    "ClaimPrepareResult",
    "ClaimRef",
    "ClaimUnprepareResult",
    "DRAService",
    "PreparedDeviceReply",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

# The most claims a kubelet can legally send in one call. It sends one NodePrepareResources
# (and one NodeUnprepareResources) per pod and driver, holding every claim of that pod with
# a result of this driver that is not prepared yet (kubernetes/kubernetes
# pkg/kubelet/cm/dra/manager.go, prepareResources: `batches[plugin]`, one RPC per plugin;
# unprepareResources likewise); it never batches pods. A pod's claims are its
# spec.resourceClaims entries, one claim each (an entry naming a ResourceClaimTemplate
# stands for the one claim generated from it, status.resourceClaimStatuses), plus at most
# one claim for DRA-backed extended resources (status.extendedResourceClaimStatus, appended
# when DRAExtendedResource is on). The API sets no bound on how many entries a pod has
# (pkg/apis/core/validation/validation.go, validatePodResourceClaims: each name a unique
# DNS label, exactly one of resourceClaimName / resourceClaimTemplateName, nothing on the
# length; two entries may even name the same claim, and the kubelet then sends it twice).
# So the only bound is the size of the request, and the kubelet's gRPC client sets no send
# limit: the request ends at our MAX_MESSAGE_SIZE (grpc-go's default receive limit, which
# upstream drivers serve with). The smallest claim a kubelet builds is 46 bytes on the wire
# (a 36-character UID, a namespace and a name of one character each, field tags and
# lengths), so no request we accept from a kubelet holds more claims than this. The count
# is still checked first, so a hostile call of smaller claims is refused before any claim
# is read; each claim takes the prepare lock on its own, so a long call does not hold it.
SMALLEST_KUBELET_CLAIM_BYTES = 46
MAX_CLAIMS_PER_CALL = MAX_MESSAGE_SIZE // SMALLEST_KUBELET_CLAIM_BYTES  # 91,180


class ClaimRef(msgspec.Struct, frozen=True, kw_only=True):
    """A claim as the kubelet names it in a request."""

    namespace: str
    name: str
    uid: str


class PreparedDeviceReply(msgspec.Struct, frozen=True, kw_only=True):
    """One device of a prepare reply (protocols.md §3.2 ``Device``)."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str = ""


class ClaimPrepareResult(msgspec.Struct, frozen=True, kw_only=True):
    """Devices of a prepared claim, or ``error`` (then ``devices`` is empty)."""

    devices: tuple[PreparedDeviceReply, ...] = ()
    error: str = ""


class ClaimUnprepareResult(msgspec.Struct, frozen=True, kw_only=True):
    error: str = ""


def _base_request(request: str) -> str:
    # The reply names the request, not the sub-request (protocols.md §3.2).
    return request.split("/", 1)[0]


def _reply_devices(claim: ClaimAllocation, plan: ClaimPlan) -> tuple[PreparedDeviceReply, ...]:
    ours = [r for r in claim.results if r.driver == DRIVER_NAME]
    ids = (cdi_device_id(claim.uid),)
    devices = []
    # plan.devices has one entry per result of ours, in order (§8.5 step 2).
    for index, device in enumerate(plan.devices):
        share_id = ours[index].share_id if index < len(ours) else ""
        devices.append(
            PreparedDeviceReply(
                request_names=tuple(_base_request(r) for r in device.request_names),
                pool_name=device.pool_name,
                device_name=device.device_name,
                cdi_device_ids=ids,
                share_id=share_id,
            )
        )
    return tuple(devices)


class DRAService:
    """Prepare and unprepare, serialized; see the module docstring for the order of work."""

    def __init__(
        self,
        *,
        claims: ClaimSource,
        state: NodeState,
        inventory: DeviceNames,
        topology: Topology,
        online: CPUSet,
        cdi_dir: str,
        metrics: DriverMetrics,
        node_name: str,
        offload_io: bool | None = None,
        plugin_data_dir: str | None = None,
        metadata_process: MetadataProcess | None = None,
        serial: Serializer | None = None,
    ) -> None:
        self.claims = claims
        self.state = state
        # The owner plans with these (and takes later ones from CPU hotplug).
        state.use_topology(topology, inventory, online)
        self.cdi_dir = cdi_dir
        self.metrics = metrics
        self.node_name = node_name
        # The lock, worker threads and shield the calls run under (Trio's by default).
        self._serial = serial or Serializer()
        # None: decided at the first write, in a worker thread unless on tmpfs.
        self._offload_io = offload_io
        # Device metadata (§10.3) is written when the plugin's data dir is given.
        self.plugin_data_dir = plugin_data_dir
        # Like _offload_io, for metadata files: a caller's choice holds for them too.
        self._metadata_offload = offload_io
        # Metadata batches take their worker thread from a limiter of their own (one: one
        # batch runs at a time), never from Trio's default pool: threads abandoned there by
        # others (a hung cgroupfs or sysfs read) would hold every token, and every prepare
        # and unprepare would wait for a batch forever (kubelet/_aio.py: the same reason).
        self._metadata_batches = ThreadBatcher(limiter=trio.CapacityLimiter(1))
        # With a writer process (`dracpu run`), the metadata file steps and the spare
        # trees are the process's (metadata_proc.py); without one, a worker thread's, and
        # the purger deletes what unprepares set aside (`dracpu run` would run it as a
        # service). Never both: each would take the other's spares for its own.
        self.metadata_process = metadata_process if plugin_data_dir is not None else None
        self.metadata_purger = (
            MetadataPurger(plugin_data_dir)
            if plugin_data_dir is not None and self.metadata_process is None
            else None
        )

    async def _file_io(self, fn: Callable[..., object], *args: object) -> None:
        await self._file_io_result(fn, *args)

    async def _file_io_result(self, fn: Callable[..., T], *args: object) -> T:
        """Spec file I/O: inline on tmpfs (cheaper than a thread hop), else in a thread."""
        return await self._serial.run_blocking(fn, *args, inline=not self._on_disk())

    def _on_disk(self) -> bool:
        if self._offload_io is None:
            self._offload_io = not on_memory_filesystem(self.cdi_dir)
        return self._offload_io

    # -- ClaimSteps: what the owner's transactions need from this service ---------------
    def claim_turn(self, claim_uid: str) -> AbstractAsyncContextManager[None]:
        return self._serial.claim_turn(claim_uid)

    def lock(self) -> AbstractAsyncContextManager[Any]:
        return self._serial.lock()

    def commit_scope(self) -> trio.CancelScope:
        return self._serial.commit_scope()

    async def write_spec(self, claim_uid: str, cpus: CPUSet) -> None:
        # On tmpfs (/var/run/cdi on real nodes) an fsync keeps nothing that a crash of
        # dracpu could lose, and the rename is atomic either way: skip them there.
        write = functools.partial(write_claim_spec, durable=self._on_disk())
        await self._file_io(write, self.cdi_dir, claim_uid, cpus)

    async def remove_spec(self, claim_uid: str) -> None:
        remove = functools.partial(remove_claim_spec, durable=self._on_disk())
        await self._file_io(remove, self.cdi_dir, claim_uid)

    def _metadata_inline(self) -> bool:
        """Metadata files go to the plugin's data dir (on disk on real nodes, fsynced) as
        well as the CDI dir: inline only when both are on memory filesystems, so a disk's
        fsync never blocks the event loop (unless the caller chose ``offload_io``)."""
        if self._metadata_offload is None:
            assert self.plugin_data_dir is not None
            self._metadata_offload = self._on_disk() or not on_memory_filesystem(
                self.plugin_data_dir
            )
        return not self._metadata_offload

    async def _metadata_io(self, fn: Callable[..., T], *args: object) -> T:
        if self._metadata_inline():
            return fn(*args)
        # Calls of claims prepared or unprepared together share one worker-thread hop.
        return await self._metadata_batches.run(fn, *args)

    @property
    def _spares(self) -> SpareDirs | None:
        return self.metadata_purger.spares if self.metadata_purger is not None else None

    async def remove_metadata(self, namespace: str, name: str, claim_uid: str) -> None:
        if self.plugin_data_dir is None:
            return
        # The claim's directory is set aside at once, as a spare for a later prepare; the
        # purge deletes what is not kept, in the background.
        if self.metadata_process is not None:
            await self.metadata_process.remove(
                self.plugin_data_dir, self.cdi_dir, namespace, name, claim_uid
            )
            return
        remove = functools.partial(remove_metadata_files, purge=False, spares=self._spares)
        await self._metadata_io(remove, self.plugin_data_dir, namespace, name, claim_uid)
        await self._file_io(remove_metadata_specs, self.cdi_dir, claim_uid)
        if self.metadata_purger is not None:
            self.metadata_purger.soon()

    # -- prepare ------------------------------------------------------------------------
    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimPrepareResult]:
        """Prepare every claim; the result holds exactly the requested UIDs.

        Raises ``ClaimReadError`` (the whole call fails, §7 step 1) when a claim cannot be
        read, is not allocated, or was replaced; nothing is changed then.
        """
        with operation("preparing resource claims", v=4, claims=len(claims)):
            # A pod may name one claim twice (the kubelet then sends it twice): read it once.
            fetched: dict[ClaimRef, ClaimAllocation] = {}
            for c in claims:
                if c not in fetched:
                    fetched[c] = await self.claims.get(c.namespace, c.name, c.uid)
            results: dict[str, ClaimPrepareResult] = {}
            for ref in claims:
                started = time.perf_counter()
                result = await self._prepare_claim(fetched[ref])
                self.metrics.prepare_duration.observe(time.perf_counter() - started)
                self.metrics.count_prepare("error" if result.error else "success")
                results[ref.uid] = result
            return results

    async def _prepare_claim(self, claim: ClaimAllocation) -> ClaimPrepareResult:
        """One claim, as the owner's transaction; then the reply, logs and metadata."""
        where = f"{claim.namespace}/{claim.name}"
        outcome = await self.state.prepare(claim, self)
        if outcome.error:
            # A refused reservation is the store's own overlap check: not logged, as before.
            if outcome.failed_at != "reserve":
                log.info("prepare of claim %s failed: %s", where, outcome.error)
            return ClaimPrepareResult(error=outcome.error)
        plan = outcome.plan
        if plan is None or plan.is_empty:
            return ClaimPrepareResult()
        if outcome.new:
            log.info(
                "reserved allocation for resource claim claim=%s uid=%s cpus=%s",
                where,
                claim.uid,
                plan.cpus,
            )
            self.metrics.claim_allocated_cpus.observe(len(plan.cpus))
        devices = _reply_devices(claim, plan)
        if self.plugin_data_dir is not None:
            devices = await self._with_metadata(claim, plan, devices)
        return ClaimPrepareResult(devices=devices)

    async def _with_metadata(
        self, claim: ClaimAllocation, plan: ClaimPlan, devices: tuple[PreparedDeviceReply, ...]
    ) -> tuple[PreparedDeviceReply, ...]:
        """Write the device metadata (§10.3); its CDI id goes on each request's first device."""
        assert self.plugin_data_dir is not None
        planned_with = self.state.inventory
        inventory = planned_with if isinstance(planned_with, DeviceAttributes) else None
        claim_dir, files = metadata_files(self.plugin_data_dir, claim, plan.devices, inventory)
        if not files:
            return devices
        # The metadata file and its CDI spec are like the claim's: no fsyncs on tmpfs. Both
        # are written by the writer process; without one, the files on disk in a worker
        # thread and the spec where the claim's is.
        durable = self._on_disk()
        if self.metadata_process is not None:
            ids = await self.metadata_process.write(
                claim, claim_dir, files, self.cdi_dir, durable=durable
            )
        else:
            write = functools.partial(write_claim_files, durable=durable, spares=self._spares)
            written = await self._metadata_io(write, claim, claim_dir, files)
            specs = functools.partial(write_metadata_specs, durable=durable)
            ids = await self._file_io_result(specs, self.cdi_dir, claim, claim_dir, written)
        out = list(devices)
        for request, cdi_id in ids.items():
            for index, device in enumerate(out):
                if request in device.request_names:
                    out[index] = msgspec.structs.replace(
                        device, cdi_device_ids=(*device.cdi_device_ids, cdi_id)
                    )
                    break
        return tuple(out)

    # -- unprepare ----------------------------------------------------------------------
    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimUnprepareResult]:
        """Unprepare every claim (§11); unknown claims succeed."""
        with operation("unpreparing resource claims", v=4, claims=len(claims)):
            results: dict[str, ClaimUnprepareResult] = {}
            for ref in claims:
                error = await self._unprepare_claim(ref)
                self.metrics.count_unprepare("error" if error else "success")
                results[ref.uid] = ClaimUnprepareResult(error=error)
            return results

    async def _unprepare_claim(self, ref: ClaimRef) -> str:
        """One claim, as the owner's transaction; then the log."""
        outcome = await self.state.unprepare(ref.namespace, ref.name, ref.uid, self)
        if outcome.failed_at == "spec":
            where = f"{shorten(ref.namespace)}/{shorten(ref.name)}"
            log.info("unprepare of claim %s failed: %s", where, outcome.error)
        record = outcome.released
        if record is not None:
            log.info(
                "unprepared claim %s/%s uid=%s cpus=%s",
                ref.namespace,
                ref.name,
                ref.uid,
                record.cpus,
            )
        return outcome.error

    # -- gRPC -----------------------------------------------------------------------------
    def handlers_v1(self) -> dict[str, Handler]:
        return _DRAPluginV1(self).__mapping__()

    def handlers_v1beta1(self) -> dict[str, Handler]:
        return _DRAPluginV1beta1(self).__mapping__()

    def grpc_handlers(self) -> dict[str, Handler]:
        """Both DRA API versions, for one ``serve_unix`` table."""
        return {**self.handlers_v1(), **self.handlers_v1beta1()}


def _refs(request: Any, method: str) -> list[ClaimRef]:
    count = len(request.claims)
    if count > MAX_CLAIMS_PER_CALL:
        # The whole call is refused before any claim is read or touched.
        raise GRPCError(
            Status.INVALID_ARGUMENT,
            f"{method}: {count} claims in one call, more than the limit of {MAX_CLAIMS_PER_CALL}",
        )
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


async def _serve_prepare(service: DRAService, stream: Any, pb: Any, share_ids: bool) -> None:
    request = await stream.recv_message()
    try:
        results = await service.prepare(_refs(request, "NodePrepareResources"))
    except ClaimReadError as exc:
        # A claim that cannot be read fails the whole call (§7 step 1); grpc-go reports a
        # plain error as UNKNOWN, which is what the kubelet sees from the Go helper.
        raise GRPCError(Status.UNKNOWN, str(exc)) from None
    reply = pb.NodePrepareResourcesResponse()
    for uid, result in results.items():
        entry = reply.claims[uid]
        entry.error = result.error
        for device in result.devices:
            item = entry.devices.add(
                request_names=device.request_names,
                pool_name=device.pool_name,
                device_name=device.device_name,
                cdi_device_ids=device.cdi_device_ids,
            )
            if share_ids and device.share_id:
                item.share_id = device.share_id
    await stream.send_message(reply)


async def _serve_unprepare(service: DRAService, stream: Any, pb: Any) -> None:
    request = await stream.recv_message()
    results = await service.unprepare(_refs(request, "NodeUnprepareResources"))
    reply = pb.NodeUnprepareResourcesResponse()
    for uid, result in results.items():
        reply.claims[uid].error = result.error
    await stream.send_message(reply)


class _DRAPluginV1(v1_grpc.DRAPluginBase):
    def __init__(self, service: DRAService) -> None:
        self._service = service

    async def NodePrepareResources(self, stream: Any) -> None:
        await _serve_prepare(self._service, stream, v1_pb, share_ids=True)

    async def NodeUnprepareResources(self, stream: Any) -> None:
        await _serve_unprepare(self._service, stream, v1_pb)


class _DRAPluginV1beta1(v1beta1_grpc.DRAPluginBase):
    def __init__(self, service: DRAService) -> None:
        self._service = service

    async def NodePrepareResources(self, stream: Any) -> None:
        # v1beta1's Device has no share_id (protocols.md §3.1).
        await _serve_prepare(self._service, stream, v1beta1_pb, share_ids=False)

    async def NodeUnprepareResources(self, stream: Any) -> None:
        await _serve_unprepare(self._service, stream, v1beta1_pb)
