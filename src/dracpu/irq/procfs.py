"""Reading and writing ``<proc root>/irq`` (blocking: call from a worker thread).

The proc root is a flag (``--proc-root``) so tests and the simulated node point dracpu at a
fake procfs tree: ``irq/default_smp_affinity`` and ``irq/<N>/smp_affinity_list`` as plain
files. On a real kernel (kernel/irq/proc.c) a write is one ``write(2)`` of the whole text;
``write_irq_affinity`` fails it with EIO (EPERM since Linux 6.12) when
``irq_can_set_affinity_usr`` is false: managed interrupts (the kernel spreads a device's
queue vectors itself), per-CPU ones and those flagged ``IRQF_NOBALANCING``. A mask with no
online CPU is refused with EINVAL; a vector space that is full (x86) gives ENOSPC.
"""

from __future__ import annotations

import errno
import os

from dracpu.cpuset import CPUSet
from dracpu.irq.masks import HexMask, MaskFormatError, parse_cpu_list, parse_hex_mask

__all__ = ["REFUSED_ERRNOS", "IrqFileError", "IrqWriteError", "ProcIrq"]

# What write_irq_affinity returns for an interrupt whose affinity user space may not set:
# -EIO until Linux 6.11, -EPERM from 6.12 ("genirq/proc: Change the return value for set
# affinity permission error").
REFUSED_ERRNOS = frozenset({errno.EIO, errno.EPERM})
_READ_LIMIT = 64 * 1024


class IrqFileError(Exception):
    """A file under /proc/irq could not be read or holds what no kernel prints."""


class IrqWriteError(Exception):
    """A mask write failed; ``refused`` when the kernel does not let anyone move it."""

    def __init__(self, path: str, errno_: int, strerror: str) -> None:
        super().__init__(path, errno_, strerror)
        self.path = path
        self.errno = errno_
        self.strerror = strerror

    @property
    def refused(self) -> bool:
        return self.errno in REFUSED_ERRNOS

    @property
    def gone(self) -> bool:
        return self.errno == errno.ENOENT

    def __str__(self) -> str:
        return f'cannot write "{self.path}": {self.strerror}'


class ProcIrq:
    """The interrupt files of one proc root."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.root = os.path.join(proc_root, "irq")

    @property
    def default_path(self) -> str:
        return os.path.join(self.root, "default_smp_affinity")

    def affinity_path(self, irq: int) -> str:
        return os.path.join(self.root, str(irq), "smp_affinity_list")

    def _read(self, path: str) -> str:
        try:
            with open(path, "rb") as f:
                data = f.read(_READ_LIMIT + 1)
        except OSError as exc:
            raise IrqFileError(f'cannot read "{path}": {exc.strerror or exc}') from None
        if len(data) > _READ_LIMIT:
            raise IrqFileError(f'cannot read "{path}": more than {_READ_LIMIT} bytes')
        try:
            return data.decode("ascii")
        except UnicodeDecodeError:
            raise IrqFileError(f'"{path}" holds bytes that are not ASCII: {data[:40]!r}') from None

    def read_default(self) -> HexMask:
        text = self._read(self.default_path)
        try:
            return parse_hex_mask(text)
        except MaskFormatError as exc:
            raise IrqFileError(f'"{self.default_path}": {exc}') from None

    def irqs(self) -> list[int]:
        """The interrupt numbers that have a directory, ascending."""
        try:
            names = os.listdir(self.root)
        except OSError as exc:
            raise IrqFileError(f'cannot list "{self.root}": {exc.strerror or exc}') from None
        return sorted(int(n) for n in names if n.isascii() and n.isdigit())

    def read_affinity(self, irq: int) -> CPUSet:
        path = self.affinity_path(irq)
        text = self._read(path)
        try:
            return parse_cpu_list(text)
        except MaskFormatError as exc:
            raise IrqFileError(f'"{path}": {exc}') from None

    def _write(self, path: str, text: str) -> None:
        data = (text + "\n").encode("ascii")
        try:
            # No O_CREAT: an interrupt whose directory went away is reported, not recreated.
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            raise IrqWriteError(path, exc.errno or 0, exc.strerror or str(exc)) from None

    def write_default(self, mask: HexMask) -> None:
        self._write(self.default_path, mask.format())

    def write_affinity(self, irq: int, cpus: CPUSet) -> None:
        self._write(self.affinity_path(irq), cpus.format())
