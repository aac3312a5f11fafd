"""A minimal inotify binding (ctypes, no dependency) so the drift watcher can wake early
and the NRI session can dial as soon as the runtime's socket appears.

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
    "Inotify",
    "InotifyEvent",
    "decode_events",
    "open_inotify",
    "wait_for_entry",
    "wait_for_removal",
]

IN_MODIFY = 0x00000002
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
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


async def wait_for_entry(directory: str, name: str, timeout: float, *, new: bool = False) -> bool:
    """Wait until ``directory/name`` exists (True) or ``timeout`` seconds pass (False).

    With ``new`` only a creation after the call counts: a socket removed and bound again in
    place. The watch is in place before the first look, so an entry created meanwhile is
    not missed. Without inotify (or without the directory) this is a plain sleep, then a
    look (False with ``new``: a re-creation cannot be told from the old entry).
    """
    path = os.path.join(directory, name)
    notify = open_inotify()
    if notify is None or not notify.watch(directory, IN_CREATE | IN_MOVED_TO):
        if notify is not None:
            notify.close()
        await trio.sleep(timeout)
        return not new and os.path.exists(path)
    try:
        with trio.move_on_after(timeout):
            while new or not os.path.exists(path):
                await trio.lowlevel.wait_readable(notify.fd)
                if any(ev.name == name for ev in notify.read_events()):
                    return True
            return True
        return False
    finally:
        notify.close()


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
