"""Whole-file replacement that readers never see half done, and durable directory changes.

The CDI specs and the checkpoint are written this way: a temp file in the same directory,
fsync, rename over the target, fsync of the directory. A crash leaves the old file or the
new one, never a mix, and never the temp file under the final name. Blocking: call these
from a worker thread in async code, unless the directory is on tmpfs.
"""

from __future__ import annotations

import contextlib
import os
import random

__all__ = ["atomic_write", "ensure_dir", "fsync_dir", "write_all"]


def fsync_dir(path: str) -> None:
    """Make the directory's entries (a rename, an unlink) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path: str, mode: int = 0o755) -> None:
    """Create ``path`` (and its parents) with exactly ``mode`` when it does not exist."""
    if os.path.isdir(path):
        return
    os.makedirs(path, mode=mode, exist_ok=True)
    os.chmod(path, mode)  # makedirs' mode is filtered by the umask


def write_all(fd: int, data: bytes) -> None:
    """``data`` to ``fd`` whole, however many writes it takes."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# Temp names ``spec.<random>.tmp`` (behavior.md §10.1), tried with O_EXCL: a name in use
# (left by a crash, or drawn twice) is passed over. 64 bits from ``random`` need no
# system call; tempfile.mkstemp's names cost twice as much (~11 us against ~5 us on tmpfs)
# and a prepare writes two or three of these. Nothing here needs them unguessable: the
# directories are root's, and O_EXCL with O_NOFOLLOW never opens what another put there.
# (``random`` reseeds itself in a forked child.)
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _temp_file(parent: str) -> tuple[int, str]:
    """A new file ``spec.<random>.tmp`` in ``parent``, mode 0600: its fd and path."""
    while True:
        path = f"{parent}/spec.{random.getrandbits(64):016x}.tmp"
        try:
            return os.open(path, _TEMP_FLAGS, 0o600), path
        except FileExistsError:
            continue


def atomic_write(
    path: str, data: bytes, *, mode: int = 0o600, dir_mode: int = 0o755, durable: bool = True
) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never half.

    The temp name ``spec.*.tmp`` does not end in ``.json``, so runtimes watching a CDI
    directory ignore it. Raises OSError; the temp file never survives a failure. Without
    ``durable`` the file and directory are not fsynced: for tmpfs, where an fsync keeps
    nothing (the rename is atomic either way).
    """
    parent = os.path.dirname(path) or "."
    # The temp file is made 0600 (the umask can only narrow that). The directory is made
    # only when the temp file cannot be: a prepare then costs no stat(2) of a directory
    # that is there every other time.
    try:
        fd, tmp = _temp_file(parent)
    except (FileNotFoundError, NotADirectoryError):
        ensure_dir(parent, dir_mode)  # makes it, or says what is in the way
        fd, tmp = _temp_file(parent)
    try:
        try:
            write_all(fd, data)
            if mode != 0o600:
                os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(parent)
