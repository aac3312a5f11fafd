"""Device metadata for prepared claims (behavior.md §7 step 4, §8.5 step 3, §10.3, §20).

For each prepared request of a claim, a ``DeviceMetadata`` document goes to
``<plugin dir>/dra-device-metadata/<namespace>_<name>/<request>/metadata.json`` and a CDI
spec ``<cdi dir>/dra.cpu_metadata_<uid>_<request>.json`` (``dracpu.cdi.metadata``)
bind-mounts it read-only into the container under
``/var/run/kubernetes.io/dra-device-attributes/``. The kubelet is told about it by one more
CDI id on the request's first device. Failures here are logged, never
a claim error: the CPUs are what the container needs.

Documents are built by pure functions; ``write_claim_metadata`` and
``remove_claim_metadata`` do the (blocking) file work.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

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
from dracpu.nursery.pulse import Pulse

__all__ = [
    "METADATA_DIR",
    "DeviceAttributes",
    "MetadataPurger",
    "metadata_document",
    "purge_removed_metadata",
    "remove_claim_metadata",
    "write_claim_metadata",
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


def write_claim_metadata(
    plugin_dir: str,
    cdi_dir: str,
    claim: ClaimAllocation,
    devices: Sequence[PreparedDevice],
    inventory: DeviceAttributes | None,
    *,
    spec_durable: bool = True,
) -> dict[str, str]:
    """Write each request's metadata file and CDI spec; base request -> CDI id written.

    A request whose files could not be written is logged and left out of the result.
    ``spec_durable=False`` writes the CDI spec and the metadata file without fsyncs (a CDI
    dir on tmpfs, as /var/run/cdi is on a node).

    The metadata file is exactly as durable as the CDI spec that mounts it: nothing else
    reads it, and only through that spec. A crash of dracpu loses nothing from the page
    cache, so an fsync only matters across a crash of the kernel, and after one the
    spec on tmpfs is gone with the boot: the file is unreachable until the kubelet
    prepares the claim again, which writes both anew. The rename keeps readers from ever
    seeing half a file either way. On a node this saves two fsyncs of the plugin's data
    dir per prepare (and the journal commits they wait for).
    """
    written: dict[str, str] = {}
    claim_dir = _claim_dir(plugin_dir, claim.namespace, claim.name)
    requests = dict.fromkeys(_base(r) for d in devices for r in d.request_names)
    usable_uid = _uid_ok(claim.uid)
    for request in requests:
        if claim_dir is None or not usable_uid or not is_dns1123_label(request):
            log.warning(
                "device metadata skipped: unusable names in claim %r/%r uid %r request %r",
                claim.namespace,
                claim.name,
                claim.uid,
                request,
            )
            continue
        host_path = os.path.join(claim_dir, request, "metadata.json")
        document = metadata_document(claim, request, devices, inventory)
        spec = metadata_spec(claim.uid, claim.name, request, host_path)
        spec_path = os.path.join(cdi_dir, metadata_spec_name(claim.uid, request))
        try:
            atomic_write(
                host_path,
                json.dumps(document).encode() + b"\n",
                mode=0o644,
                durable=spec_durable,
            )
            atomic_write(spec_path, json.dumps(spec, indent=2).encode(), durable=spec_durable)
        except OSError as exc:
            log.warning(
                "failed to write device metadata for claim %s/%s request %s: %s",
                claim.namespace,
                claim.name,
                request,
                exc,
            )
            continue
        written[request] = cdi_metadata_id(claim.uid, request)
    return written


# A claim directory set aside by an unprepare, until a purge deletes it. Claim directories
# start with a DNS label's first character, never a dot, so the names cannot meet.
_SET_ASIDE = ".removed-"


def remove_claim_metadata(
    plugin_dir: str, cdi_dir: str, namespace: str, name: str, uid: str, *, purge: bool = True
) -> None:
    """Remove a claim's metadata directory and metadata CDI specs; problems are logged.

    ``purge=False`` renames the claim's directory aside (``.removed-<random>`` next to it)
    instead of deleting it, for ``purge_removed_metadata`` to delete later: the claim's
    path is free at once, and the unprepare does not wait for the directory deletions
    (on ext4 mounted with ``discard``, as many cloud images are, each rmdir(2) waits
    about 1-3 ms, and a claim's tree has two).
    """
    claim_dir = _claim_dir(plugin_dir, namespace, name)
    if claim_dir is not None:
        _remove_claim_dir(claim_dir, uid, purge=purge)
    if not _uid_ok(uid):
        return
    # Not glob: fnmatch caches every distinct pattern (up to 32,768 of them), so a pattern
    # per claim made the daemon's memory grow with every claim ever unprepared.
    prefix = metadata_spec_prefix(uid)
    try:
        names = os.listdir(cdi_dir)
    except OSError:
        names = []
    for path in (
        os.path.join(cdi_dir, n) for n in names if n.startswith(prefix) and n.endswith(".json")
    ):
        _remove_logged(os.unlink, path, "device metadata spec")


def _remove_claim_dir(claim_dir: str, uid: str, *, purge: bool) -> None:
    """Remove the claim's directory, leaving any request in it that another claim of the
    same namespace and name wrote.

    The directory is named after the claim's namespace and name, not its UID: that is the
    layout of the upstream kubelet plugin helper (k8s.io/dynamic-resource-allocation,
    kubeletplugin's metadata writer: ``<plugin dir>/dra-device-metadata/<ns>_<name>/``),
    and its cleanup deletes the directory whatever it holds. A claim deleted and created
    again under the same name (a new UID) may be prepared before the old one's unprepare
    arrives; that unprepare must not take the new claim's files, which its CDI spec
    mounts. Each request's document names the claim's UID, so whatever names another UID
    stays; what cannot be read is taken for this claim's, as before.
    """
    try:
        requests = os.listdir(claim_dir)
    except OSError:
        requests = []
    others = [r for r in requests if _written_for_another(claim_dir, r, uid)]
    if not others:
        if purge or not _set_aside(claim_dir):
            _remove_logged(shutil.rmtree, claim_dir, "device metadata")
        return
    log.info(
        "device metadata of %s kept for requests %s: another claim of the same name wrote it",
        claim_dir,
        ", ".join(sorted(others)),
    )
    for request in requests:
        if request not in others:
            _remove_logged(shutil.rmtree, os.path.join(claim_dir, request), "device metadata")


def _written_for_another(claim_dir: str, request: str, uid: str) -> bool:
    """Whether the request's metadata document names a claim UID other than ``uid``."""
    try:
        with open(os.path.join(claim_dir, request, "metadata.json"), "rb") as f:
            # At most 1 MiB, but no 1 MiB buffer for a document of a few hundred bytes
            # (read(n) allocates n first: an mmap and munmap per unprepare, ~18 us).
            document = json.loads(f.read(min(os.fstat(f.fileno()).st_size, 1 << 20)))
        written_for = document["metadata"]["uid"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(written_for, str) and written_for != uid


def _set_aside(claim_dir: str) -> bool:
    """Rename the claim's directory aside; True when it is gone from its path (also when
    it never existed), False when it is still there."""
    aside = os.path.join(os.path.dirname(claim_dir), _SET_ASIDE + secrets.token_hex(8))
    try:
        os.rename(claim_dir, aside)
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.warning("failed to set device metadata %s aside: %s", claim_dir, exc)
        return False
    return True


def purge_removed_metadata(plugin_dir: str) -> int:
    """Delete every claim directory ``remove_claim_metadata`` set aside (also those of an
    earlier run); the number deleted. Problems are logged."""
    root = os.path.join(plugin_dir, METADATA_DIR)
    try:
        names = [n for n in os.listdir(root) if n.startswith(_SET_ASIDE)]
    except OSError:
        return 0
    for name in names:
        _remove_logged(shutil.rmtree, os.path.join(root, name), "device metadata")
    return len(names)


class MetadataPurger:
    """Deletes set-aside metadata directories in the background: ``soon`` asks for a purge,
    and ``run``, a service of the root supervisor (``dracpu run`` starts it as
    ``metadata-purge``), deletes in a worker thread, once as it starts (what an earlier run
    set aside and did not delete, a crash or a stop mid-purge) and then once per ask (asks
    made during a purge are answered by one more). Deleting is abandoned on cancel: a stop
    does not wait for it, and what is left is deleted by the next purge, of this run or the
    next. The thread comes from a limiter of one of its own (nursery/threads.py): a purge
    left behind keeps its token, so the next one cannot run beside it, and it never holds
    a token of Trio's shared pool."""

    def __init__(self, plugin_dir: str) -> None:
        self.plugin_dir = plugin_dir
        self._asked = Pulse()
        self._again = True  # the purge at start
        self._one_thread = trio.CapacityLimiter(1)
        self.purged = 0  # directories deleted so far

    def soon(self) -> None:
        """Ask for a purge after the current one (if any). Call from the Trio thread."""
        self._again = True
        self._asked.fire()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._asked.wait_until(lambda: self._again)
            self._again = False
            self.purged += await trio.to_thread.run_sync(
                purge_removed_metadata,
                self.plugin_dir,
                abandon_on_cancel=True,
                limiter=self._one_thread,
            )


def _remove_logged(remove: Callable[[str], object], path: str, what: str) -> None:
    """Remove ``path``; already gone is fine, any other failure is logged, never raised."""
    try:
        remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("failed to remove %s %s: %s", what, path, exc)
