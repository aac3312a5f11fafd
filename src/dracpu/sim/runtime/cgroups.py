"""The simulated node's cgroup tree: cgroup v1 cpuset files in a directory, written as runc does.

Layout (cgroup v1, cgroupfs driver): a container whose ``linux.cgroups_path`` is
``/kubepods/pod<uid>/<id>`` has its cpuset in ``<root>/cpuset/kubepods/pod<uid>/<id>/``
(``cpuset.cpus`` and ``cpuset.mems``). The kernel's v1 rules are enforced so that a writer
that gets them wrong fails here as it would on a node:

- a new cpuset cgroup starts empty; runc copies the parent's values into it before use;
- a child's CPUs and memory nodes must be a subset of its parent's (else ``EINVAL``), so
  runc widens the ancestors first, top down, before writing a wider value into a leaf.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from dracpu.cpuset import CPUSet, CPUSetParseError

__all__ = ["CgroupTree", "CgroupTreeError"]

_FILES = ("cpuset.cpus", "cpuset.mems")


class CgroupTreeError(OSError):
    """A write the kernel would refuse, or a path outside the tree."""


class CgroupTree:
    """The ``cpuset`` hierarchy under ``root`` (no I/O until a method is called)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.cpuset_root = self.root / "cpuset"
        self._root_str = str(self.cpuset_root)
        self._cache: dict[tuple[str, str], CPUSet] = {}

    def _parts(self, cgroups_path: str) -> list[str]:
        parts = [p for p in cgroups_path.split("/") if p]
        if any(p in (".", "..") for p in parts) or ":" in cgroups_path:
            raise CgroupTreeError(
                errno.EINVAL, f"cgroups path {cgroups_path!r} is not a cgroupfs path in the tree"
            )
        return parts

    def path_of(self, cgroups_path: str) -> Path:
        """The directory of a cgroupfs-driver ``cgroups_path``; refuses escapes."""
        return self.cpuset_root.joinpath(*self._parts(cgroups_path))

    def ensure_root(self, cpus: str, mems: str) -> None:
        """Create the hierarchy root holding every CPU and memory node of the node."""
        self.cpuset_root.mkdir(parents=True, exist_ok=True)
        for name, value in zip(_FILES, (cpus, mems), strict=True):
            target = self.cpuset_root / name
            if not target.exists():
                target.write_text(value + "\n")

    @staticmethod
    def _read(directory: str | Path, name: str) -> CPUSet:
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                return CPUSet.parse(f.read().strip())
        except FileNotFoundError:
            return CPUSet()
        except CPUSetParseError as exc:
            raise CgroupTreeError(errno.EINVAL, f"{path}: {exc}") from exc

    def _chain(self, directory: Path) -> list[Path]:
        """Ancestors below the hierarchy root, top down, ending with `directory`."""
        chain: list[Path] = []
        cur = directory
        while cur != self.cpuset_root:
            chain.append(cur)
            cur = cur.parent
        chain.reverse()
        return chain

    def ensure(self, cgroups_path: str) -> Path:
        """Create the cgroup and any missing ancestor, each inheriting its parent's values."""
        directory = self.path_of(cgroups_path)
        for cgroup in self._chain(directory):
            if cgroup.is_dir():
                continue
            cgroup.mkdir()
            for name in _FILES:
                parent_value = (cgroup.parent / name).read_text().strip()
                self._put(cgroup / name, parent_value)
        return directory

    def write(self, cgroups_path: str, *, cpus: str = "", mems: str = "") -> None:
        """Set the cgroup's ``cpuset.cpus`` / ``cpuset.mems`` (empty = leave alone)."""
        directory = "/".join([self._root_str, *self._parts(cgroups_path)])
        parent = directory.rpartition("/")[0]
        for name, text in zip(_FILES, (cpus, mems), strict=True):
            if not text:
                continue
            try:
                value = CPUSet.parse(text)
            except CPUSetParseError as exc:
                raise CgroupTreeError(errno.EINVAL, f"{name} {text!r}: {exc}") from exc
            if not value:
                raise CgroupTreeError(errno.EINVAL, f"{name} of {cgroups_path} cannot be empty")
            top = self._cached(self._root_str, name)
            if not value <= top:
                raise CgroupTreeError(
                    errno.EINVAL,
                    f"{name} {value} of {cgroups_path} is not within the node's {top}",
                )
            if not value <= self._cached(parent, name):
                # Missing, or widened by another writer meanwhile: look again before widening.
                self.ensure(cgroups_path)
                self._cache.pop((parent, name), None)
                if not value <= self._cached(parent, name):
                    for ancestor in self._chain(self.path_of(cgroups_path))[:-1]:
                        held = self._read(ancestor, name)
                        if not value <= held:
                            self._put(os.path.join(ancestor, name), (held | value).format())
                            self._cache[(str(ancestor), name)] = held | value
            leaf = f"{directory}/{name}"
            try:
                self._put(leaf, value.format())
            except FileNotFoundError:
                self.ensure(cgroups_path)
                self._put(leaf, value.format())

    def _cached(self, directory: str, name: str) -> CPUSet:
        # Ancestors change only by widening (ours, or a fallback writer's), so a cached
        # value is at worst narrower than the file: a miss re-reads it before acting.
        key = (directory, name)
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = self._read(directory, name)
        return value

    @staticmethod
    def _put(path: str | Path, text: str) -> None:
        # No O_TRUNC: truncating to zero makes ext4 flush on close (auto_da_alloc), which a
        # cgroupfs write never costs.
        data = (text + "\n").encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def read(self, cgroups_path: str, name: str = "cpuset.cpus") -> str:
        return (self.path_of(cgroups_path) / name).read_text().strip()

    def remove(self, cgroups_path: str) -> None:
        """Remove an (empty) cgroup directory; a missing one is fine."""
        directory = self.path_of(cgroups_path)
        if not directory.is_dir():
            return
        for name in _FILES:
            (directory / name).unlink(missing_ok=True)
            self._cache.pop((str(directory), name), None)
        try:
            directory.rmdir()
        except OSError as exc:
            raise CgroupTreeError(exc.errno, f"cannot remove {directory}: {exc}") from exc
