"""The claim metadata trees on disk, and the spare trees unprepares leave for prepares.

A claim's device metadata is a small tree (``<namespace>_<name>/<request>/metadata.json``,
behavior.md §10.3) made at prepare and removed at unprepare. Made and deleted for every
claim, that is three new inodes and three deletions per prepare+unprepare pair. On ext4
without a journal (the root filesystem of some cloud images, and of the machines this
project is benchmarked on) every new inode is placed only after skipping each inode of
its block group deleted within the last minute or more (``recently_deleted`` in
fs/ext4/ialloc.c, checked only when the filesystem has no journal), so in a node drain each
create gets slower as the deletions pile up: about 1.1 ms of kernel time per prepare was
measured there, against 20 us for the same tree taken from a spare.

So an unprepare renames the claim's directory to ``.removed-<random>`` (one rename, the
claim's path is free at once) and records it here as a spare with the request directories
it holds. A prepare of a claim whose directory does not exist renames a spare into place
and rewrites the files in it (``write_metadata_tree``): no inode is created or freed. At
most ``MAX_SPARES`` are kept; ``purge`` deletes the oldest beyond that, and, the first
time, whatever an earlier run set aside (spares are only known to the run that made them).

The files of a spare are rewritten in place, which a reader could see half done. Nobody
reads them: the metadata spec that mounts a file is written after the file, and the old
claim's containers are gone before its unprepare (the kubelet unprepares a pod's claims
once the pod is terminated, when none of its containers runs), so its bind mounts of the
old inodes are gone too.

Thread safety: the metadata writes and removals run one at a time (inline on the event
loop, or in one batch thread), and the purge runs in a thread of its own. Every rename
into or out of the spares' names happens under one lock, and the purge picks the
directories it deletes under that lock, so a spare is never taken while it is being
deleted (a deletion walks a directory by its descriptor and would follow it to the
claim's path).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from dracpu.atomicfile import atomic_write, ensure_dir, fsync_dir

__all__ = [
    "MAX_SPARES",
    "SPARE_PREFIX",
    "SpareDirs",
    "remove_logged",
    "remove_metadata_tree",
    "write_metadata_tree",
]

log = logging.getLogger(__name__)

# A claim directory set aside by an unprepare. Claim directories start with a DNS label's
# first character, never a dot, so the names cannot meet.
SPARE_PREFIX = ".removed-"
# Spares kept for later prepares: each is two directories and one small file. A node
# drain of 64 claims at once reuses every one of them.
MAX_SPARES = 64


def spare_name() -> str:
    return SPARE_PREFIX + secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class _Spare:
    name: str
    requests: tuple[str, ...]  # the request directories in it when it was set aside


class SpareDirs:
    """The spares of one metadata directory (``<plugin dir>/dra-device-metadata``)."""

    def __init__(self, root: str, *, keep: int = MAX_SPARES) -> None:
        if keep < 0:
            raise ValueError(f"keep must not be negative, not {keep}")
        self.root = root
        self._keep = keep
        self._lock = threading.Lock()
        self._spares: list[_Spare] = []  # oldest first
        self._orphans_purged = False
        self.taken = 0  # spares taken by prepares so far (for tests and benchmarks)

    @property
    def count(self) -> int:
        """Spares kept now."""
        return len(self._spares)

    def overflowing(self) -> bool:
        """Whether a purge has something to delete."""
        return len(self._spares) > self._keep or not self._orphans_purged

    def set_aside(self, claim_dir: str, requests: Sequence[str]) -> bool:
        """Rename ``claim_dir`` to a new spare holding ``requests``; True when the claim's
        path is free (also when there was nothing there), False when it is still there."""
        name = spare_name()
        with self._lock:
            try:
                os.rename(claim_dir, os.path.join(self.root, name))
            except FileNotFoundError:
                return True
            except OSError as exc:
                log.warning("failed to set device metadata %s aside: %s", claim_dir, exc)
                return False
            self._spares.append(_Spare(name, tuple(requests)))
        return True

    def take(self, claim_dir: str) -> tuple[str, ...] | None:
        """Rename the newest spare to ``claim_dir``; the request directories in it. None
        when there is no spare, or ``claim_dir`` holds something (it is left alone)."""
        with self._lock:
            while self._spares:
                spare = self._spares.pop()
                try:
                    # Replaces an empty directory at claim_dir; fails on one with entries.
                    os.rename(os.path.join(self.root, spare.name), claim_dir)
                except FileNotFoundError:
                    continue  # deleted by someone else: try the next one
                except OSError:
                    self._spares.append(spare)
                    return None
                self.taken += 1
                return spare.requests
        return None

    def _victims(self) -> list[str]:
        with self._lock:
            names = [s.name for s in self._spares[: max(0, len(self._spares) - self._keep)]]
            del self._spares[: len(names)]
            if not self._orphans_purged:
                self._orphans_purged = True
                known = {s.name for s in self._spares}.union(names)
                try:
                    listed = os.listdir(self.root)
                except OSError:
                    listed = []
                names += [n for n in listed if n.startswith(SPARE_PREFIX) and n not in known]
        return names

    def purge(self) -> int:
        """Delete the spares beyond the ones kept, and (the first time) those an earlier
        run left; the number deleted. Blocking; problems are logged."""
        victims = self._victims()
        for name in victims:
            remove_logged(shutil.rmtree, os.path.join(self.root, name), "device metadata")
        return len(victims)


# -- writing ----------------------------------------------------------------------------------


def write_metadata_tree(
    claim_dir: str,
    files: Sequence[tuple[str, bytes]],
    *,
    durable: bool,
    spares: SpareDirs | None,
    failed: Callable[[str, OSError], None],
) -> list[str]:
    """Write each ``(request, document)`` to ``claim_dir/<request>/metadata.json``; the
    requests written. A request that cannot be written is passed to ``failed``.

    In a tree this call made (or took from ``spares``) the files are written in place: no
    container mounts them before their CDI spec exists, and the spec is written after the
    file. A claim directory that was already there (the same claim prepared again, or a
    claim of the same name not yet unprepared) is live: its files are replaced with a
    rename, so a reader never sees half a file. ``durable`` adds the fsyncs.
    """
    requests = [r for r, _ in files]
    try:
        fresh = _open_tree(claim_dir, requests, spares)
    except OSError as exc:
        for request in requests:
            failed(request, exc)
        return []
    written: list[str] = []
    for request, data in files:
        path = f"{claim_dir}/{request}/metadata.json"
        try:
            if fresh:
                _write_in_place(path, data, durable=durable)
            else:
                atomic_write(path, data, mode=0o644, durable=durable)
        except OSError as exc:
            failed(request, exc)
            continue
        written.append(request)
    if fresh and durable:
        # The tree's own entries: the request directories, the claim's, the metadata dir.
        tree = (*(os.path.join(claim_dir, r) for r in written), claim_dir)
        for path in (*tree, os.path.dirname(claim_dir)):
            with contextlib.suppress(OSError):
                fsync_dir(path)
    return written


def _open_tree(claim_dir: str, requests: Sequence[str], spares: SpareDirs | None) -> bool:
    """Make sure ``claim_dir/<request>`` exists for each request; True when this call made
    the claim's directory or took it from the spares (the files in it are nobody's yet),
    False when it was already there (the request directories are then made as needed by
    ``atomic_write``). Raises OSError."""
    held = spares.take(claim_dir) if spares is not None else None
    if held is None:
        try:
            _make_dir(claim_dir)
        except FileExistsError:
            return False
        except FileNotFoundError:
            ensure_dir(os.path.dirname(claim_dir))
            try:
                _make_dir(claim_dir)
            except FileExistsError:
                return False
        held = ()
    unused = [r for r in held if r not in requests]
    for request in requests:
        if request in held:
            continue
        path = os.path.join(claim_dir, request)
        if unused:
            os.rename(os.path.join(claim_dir, unused.pop()), path)
        else:
            _make_dir(path)
    for request in unused:
        remove_logged(shutil.rmtree, os.path.join(claim_dir, request), "device metadata")
    return True


def _make_dir(path: str) -> None:
    os.mkdir(path, 0o755)
    os.chmod(path, 0o755)  # mkdir's mode is filtered by the umask


_FLAGS = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_in_place(path: str, data: bytes, *, durable: bool) -> None:
    """Make ``path`` hold exactly ``data``: a spare's file keeps its inode and data block
    (overwritten, then cut to length); a missing one is created 0644."""
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        fd = os.open(path, _FLAGS | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.fchmod(fd, 0o644)  # the mode is filtered by the umask
        except BaseException:
            os.close(fd)
            raise
    try:
        view = memoryview(data)
        done = 0
        while done < len(data):
            done += os.pwrite(fd, view[done:], done)
        os.ftruncate(fd, len(data))
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


# -- removing ---------------------------------------------------------------------------------


def remove_metadata_tree(
    claim_dir: str, uid: str, *, purge: bool, spares: SpareDirs | None
) -> list[str] | None:
    """Remove the claim's directory, leaving any request in it that another claim of the
    same namespace and name wrote; the request directories it held (None when it could
    not be listed: not there, or unreadable). Problems are logged.

    ``purge=False`` sets the directory aside as a spare in ``spares`` (a later prepare
    takes it, or the purge deletes it), or, without ``spares``, for
    ``metadata.purge_removed_metadata`` to delete: the claim's path is free at once, and
    the unprepare does not wait for the deletions (on ext4 mounted with ``discard``, as
    many cloud images are, each rmdir(2) waits about 1-3 ms, and a claim's tree has two).

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
        return None
    others = [r for r in requests if _written_for_another(claim_dir, r, uid)]
    if not others:
        if spares is None:
            spares = SpareDirs(os.path.dirname(claim_dir))  # set aside for a purge
        if purge or not spares.set_aside(claim_dir, requests):
            remove_logged(shutil.rmtree, claim_dir, "device metadata")
        return requests
    log.info(
        "device metadata of %s kept for requests %s: another claim of the same name wrote it",
        claim_dir,
        ", ".join(sorted(others)),
    )
    for request in requests:
        if request not in others:
            remove_logged(shutil.rmtree, os.path.join(claim_dir, request), "device metadata")
    return requests


class _Claim(msgspec.Struct):
    uid: object = None


class _Written(msgspec.Struct):
    """The one field of a metadata document an unprepare reads: whose it is."""

    metadata: _Claim = msgspec.field(default_factory=_Claim)


_WRITTEN = msgspec.json.Decoder(_Written)
# A document of a few requests is under 1 KiB; past 64 KiB it is read on, up to 1 MiB.
_FIRST_READ, _MAX_DOCUMENT = 1 << 16, 1 << 20


def _written_for_another(claim_dir: str, request: str, uid: str) -> bool:
    """Whether the request's metadata document names a claim UID other than ``uid``."""
    try:
        fd = os.open(f"{claim_dir}/{request}/metadata.json", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        # No read(2) of 1 MiB at once: Python allocates the whole buffer first, an mmap
        # and munmap per unprepare (~18 us).
        data = os.read(fd, _FIRST_READ)
        if len(data) == _FIRST_READ:
            data += os.read(fd, _MAX_DOCUMENT - _FIRST_READ)
        written_for = _WRITTEN.decode(data).metadata.uid
    except (OSError, msgspec.DecodeError):
        return False
    finally:
        os.close(fd)
    return isinstance(written_for, str) and written_for != uid


def remove_logged(remove: Callable[[str], object], path: str, what: str) -> None:
    """Remove ``path``; already gone is fine, any other failure is logged, never raised."""
    try:
        remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("failed to remove %s %s: %s", what, path, exc)
