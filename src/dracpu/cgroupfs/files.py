"""One cgroup file at a time: read it, write it, parse its set.

``OSError`` stops here: every failure becomes a :class:`CgroupWriteError` that names the
file and the errno.
"""

from __future__ import annotations

import errno as errno_mod
import os

from dracpu.cgroupfs.plan import CgroupWriteError
from dracpu.cpuset import CPUSet, CPUSetParseError

__all__ = [
    "CPUS_FILE",
    "MEMS_FILE",
    "parse_set",
    "read_cgroup_file",
    "read_if_present",
    "write_cgroup_file",
]

CPUS_FILE = "cpuset.cpus"
MEMS_FILE = "cpuset.mems"


def read_if_present(path: str) -> str | None:
    """One cgroup file's content, stripped, or None when the file does not exist."""
    # Absent files are routine (fake trees have no effective files, pod levels no cpuset
    # files): answer None without building an exception on that path.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CgroupWriteError(path, exc.errno or errno_mod.EIO) from exc
    try:
        return os.read(fd, 65536).decode("ascii", "replace").strip()
    except OSError as exc:
        raise CgroupWriteError(path, exc.errno or errno_mod.EIO) from exc
    finally:
        os.close(fd)


def read_cgroup_file(path: str) -> str:
    """One cgroup file's content, stripped; OSError becomes :class:`CgroupWriteError`."""
    text = read_if_present(path)
    if text is None:
        raise CgroupWriteError(path, errno_mod.ENOENT)
    return text


def write_cgroup_file(path: str, value: str) -> None:
    """Write ``value`` into an existing cgroup file in one write(2)."""
    # No O_CREAT: a missing file means a missing cgroup, which must be an error, and
    # O_NOFOLLOW keeps a planted symlink from redirecting the write.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise CgroupWriteError(path, exc.errno or errno_mod.EIO) from exc
    try:
        data = value.encode("ascii")
        os.write(fd, data)
        # cgroupfs parses each write on its own and reports size 0; a plain file (a fake
        # tree) keeps its old tail, cut here. Not O_TRUNC: ext4 turns truncate-then-write
        # into a synchronous block allocation, 100 times slower than the write.
        if os.fstat(fd).st_size > len(data):
            os.ftruncate(fd, len(data))
    except OSError as exc:
        raise CgroupWriteError(path, exc.errno or errno_mod.EIO) from exc
    finally:
        os.close(fd)


def parse_set(path: str, text: str) -> CPUSet:
    """The set read from ``path``; content that is no set is an EINVAL on that file."""
    try:
        return CPUSet.parse(text)
    except CPUSetParseError as exc:
        raise CgroupWriteError(path, errno_mod.EINVAL, f"unparsable content: {exc}") from exc
