"""A minimal inotify binding (ctypes, no dependency) so the drift watcher can wake early
and the NRI session can dial as soon as the runtime's socket appears (`EntryWatch`).

Only what the watcher needs: add a watch per directory, read and decode event records,
forget watches the kernel dropped (``IN_IGNORED`` after a cgroup is removed). Where inotify
is unavailable :func:`open_inotify` returns None and the watcher just polls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno as errno_mod
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import trio

__all__ = [
    "IN_CREATE",
    "IN_DELETE",
    "IN_IGNORED",
    "IN_MODIFY",
    "IN_MOVED_TO",
    "EntryWatch",
    "Inotify",
    "InotifyEvent",
    "decode_events",
    "open_inotify",
    "wait_for_removal",
]

IN_MODIFY = 0x00000002
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
WATCH_MASK = IN_MODIFY | IN_CREATE | IN_MOVED_TO

_EVENT_HEADER = struct.Struct("iIII")


@dataclass(frozen=True, slots=True)
class InotifyEvent:
    wd: int
    mask: int
    name: str


def decode_events(buf: bytes) -> list[InotifyEvent]:
    """Pure: the ``struct inotify_event`` records in one read."""
    events = []
    offset = 0
    while offset + _EVENT_HEADER.size <= len(buf):
        wd, mask, _cookie, length = _EVENT_HEADER.unpack_from(buf, offset)
        offset += _EVENT_HEADER.size
        raw = buf[offset : offset + length]
        offset += length
        events.append(InotifyEvent(wd, mask, raw.split(b"\0", 1)[0].decode("utf-8", "replace")))
    return events


class Inotify:
    """One non-blocking inotify descriptor and its directory watches."""

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._libc = libc
        self.fd = fd
        self._paths: dict[int, str] = {}
        self._watched: set[str] = set()
        self.exhausted = False

    def watch(self, path: str, mask: int = WATCH_MASK) -> bool:
        """Watch ``path`` (once); False when the kernel refuses (gone, or out of watches)."""
        if path in self._watched or self.exhausted:
            return path in self._watched
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            if ctypes.get_errno() == errno_mod.ENOSPC:
                self.exhausted = True
            return False
        self._paths[wd] = path
        self._watched.add(path)
        return True

    def sync(self, paths: Iterable[str]) -> None:
        """Watch exactly ``paths``: add new ones, drop the rest.

        cgroupfs sends no delete events for a removed cgroup, so a directory that vanished
        is only noticed by its absence from the latest scan; dropping its watch lets a new
        cgroup at the same path be watched again.
        """
        wanted = set(paths)
        self.exhausted = False
        for wd, path in list(self._paths.items()):
            if path not in wanted:
                self._libc.inotify_rm_watch(self.fd, wd)
                del self._paths[wd]
                self._watched.discard(path)
        for path in wanted:
            if not self.watch(path) and self.exhausted:
                return

    def path_of(self, wd: int) -> str | None:
        return self._paths.get(wd)

    @property
    def watched(self) -> int:
        return len(self._watched)

    def read_events(self) -> list[InotifyEvent]:
        """Everything queued now (non-blocking); dropped watches are forgotten."""
        events: list[InotifyEvent] = []
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not buf:
                break
            events += decode_events(buf)
        for ev in events:
            if ev.mask & IN_IGNORED:
                path = self._paths.pop(ev.wd, None)
                if path is not None:
                    self._watched.discard(path)
        return events

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class EntryWatch:
    """A lasting watch for ``directory/name`` being created (bound, or renamed into place).

    The NRI session keeps one for its whole life: `clear` just before each dial, then
    `wait` after a failed or ended session wakes on any creation since that `clear`, so a
    socket the runtime binds between our dial and our wait is not missed (issue 24: a
    watch set up only after the failure missed such a socket until the backoff ended).
    Without inotify, or while the directory is missing, `wait` falls back to a timer (the
    directory is looked for again every `ARM_RETRY` seconds).
    """

    ARM_RETRY = 1.0

    def __init__(self, directory: str, name: str) -> None:
        self.directory = directory
        self.name = name
        self._notify: Inotify | None = None
        self._armed = False
        self._maybe_created = False

    def __enter__(self) -> EntryWatch:
        self._notify = open_inotify()
        self._arm()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._notify is not None:
            self._notify.close()
            self._notify = None
        self._armed = False

    @property
    def available(self) -> bool:
        """False where inotify is missing: `wait` is then only a timer."""
        return self._notify is not None

    def _arm(self) -> bool:
        if not self._armed and self._notify is not None:
            self._armed = self._notify.watch(self.directory, IN_CREATE | IN_MOVED_TO)
        return self._armed

    def _take_events(self) -> None:
        """Read what is queued; note a creation of ``name``, a lost watch or an overflow
        (either may hide one)."""
        assert self._notify is not None
        for ev in self._notify.read_events():
            if ev.mask & IN_Q_OVERFLOW:
                self._maybe_created = True
            elif ev.mask & IN_IGNORED:
                self._armed = False
                self._maybe_created = True
            elif ev.mask & (IN_CREATE | IN_MOVED_TO) and ev.name == self.name:
                self._maybe_created = True

    def clear(self) -> None:
        """Forget creations so far: the caller is about to look at the entry itself."""
        if self._notify is not None and self._armed:
            self._take_events()
        self._maybe_created = False
        self._arm()

    async def wait(self, timeout: float) -> bool:
        """True once ``name`` was created since the last `clear` (at once if it already
        was), False after ``timeout`` seconds without that."""
        with trio.move_on_after(timeout):
            notify = self._notify
            if notify is None:
                await trio.sleep_forever()
            while True:
                if not self._armed:
                    if not self._arm():
                        await trio.sleep(self.ARM_RETRY)
                        continue
                    # The directory is back: an entry in it now is one nobody dialled.
                    if os.path.exists(os.path.join(self.directory, self.name)):
                        self._maybe_created = True
                self._take_events()
                if self._maybe_created:
                    return True
                await trio.lowlevel.wait_readable(notify.fd)
        return False


async def wait_for_removal(directory: str, name: str, *, recheck: float = 5.0) -> None:
    """Return once ``directory/name`` no longer exists.

    inotify wakes this at once on a delete or rename; a look every ``recheck`` seconds
    also covers the directory itself being removed (its watch is then dropped) and
    machines without inotify.
    """
    path = os.path.join(directory, name)
    while os.path.exists(path):
        notify = open_inotify()
        try:
            if notify is None or not notify.watch(directory, IN_DELETE | IN_MOVED_FROM):
                await trio.sleep(recheck)
                continue
            with trio.move_on_after(recheck):
                while os.path.exists(path):
                    await trio.lowlevel.wait_readable(notify.fd)
                    notify.read_events()
        finally:
            if notify is not None:
                notify.close()


def open_inotify() -> Inotify | None:
    """An inotify instance, or None where the C library or the kernel does not offer one."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        init1 = libc.inotify_init1
    except (OSError, AttributeError):
        return None
    init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    fd = init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        return None
    return Inotify(libc, fd)
