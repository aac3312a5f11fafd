"""Device metadata for prepared claims (behavior.md §7 step 4, §8.5 step 3, §10.3, §20).

For each prepared request of a claim, a ``DeviceMetadata`` document goes to
``<plugin dir>/dra-device-metadata/<namespace>_<name>/<request>/metadata.json`` and a CDI
spec ``<cdi dir>/dra.cpu_metadata_<uid>_<request>.json`` (``dracpu.cdi.metadata``)
bind-mounts it read-only into the container under
``/var/run/kubernetes.io/dra-device-attributes/``. The kubelet is told about it by one more
CDI id on the request's first device. Failures here are logged, never
a claim error: the CPUs are what the container needs.

Documents are built by pure functions (``metadata_files``). The blocking work has two
steps, each with its own call, as the DRA service runs them in different places: the files
in the plugin's data dir (``write_claim_files``, ``remove_metadata_files``: on disk, in a
worker thread; ``metadata_tree`` does them) and the specs in the CDI dir
(``write_metadata_specs``, ``remove_metadata_specs``: where the claim's own CDI spec is
written). ``write_claim_metadata`` and ``remove_claim_metadata`` run both.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec
import trio

from dracpu import DRIVER_NAME
from dracpu.allocation.prepare import ClaimAllocation
from dracpu.allocation.store import PreparedDevice
from dracpu.atomicfile import atomic_write
from dracpu.cdi import CDIError, check_claim_uid
from dracpu.cdi.metadata import (
    cdi_metadata_id,
    metadata_spec,
    metadata_spec_name,
    metadata_spec_prefix,
)
from dracpu.devices.model import ATTR_ALLOCATED_NUM_CPUS
from dracpu.k8s.names import is_dns1123_label, is_dns1123_subdomain
from dracpu.kubelet.metadata_tree import (
    MAX_SPARES,
    SpareDirs,
    remove_logged,
    remove_metadata_tree,
    write_metadata_tree,
)
from dracpu.nursery.pulse import Pulse

__all__ = [
    "METADATA_DIR",
    "DeviceAttributes",
    "MetadataPurger",
    "metadata_document",
    "metadata_files",
    "remove_claim_metadata",
    "remove_metadata_files",
    "remove_metadata_specs",
    "write_claim_files",
    "write_claim_metadata",
    "write_files_and_specs",
    "write_metadata_specs",
]

log = logging.getLogger(__name__)

METADATA_DIR = "dra-device-metadata"
METADATA_API_VERSION = "metadata.resource.k8s.io/v1beta1"


@runtime_checkable
class DeviceAttributes(Protocol):
    """The published devices' attributes (``devices.DeviceInventory`` provides them)."""

    def __contains__(self, name: object) -> bool: ...

    def attributes_of(self, name: str) -> dict[str, Any]: ...


def _base(request: str) -> str:
    return request.split("/", 1)[0]


def _device_entry(device: PreparedDevice, inventory: DeviceAttributes | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "driver": DRIVER_NAME,
        "pool": device.pool_name,
        "name": device.device_name,
    }
    # Only published devices carry attributes (machine mode may name others, §8.5).
    if inventory is not None and device.device_name in inventory:
        attributes = inventory.attributes_of(device.device_name)
        if attributes:
            if device.allocated_num_cpus is not None:
                attributes[ATTR_ALLOCATED_NUM_CPUS] = {"int": device.allocated_num_cpus}
            entry["attributes"] = attributes
    return entry


def metadata_document(
    claim: ClaimAllocation,
    request: str,
    devices: Sequence[PreparedDevice],
    inventory: DeviceAttributes | None,
) -> dict[str, Any]:
    """The ``DeviceMetadata`` of one base request: its (sub-)requests and their devices."""
    by_request: dict[str, list[dict[str, Any]]] = {}
    for device in devices:
        for name in device.request_names:
            if _base(name) == request:
                by_request.setdefault(name, []).append(_device_entry(device, inventory))
    return {
        "apiVersion": METADATA_API_VERSION,
        "kind": "DeviceMetadata",
        "metadata": {
            "name": claim.name,
            "namespace": claim.namespace,
            "uid": claim.uid,
            "generation": 1,
        },
        "requests": [{"name": n, "devices": d} for n, d in by_request.items()],
    }


# Names held to what the API server accepts (dracpu.k8s.names) cannot walk out of the
# metadata directory ("..", "/"), and "<namespace>_<name>" stays unambiguous (neither may
# contain "_").


def _uid_ok(uid: str) -> bool:
    try:
        check_claim_uid(uid)
    except CDIError:
        return False
    return True


def _claim_dir(plugin_dir: str, namespace: str, name: str) -> str | None:
    if not (is_dns1123_label(namespace) and is_dns1123_subdomain(name)):
        return None
    return os.path.join(plugin_dir, METADATA_DIR, f"{namespace}_{name}")


def metadata_files(
    plugin_dir: str,
    claim: ClaimAllocation,
    devices: Sequence[PreparedDevice],
    inventory: DeviceAttributes | None,
) -> tuple[str, list[tuple[str, bytes]]]:
    """The claim's metadata directory and each base request's document bytes. A request
    whose names cannot make a path is logged and left out (no files at all when the
    claim's own names cannot). Pure: no file is touched."""
    claim_dir = _claim_dir(plugin_dir, claim.namespace, claim.name)
    usable = claim_dir is not None and _uid_ok(claim.uid)
    files: list[tuple[str, bytes]] = []
    for request in dict.fromkeys(_base(r) for d in devices for r in d.request_names):
        if not (usable and is_dns1123_label(request)):
            log.warning(
                "device metadata skipped: unusable names in claim %r/%r uid %r request %r",
                claim.namespace,
                claim.name,
                claim.uid,
                request,
            )
            continue
        document = metadata_document(claim, request, devices, inventory)
        # json.dumps(document)'s form (", " and ": "), from msgspec's encoder, 5x faster;
        # text outside ASCII is written as UTF-8 rather than as \\u escapes.
        text = msgspec.json.format(msgspec.json.encode(document), indent=0)
        files.append((request, text + b"\n"))
    return claim_dir or "", files


def write_metadata_specs(
    cdi_dir: str, claim: ClaimAllocation, claim_dir: str, requests: Sequence[str], *, durable: bool
) -> dict[str, str]:
    """The CDI spec that mounts each written request's file; base request -> CDI id, for
    the specs written (a failure is logged)."""
    ids: dict[str, str] = {}
    for request in requests:
        host_path = f"{claim_dir}/{request}/metadata.json"
        spec = metadata_spec(claim.uid, claim.name, request, host_path)
        path = f"{cdi_dir}/{metadata_spec_name(claim.uid, request)}"
        try:
            # msgspec's indented form is json.dumps(indent=2)'s (UTF-8 where it escapes),
            # without its Python encoder.
            atomic_write(path, msgspec.json.format(msgspec.json.encode(spec)), durable=durable)
        except OSError as exc:
            _write_failed(claim, request, exc)
            continue
        ids[request] = cdi_metadata_id(claim.uid, request)
    return ids


def write_claim_metadata(
    plugin_dir: str,
    cdi_dir: str,
    claim: ClaimAllocation,
    devices: Sequence[PreparedDevice],
    inventory: DeviceAttributes | None,
    *,
    spec_durable: bool = True,
    spares: SpareDirs | None = None,
) -> dict[str, str]:
    """Write each request's metadata file and CDI spec; base request -> CDI id written.

    Both steps in one call (the DRA service runs the file step in a worker thread and the
    spec step where the claim's CDI spec is written). A request whose files could not
    be written is logged and left out of the result. ``spec_durable=False`` writes the CDI
    spec and the metadata file without fsyncs (a CDI dir on tmpfs, as /var/run/cdi is on a
    node). With ``spares``, a claim whose directory does not exist takes a spare one
    (``metadata_tree``) instead of making a new tree.

    The metadata file is exactly as durable as the CDI spec that mounts it: nothing else
    reads it, and only through that spec. A crash of dracpu loses nothing from the page
    cache, so an fsync only matters across a crash of the kernel, and after one the
    spec on tmpfs is gone with the boot: the file is unreachable until the kubelet
    prepares the claim again, which writes both anew. On a node this saves two fsyncs of
    the plugin's data dir per prepare (and the journal commits they wait for).
    """
    claim_dir, files = metadata_files(plugin_dir, claim, devices, inventory)
    if not files:
        return {}
    return write_files_and_specs(
        cdi_dir, claim, claim_dir, files, durable=spec_durable, spares=spares
    )


def write_files_and_specs(
    cdi_dir: str,
    claim: ClaimAllocation,
    claim_dir: str,
    files: Sequence[tuple[str, bytes]],
    *,
    durable: bool,
    spares: SpareDirs | None,
) -> dict[str, str]:
    """``write_claim_files``, then ``write_metadata_specs`` for what it wrote: both steps
    in one place (the writer process, or ``write_claim_metadata``)."""
    written = write_claim_files(claim, claim_dir, files, durable=durable, spares=spares)
    return write_metadata_specs(cdi_dir, claim, claim_dir, written, durable=durable)


def write_claim_files(
    claim: ClaimAllocation,
    claim_dir: str,
    files: Sequence[tuple[str, bytes]],
    *,
    durable: bool,
    spares: SpareDirs | None,
) -> list[str]:
    """``metadata_tree.write_metadata_tree`` for the claim, its failures logged."""
    return write_metadata_tree(
        claim_dir,
        files,
        durable=durable,
        spares=spares,
        failed=functools.partial(_write_failed, claim),
    )


def _write_failed(claim: ClaimAllocation, request: str, exc: OSError) -> None:
    log.warning(
        "failed to write device metadata for claim %s/%s request %s: %s",
        claim.namespace,
        claim.name,
        request,
        exc,
    )


def remove_metadata_files(
    plugin_dir: str,
    namespace: str,
    name: str,
    uid: str,
    *,
    purge: bool,
    spares: SpareDirs | None,
) -> None:
    """The file step of ``remove_claim_metadata``."""
    claim_dir = _claim_dir(plugin_dir, namespace, name)
    if claim_dir is not None:
        remove_metadata_tree(claim_dir, uid, purge=purge, spares=spares)


def remove_metadata_specs(cdi_dir: str, uid: str) -> None:
    """Delete every metadata CDI spec named for the claim's UID. The directory is listed:
    the claim's metadata directory cannot say which specs it wrote, as a claim of the
    same name may have taken over some of its requests' directories (and then removed
    them at its own unprepare)."""
    if not _uid_ok(uid):
        return
    # Not glob: fnmatch caches every distinct pattern (up to 32,768 of them), so a pattern
    # per claim made the daemon's memory grow with every claim ever unprepared.
    prefix = metadata_spec_prefix(uid)
    try:
        listed = os.listdir(cdi_dir)
    except OSError:
        listed = []
    for name in (n for n in listed if n.startswith(prefix) and n.endswith(".json")):
        remove_logged(os.unlink, f"{cdi_dir}/{name}", "device metadata spec")


def remove_claim_metadata(
    plugin_dir: str,
    cdi_dir: str,
    namespace: str,
    name: str,
    uid: str,
    *,
    purge: bool = True,
    spares: SpareDirs | None = None,
) -> None:
    """Remove a claim's metadata directory and metadata CDI specs; problems are logged.

    ``purge=False`` sets the directory aside instead of deleting it
    (``metadata_tree.remove_metadata_tree``).
    """
    remove_metadata_files(plugin_dir, namespace, name, uid, purge=purge, spares=spares)
    remove_metadata_specs(cdi_dir, uid)


class MetadataPurger:
    """Keeps the spare metadata directories (``metadata_tree``) and deletes the extra ones in the
    background, for a ``DRAService`` that writes metadata in a worker thread (under
    ``dracpu run`` the writer process keeps and purges its own spares, ``metadata_proc.py``):
    ``soon`` asks for a purge when there is something to delete, and ``run``, run as a service
    beside it, deletes in a worker thread, once as it starts (what an earlier run set aside and
    did not delete, a crash or a stop mid-purge) and then once per ask (asks made during a purge
    are answered by one more). Deleting is abandoned on cancel: a stop does not wait for it, and
    what is left is deleted by the next purge, of this run or the next. The thread comes from a
    limiter of one of its own (nursery/threads.py): a purge left behind keeps its token, so the
    next one cannot run beside it, and it never holds a token of Trio's shared pool."""

    def __init__(self, plugin_dir: str, *, keep: int = MAX_SPARES) -> None:
        self.plugin_dir = plugin_dir
        self.spares = SpareDirs(os.path.join(plugin_dir, METADATA_DIR), keep=keep)
        self._asked = Pulse()
        self._again = True  # the purge at start
        self._one_thread = trio.CapacityLimiter(1)
        self.purged = 0  # directories deleted so far

    def soon(self) -> None:
        """Ask for a purge after the current one (if any), when there is something to
        delete. Call from the Trio thread."""
        if self.spares.overflowing():
            self._again = True
            self._asked.fire()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._asked.wait_until(lambda: self._again)
            self._again = False
            self.purged += await trio.to_thread.run_sync(
                self.spares.purge, abandon_on_cancel=True, limiter=self._one_thread
            )
