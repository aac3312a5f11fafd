"""The simulated node's cgroup tree: cpuset files in a directory, written as runc does.

Two hierarchies, chosen by ``version`` (the cgroups path names the same directories in
both; :mod:`dracpu_sim.runtime.layout` expands systemd ``slice:prefix:name`` paths):

cgroup v1 (``<root>/cpuset/...``, ``cpuset.cpus`` and ``cpuset.mems`` in each cgroup). The
kernel's legacy rules are enforced so that a writer that gets them wrong fails here as it
would on a node:

- a new cpuset cgroup starts empty and runc copies the parent's values into it before use
  (runc ``libcontainer/cgroups/fs/cpuset.go``, ``cpusetEnsureParent`` / ``cpusetCopyIfNeeded``);
- a child's CPUs and memory nodes must be a subset of its parent's (else ``EINVAL``), so an
  update widens the ancestors first, top down, before writing a wider value into a leaf.

cgroup v2 (one unified tree at ``<root>``; ``cgroup.controllers`` at the root is what tells
``dracpu.cgroupfs.paths.detect_layout`` it is v2). Only the cpuset controller is simulated:

- each parent has ``cpuset`` in ``cgroup.subtree_control`` (runc writes ``+cpuset`` there,
  ``libcontainer/cgroups/fs2/create.go`` ``CreateCgroupPath``; a read shows ``cpuset``) and
  each child lists it in ``cgroup.controllers``;
- a new cgroup's ``cpuset.cpus`` / ``cpuset.mems`` are empty, meaning "the parent's", and
  runc writes a leaf's set only when the container's spec has one; any set within the
  root's is accepted, a child need not lie within its parent (``EINVAL`` only outside the
  root's CPUs), and runc's update writes just the leaf;
- the effective set (kernel ``Documentation/admin-guide/cgroup-v2.rst``,
  ``cpuset.cpus.effective``) is ``cpuset.cpus`` ∩ the parent's effective set, or the parent's
  effective set when ``cpuset.cpus`` is empty or the intersection is; the root's is every
  CPU of the node.

Limitation: nothing plays the kernel for writers outside this class. The daemon writes
``cpuset.cpus`` files directly, so an effective file on disk would go stale and the daemon,
which reads ``cpuset.cpus.effective`` back after each write when the file exists, would see
its own writes fail. So ``cpuset.cpus.effective`` / ``cpuset.mems.effective`` exist only at
the v2 root (as on a real kernel, where the root has them but no ``cpuset.cpus``), and
readers get a cgroup's effective set from :meth:`CgroupTree.effective_cpus`, computed on
read from the chain of ``cpuset.cpus`` files (what the kernel would enforce); the daemon's
reader falls back to ``cpuset.cpus``, as it does on every tree without effective files.

``writes`` counts this tree's own writes per file (the runtime's, as runc). The daemon's
writes go straight to disk and are not counted here; a test that must count them can watch
the directories with inotify (``IN_CLOSE_WRITE`` per file, one per write of either writer).
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from pathlib import Path

from dracpu.cpuset import CPUSet, CPUSetParseError
from dracpu_sim.runtime.layout import CGROUP_VERSIONS, CgroupLayoutError, cgroup_dir_parts

__all__ = ["CgroupTree", "CgroupTreeError"]

_FILES = ("cpuset.cpus", "cpuset.mems")
_EFFECTIVE = {"cpuset.cpus": "cpuset.cpus.effective", "cpuset.mems": "cpuset.mems.effective"}
_CONTROLLERS = "cgroup.controllers"
_SUBTREE = "cgroup.subtree_control"
# Only the cpuset controller is simulated.
_ENABLED = "cpuset"


class CgroupTreeError(OSError):
    """A write the kernel would refuse, or a path outside the tree."""


class CgroupTree:
    """The cpuset hierarchy under ``root`` (no I/O until a method is called)."""

    def __init__(self, root: str | os.PathLike[str], *, version: int = 1) -> None:
        if version not in CGROUP_VERSIONS:
            raise ValueError(f"cgroup version must be 1 or 2, got {version!r}")
        self.root = Path(root)
        self.version = version
        self.hierarchy = self.root / "cpuset" if version == 1 else self.root
        self._root_str = str(self.hierarchy)
        self._cache: dict[tuple[str, str], CPUSet] = {}
        self.writes: Counter[str] = Counter()
        """Writes by this tree per file, keyed by the path below the hierarchy root."""

    # -- paths ------------------------------------------------------------------------------
    def _parts(self, cgroups_path: str) -> list[str]:
        try:
            return cgroup_dir_parts(cgroups_path)
        except CgroupLayoutError as exc:
            raise CgroupTreeError(errno.EINVAL, str(exc)) from None

    def path_of(self, cgroups_path: str) -> Path:
        """The directory of a cgroups path (cgroupfs or systemd form); refuses escapes."""
        return self.hierarchy.joinpath(*self._parts(cgroups_path))

    def _chain(self, directory: Path) -> list[Path]:
        """Ancestors below the hierarchy root, top down, ending with `directory`."""
        chain: list[Path] = []
        cur = directory
        while cur != self.hierarchy:
            chain.append(cur)
            cur = cur.parent
        chain.reverse()
        return chain

    # -- files ------------------------------------------------------------------------------
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

    def _put(self, path: str | Path, text: str) -> None:
        # No O_TRUNC: truncating to zero makes ext4 flush on close (auto_da_alloc), which a
        # cgroupfs write never costs.
        data = (text + "\n").encode() if text else b""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
        self.writes[os.path.relpath(path, self._root_str)] += 1

    def _top(self, name: str) -> CPUSet:
        """The node's set: the v1 root's file, the v2 root's effective file."""
        return self._cached(self._root_str, name if self.version == 1 else _EFFECTIVE[name])

    def _cached(self, directory: str, name: str) -> CPUSet:
        # Ancestors change only by widening (ours, or a fallback writer's), so a cached
        # value is at worst narrower than the file: a miss re-reads it before acting.
        key = (directory, name)
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = self._read(directory, name)
        return value

    # -- creating ---------------------------------------------------------------------------
    def ensure_root(self, cpus: str, mems: str) -> None:
        """Create the hierarchy root holding every CPU and memory node of the node."""
        self.hierarchy.mkdir(parents=True, exist_ok=True)
        if self.version == 1:
            root_files = dict(zip(_FILES, (cpus, mems), strict=True))
        else:
            root_files = {
                _CONTROLLERS: _ENABLED,
                _SUBTREE: _ENABLED,
                _EFFECTIVE["cpuset.cpus"]: cpus,
                _EFFECTIVE["cpuset.mems"]: mems,
            }
        for name, value in root_files.items():
            target = self.hierarchy / name
            if not target.exists():
                target.write_text(value + "\n")

    def ensure(self, cgroups_path: str) -> Path:
        """Create the cgroup and any missing ancestor as runc does (see the module doc)."""
        directory = self.path_of(cgroups_path)
        for cgroup in self._chain(directory):
            if cgroup.is_dir():
                continue
            cgroup.mkdir()
            if self.version == 1:
                for name in _FILES:
                    self._put(cgroup / name, (cgroup.parent / name).read_text().strip())
                continue
            # runc enables the controller in the parent before it makes the child.
            if not (cgroup.parent / _SUBTREE).read_text().strip():
                self._put(cgroup.parent / _SUBTREE, _ENABLED)
            for name in (*_FILES, _SUBTREE):
                self._put(cgroup / name, "")
            self._put(cgroup / _CONTROLLERS, _ENABLED)
        return directory

    # -- writing ----------------------------------------------------------------------------
    def write(self, cgroups_path: str, *, cpus: str = "", mems: str = "") -> None:
        """Set the cgroup's ``cpuset.cpus`` / ``cpuset.mems`` (empty = leave alone), as
        ``runc update`` does: v1 widens ancestors first, v2 writes only the leaf."""
        directory = "/".join([self._root_str, *self._parts(cgroups_path)])
        for name, text in zip(_FILES, (cpus, mems), strict=True):
            if not text:
                continue
            try:
                value = CPUSet.parse(text)
            except CPUSetParseError as exc:
                raise CgroupTreeError(errno.EINVAL, f"{name} {text!r}: {exc}") from exc
            if not value:
                raise CgroupTreeError(errno.EINVAL, f"{name} of {cgroups_path} cannot be empty")
            top = self._top(name)
            if not value <= top:
                raise CgroupTreeError(
                    errno.EINVAL,
                    f"{name} {value} of {cgroups_path} is not within the node's {top}",
                )
            if self.version == 1:
                self._widen_v1(cgroups_path, directory, name, value)
            leaf = f"{directory}/{name}"
            if not os.path.exists(leaf):
                self.ensure(cgroups_path)
            self._put(leaf, value.format())

    def _widen_v1(self, cgroups_path: str, directory: str, name: str, value: CPUSet) -> None:
        parent = directory.rpartition("/")[0]
        if value <= self._cached(parent, name):
            return
        # Missing, or widened by another writer meanwhile: look again before widening.
        self.ensure(cgroups_path)
        self._cache.pop((parent, name), None)
        if value <= self._cached(parent, name):
            return
        for ancestor in self._chain(self.path_of(cgroups_path))[:-1]:
            held = self._read(ancestor, name)
            if not value <= held:
                self._put(os.path.join(ancestor, name), (held | value).format())
                self._cache[(str(ancestor), name)] = held | value

    # -- reading ----------------------------------------------------------------------------
    def read(self, cgroups_path: str, name: str = "cpuset.cpus") -> str:
        """One file of the cgroup as it holds it (v2: may be empty, meaning inherited)."""
        return (self.path_of(cgroups_path) / name).read_text().strip()

    def effective(self, cgroups_path: str, name: str = "cpuset.cpus") -> CPUSet:
        """What the kernel would enforce for the cgroup, from the files as they are now.

        Raises ``FileNotFoundError`` (an ``OSError``) when the cgroup does not exist.
        """
        directory = self.path_of(cgroups_path)
        if not directory.is_dir():
            raise FileNotFoundError(errno.ENOENT, "no such cgroup", str(directory))
        if self.version == 1:
            # Legacy hierarchy: the effective set is the configured one.
            return self._read(directory, name)
        effective = self._read(self.hierarchy, _EFFECTIVE[name])
        for cgroup in self._chain(directory):
            configured = self._read(cgroup, name)
            narrowed = configured & effective
            if narrowed:
                effective = narrowed
        return effective

    def effective_cpus(self, cgroups_path: str) -> CPUSet:
        return self.effective(cgroups_path, "cpuset.cpus")

    def effective_mems(self, cgroups_path: str) -> CPUSet:
        return self.effective(cgroups_path, "cpuset.mems")

    def write_count(self, cgroups_path: str, name: str = "cpuset.cpus") -> int:
        """How often this tree wrote one file of the cgroup."""
        rel = os.path.join(*self._parts(cgroups_path), name)
        return self.writes[rel]

    # -- removing ---------------------------------------------------------------------------
    def remove(self, cgroups_path: str) -> None:
        """Remove a cgroup without child cgroups (its files go with it); missing is fine."""
        directory = self.path_of(cgroups_path)
        if not directory.is_dir():
            return
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if not entry.is_dir(follow_symlinks=False):
                        os.unlink(entry.path)
                        self._cache.pop((str(directory), entry.name), None)
            directory.rmdir()
        except OSError as exc:
            raise CgroupTreeError(exc.errno, f"cannot remove {directory}: {exc}") from exc
