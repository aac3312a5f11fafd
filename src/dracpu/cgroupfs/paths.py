"""From a runtime's ``linux.cgroups_path`` to the cpuset cgroup directory on disk.

Two cgroup drivers name a container's cgroup differently:

- cgroupfs: a path such as ``/kubepods/burstable/pod<uid>/<id>``, taken relative to the
  hierarchy that carries the cpuset controller;
- systemd: ``slice:prefix:name`` (runc's rules): the slice, ``system.slice`` when empty and
  the root for ``-.slice``, expands by its dashes into nested parents
  (``a-b-c.slice`` -> ``a.slice/a-b.slice/a-b-c.slice``); the unit is ``<prefix>-<name>.scope``
  unless ``name`` itself ends in ``.slice``.

Two hierarchies carry the cpuset controller: cgroup v1 mounts it at ``<root>/cpuset``, cgroup
v2 has one unified tree at ``<root>`` (``cgroup.controllers`` present). Everything here is
pure except :func:`detect_layout` and the symlink check of :func:`resolve`, which are thin
reads over pure cores. A path that would land outside the hierarchy is refused.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Collection
from dataclasses import dataclass

__all__ = [
    "CgroupLayout",
    "CgroupPathError",
    "detect_layout",
    "expand_slice",
    "layout_from_listing",
    "relative_parts",
    "resolve",
    "resolve_lexical",
]

SLICE_SUFFIX = ".slice"
DEFAULT_SLICE = "system.slice"


class CgroupPathError(ValueError):
    """A cgroups path cannot be turned into a directory inside the cgroup hierarchy."""


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """Where the cpuset controller lives and which file names it uses.

    ``root`` is the cgroup mount root as configured (``--cgroup-root``); ``hierarchy`` is the
    directory that holds the cpuset cgroups (``<root>/cpuset`` on v1, ``<root>`` on v2).
    """

    root: str
    hierarchy: str
    version: int

    @property
    def effective_cpus_file(self) -> str:
        return "cpuset.effective_cpus" if self.version == 1 else "cpuset.cpus.effective"

    @property
    def effective_mems_file(self) -> str:
        return "cpuset.effective_mems" if self.version == 1 else "cpuset.mems.effective"

    @property
    def parents_must_contain_children(self) -> bool:
        """v1 refuses a child cpuset outside its parent's; v2 silently intersects."""
        return self.version == 1


def layout_from_listing(
    root: str, root_entries: Collection[str], cpuset_entries: Collection[str] | None
) -> CgroupLayout:
    """Pure core of :func:`detect_layout`.

    ``root_entries`` are the names in ``root``; ``cpuset_entries`` the names in
    ``<root>/cpuset`` or None when that is not a directory.
    """
    root = posixpath.normpath(root)
    if "cgroup.controllers" in root_entries:
        return CgroupLayout(root=root, hierarchy=root, version=2)
    if cpuset_entries is not None:
        return CgroupLayout(root=root, hierarchy=posixpath.join(root, "cpuset"), version=1)
    if "cpuset.cpus" in root_entries:
        # The v1 cpuset mount itself was given as the root.
        return CgroupLayout(root=root, hierarchy=root, version=1)
    raise CgroupPathError(
        f"no cpuset cgroup hierarchy under {root!r}: expected {root}/cgroup.controllers "
        f"(cgroup v2) or a {root}/cpuset directory (cgroup v1)"
    )


def detect_layout(cgroup_root: str) -> CgroupLayout:
    """Read the cgroup root and tell v1 from v2 (see :func:`layout_from_listing`)."""
    try:
        root_entries = os.listdir(cgroup_root)
    except OSError as exc:
        raise CgroupPathError(
            f"cannot read cgroup root {cgroup_root!r}: {os.strerror(exc.errno or 0)}"
        ) from exc
    cpuset_dir = os.path.join(cgroup_root, "cpuset")
    cpuset_entries: list[str] | None = None
    if "cpuset" in root_entries and os.path.isdir(cpuset_dir):
        try:
            cpuset_entries = os.listdir(cpuset_dir)
        except OSError as exc:
            raise CgroupPathError(
                f"cannot read {cpuset_dir!r}: {os.strerror(exc.errno or 0)}"
            ) from exc
    return layout_from_listing(cgroup_root, root_entries, cpuset_entries)


def expand_slice(slice_name: str) -> list[str]:
    """``a-b-c.slice`` -> ``["a.slice", "a-b.slice", "a-b-c.slice"]``; ``-.slice`` -> ``[]``."""
    if not slice_name.endswith(SLICE_SUFFIX) or slice_name == SLICE_SUFFIX:
        raise CgroupPathError(f"invalid systemd slice {slice_name!r}: must end in '.slice'")
    if "/" in slice_name:
        raise CgroupPathError(f"invalid systemd slice {slice_name!r}: contains '/'")
    stem = slice_name.removesuffix(SLICE_SUFFIX)
    if stem == "-":
        return []
    parts: list[str] = []
    prefix = ""
    for component in stem.split("-"):
        if component == "":
            raise CgroupPathError(
                f"invalid systemd slice {slice_name!r}: empty component between dashes"
            )
        parts.append(prefix + component + SLICE_SUFFIX)
        prefix += component + "-"
    return parts


def _systemd_parts(cgroups_path: str) -> list[str]:
    fields = cgroups_path.split(":")
    if len(fields) != 3:
        raise CgroupPathError(
            f"invalid systemd cgroups path {cgroups_path!r}: expected 'slice:prefix:name'"
        )
    slice_name, prefix, name = fields
    if name == "" or "/" in name or "/" in prefix or name in (".", ".."):
        raise CgroupPathError(
            f"invalid systemd cgroups path {cgroups_path!r}: bad unit name {name!r}"
        )
    parts = expand_slice(slice_name or DEFAULT_SLICE)
    parts.append(name if name.endswith(SLICE_SUFFIX) else f"{prefix}-{name}.scope")
    return parts


def relative_parts(cgroups_path: str) -> list[str]:
    """The directory components below the hierarchy root, checked to stay inside it."""
    if cgroups_path == "":
        raise CgroupPathError("empty cgroups path")
    if "\x00" in cgroups_path:
        raise CgroupPathError(f"invalid cgroups path {cgroups_path!r}: contains NUL")
    if ":" in cgroups_path and not cgroups_path.startswith("/"):
        return _systemd_parts(cgroups_path)
    parts: list[str] = []
    for component in cgroups_path.split("/"):
        if component in ("", "."):
            continue
        if component == "..":
            if not parts:
                raise CgroupPathError(
                    f"cgroups path {cgroups_path!r} escapes the cgroup root through '..'"
                )
            parts.pop()
            continue
        parts.append(component)
    if not parts:
        raise CgroupPathError(f"cgroups path {cgroups_path!r} names the cgroup root itself")
    return parts


def resolve_lexical(layout: CgroupLayout, cgroups_path: str) -> str:
    """Pure: the container's directory under ``layout.hierarchy``, without touching disk."""
    return posixpath.join(layout.hierarchy, *relative_parts(cgroups_path))


def _within(base: str, path: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def resolve(layout_or_root: CgroupLayout | str, cgroups_path: str) -> str:
    """The container's directory, refusing paths that leave the hierarchy.

    A string is taken as the cgroup root and its layout detected. After the lexical checks,
    symlinks are followed so a link pointing outside the hierarchy is refused too; a
    directory that does not exist yet resolves lexically.
    """
    layout = (
        layout_or_root
        if isinstance(layout_or_root, CgroupLayout)
        else (detect_layout(layout_or_root))
    )
    path = resolve_lexical(layout, cgroups_path)
    base = os.path.realpath(layout.hierarchy)
    real = os.path.realpath(path)
    if not _within(base, real) or real == base:
        raise CgroupPathError(
            f"cgroups path {cgroups_path!r} resolves to {real!r}, outside the cgroup "
            f"hierarchy {base!r}"
        )
    return path
