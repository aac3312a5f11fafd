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
it holds. A prepare of a claim whose directory does not exist takes the newest spare,
reshapes it to the claim's requests, rewrites its files in place and renames it to the
claim's path (``SpareDirs.build``): no inode is created or freed when the spare held the
claim's requests (other request directories are renamed, made or deleted). Without a
spare, the new tree is built the same way under a new spare name. At most ``MAX_SPARES``
are kept; ``purge`` deletes the oldest beyond that, and, the first time, whatever an
earlier run left (spares are only known to the run that made them, and a crash mid-build
leaves one).

The files of a spare are rewritten in place, which a reader could see half done. Nobody
reads them: the tree only gets the claim's path once complete, the metadata spec that
mounts a file is written after that, and the old claim's containers are gone before its
unprepare (the kubelet unprepares a pod's claims once the pod is terminated, when none of
its containers runs), so its bind mounts of the old inodes are gone too. Until reused or
purged, a spare holds an earlier claim's document (its names and UID), in the plugin's
data dir where it was before.

Thread safety: the metadata writes and removals run one at a time (inline on the event
loop, or in one batch thread), and the purge runs in a thread of its own. A spare leaves
the pool, or a new tree's name is made, under one lock, and the name stays checked out
until the tree is renamed into place (or deleted, if it failed); the purge picks what it
deletes under that lock,
never a checked-out name. So a tree is never built while it is being deleted (a deletion
walks a directory by its descriptor and would follow it to the claim's path).
"""

from __future__ import annotations

import errno
import logging
import os
import random
import shutil
import stat
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
    # Unguessability is not needed (the directory is ours, and a name in use only makes
    # the rename fail, logged): random's generator spares a getrandom(2) per unprepare.
    return f"{SPARE_PREFIX}{random.getrandbits(64):016x}"


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
        self._building: set[str] = set()  # names of trees being built: never purged
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

    def _check_out(self) -> tuple[str, tuple[str, ...] | None]:
        """A name to build a tree under, kept from any purge until ``_check_in``: the
        newest spare's that is still there, with its request directories, or a new name
        (None: no directory exists yet)."""
        with self._lock:
            while self._spares:
                spare = self._spares.pop()
                if os.path.isdir(os.path.join(self.root, spare.name)):
                    self._building.add(spare.name)
                    return spare.name, spare.requests
                # Deleted behind our back: the next one.
            name = spare_name()
            self._building.add(name)
            return name, None

    def _check_in(self, name: str) -> None:
        with self._lock:
            self._building.discard(name)

    def build(
        self,
        claim_dir: str,
        files: Sequence[tuple[str, bytes]],
        *,
        durable: bool,
        failed: Callable[[str, OSError], None],
    ) -> list[str]:
        """Build the claim's tree under a spare's name (the newest spare's, reshaped, or a
        new directory) and rename it to ``claim_dir``, which must not exist, once its files
        are written; the requests written (a request that cannot be written is passed to
        ``failed`` and its directory left out; with none written the tree is deleted). A
        crash of dracpu before the rename leaves only a spare-named directory, which the
        next run's first purge deletes: the claim's path never holds a half-built tree,
        nor an earlier claim's document. (A crash of the kernel can: without ``durable``
        the overwritten file may come back with its old bytes. Nothing mounts it before
        the kubelet prepares the claim again, which rewrites it; an unprepare without
        that prepare takes the old document for another claim's and leaves the tree.)"""
        name, held = self._check_out()
        building = os.path.join(self.root, name)
        requests = [r for r, _ in files]
        written: list[str] = []
        reported: list[str] = []  # requests already passed to failed
        try:
            try:
                if held is None:
                    ensure_dir(self.root)
                    _make_dir(building)
                    held = ()
                else:
                    self.taken += 1
                _reshape(building, requests, held)
                for request, data in files:
                    try:
                        path = f"{building}/{request}/metadata.json"
                        _write_in_place(path, data, durable=durable)
                    except OSError as exc:
                        failed(request, exc)
                        reported.append(request)
                        remove_logged(shutil.rmtree, f"{building}/{request}", "device metadata")
                        continue
                    written.append(request)
                if written:
                    if durable:
                        for path in (*(f"{building}/{r}" for r in written), building):
                            fsync_dir(path)
                    os.rename(building, claim_dir)  # into place, whole
            except OSError as exc:  # the tree itself: nothing of it is used
                for request in requests:
                    if request not in reported:
                        failed(request, exc)
                written = []
            if not written and os.path.lexists(building):
                # Still checked out: no purge deletes it beside us.
                remove_logged(shutil.rmtree, building, "device metadata")
        finally:
            self._check_in(name)
        if written and durable:
            try:
                fsync_dir(self.root)
            except OSError as exc:  # the tree is in place, only not yet durable
                log.warning("failed to sync device metadata directory %s: %s", self.root, exc)
        return written

    def _victims(self) -> list[str]:
        # Listed outside the lock (a slow directory must not hold up prepares). A name
        # listed and then taken is, under the lock below, still being built (skipped) or
        # gone from its path (renamed to a claim's, or deleted): deleting it is nothing.
        listed: list[str] = []
        if not self._orphans_purged:
            try:
                listed = os.listdir(self.root)
            except OSError:
                listed = []
        with self._lock:
            names = [s.name for s in self._spares[: max(0, len(self._spares) - self._keep)]]
            del self._spares[: len(names)]
            if not self._orphans_purged:
                self._orphans_purged = True
                known = {s.name for s in self._spares} | self._building | set(names)
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

    A claim without a directory gets a whole new tree (``SpareDirs.build``: a spare's, or
    a new one), its files written in place before it is renamed to the claim's path: no
    container mounts them before their CDI spec exists, and the spec is written after the
    file. A claim directory that is there (the same claim prepared again, or a claim of
    the same name not yet unprepared) is live: its files are replaced with a rename, so a
    reader never sees half a file. ``durable`` adds the fsyncs.
    """
    if not os.path.lexists(claim_dir):
        builder = spares if spares is not None else SpareDirs(os.path.dirname(claim_dir))
        return builder.build(claim_dir, files, durable=durable, failed=failed)
    written: list[str] = []
    for request, data in files:
        try:
            atomic_write(f"{claim_dir}/{request}/metadata.json", data, mode=0o644, durable=durable)
        except OSError as exc:
            failed(request, exc)
            continue
        written.append(request)
    return written


def _reshape(tree: str, requests: Sequence[str], held: Sequence[str]) -> None:
    """Give ``tree`` exactly one directory per request: those it holds are kept, the
    others renamed to the missing ones, made, or deleted. Raises OSError."""
    unused = [r for r in held if r not in requests]
    for request in requests:
        if request in held:
            continue
        while unused:
            entry = f"{tree}/{unused.pop()}"
            if os.path.isdir(entry) and not os.path.islink(entry):
                os.rename(entry, f"{tree}/{request}")
                break
            os.unlink(entry)  # not a request's directory: whatever it is, it goes
        else:
            _make_dir(f"{tree}/{request}")
    for entry in unused:
        _remove_entry(f"{tree}/{entry}")


def _remove_entry(path: str) -> None:
    """Delete a directory with what it holds, or anything else in its place."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _make_dir(path: str) -> None:
    os.mkdir(path, 0o755)
    os.chmod(path, 0o755)  # mkdir's mode is filtered by the umask


# O_NONBLOCK: a FIFO put in a spare's place must not hang the metadata thread in open(2);
# whatever is not a regular file is refused after the open.
_FLAGS = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


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
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"not a regular file: {path}")
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
) -> None:
    """Remove the claim's directory, leaving any request in it that another claim of the
    same namespace and name wrote. Problems are logged.

    ``purge=False`` sets the directory aside as a spare in ``spares`` (a later prepare
    takes it, or the purge deletes it; without ``spares``, the next run's first purge):
    the claim's path is free at once, and the unprepare does not wait for the deletions
    (on ext4 mounted with ``discard``, as many cloud images are, each rmdir(2) waits
    about 1-3 ms, and a claim's tree has two).

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
        return
    others = [r for r in requests if _written_for_another(claim_dir, r, uid)]
    if not others:
        if spares is None:
            spares = SpareDirs(os.path.dirname(claim_dir))  # for the next run's purge
        if purge or not spares.set_aside(claim_dir, requests):
            remove_logged(shutil.rmtree, claim_dir, "device metadata")
        return
    log.info(
        "device metadata of %s kept for requests %s: another claim of the same name wrote it",
        claim_dir,
        ", ".join(sorted(others)),
    )
    for request in requests:
        if request not in others:
            remove_logged(shutil.rmtree, os.path.join(claim_dir, request), "device metadata")


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
        fd = os.open(
            f"{claim_dir}/{request}/metadata.json",
            os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK,  # a FIFO must not hang the read
        )
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
