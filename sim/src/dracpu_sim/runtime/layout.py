"""Where the kubelet and containerd put a pod's cgroups, for both cgroup drivers (pure).

The kubelet names a pod's cgroup after its QoS class (kubernetes
``pkg/kubelet/cm/pod_container_manager_linux.go`` ``GetPodContainerName`` and
``helpers_linux.go`` ``GetPodCgroupNameSuffix``): ``kubepods`` / ``<qos>`` / ``pod<uid>``,
without the QoS level for a guaranteed pod. The cgroupfs driver joins the parts with ``/``
(``CgroupName.ToCgroupfs``); the systemd driver nests slices whose names repeat their
ancestors' (``CgroupName.ToSystemd``, ``cgroup_manager_linux.go``), with each part's ``-``
escaped to ``_``, so ``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice``.
That name is the ``cgroup_parent`` the kubelet gives the runtime for the sandbox.

containerd derives each container's (and the sandbox's) ``linux.cgroups_path`` from it
(``internal/cri/server/podsandbox/helpers_linux.go`` and ``container_create_linux.go``,
``getCgroupsPath``): a parent whose last element ends in ``.slice`` gives runc's systemd form
``<that slice>:cri-containerd:<id>``, anything else ``<parent>/<id>``.

runc turns a systemd ``slice:prefix:name`` into directories by expanding the slice's dashes
(``libcontainer/cgroups/systemd/common.go`` ``ExpandSlice``) and naming the unit
``<prefix>-<name>.scope``. :func:`cgroup_dir_parts` does that here, written apart from the
daemon's own resolver (``dracpu.cgroupfs.paths``) so that a mistake in one shows up against
the other.
"""

from __future__ import annotations

import posixpath
from typing import Final, Literal

__all__ = [
    "CGROUP_DRIVERS",
    "CGROUP_VERSIONS",
    "QOS_CLASSES",
    "CgroupDriver",
    "CgroupLayoutError",
    "QOSClass",
    "cgroup_dir_parts",
    "check_cgroup_flavor",
    "container_cgroups_path",
    "pod_cgroup_parent",
]

QOSClass = Literal["guaranteed", "burstable", "besteffort"]
CgroupDriver = Literal["cgroupfs", "systemd"]

QOS_CLASSES: Final[tuple[QOSClass, ...]] = ("guaranteed", "burstable", "besteffort")
CGROUP_DRIVERS: Final[tuple[CgroupDriver, ...]] = ("cgroupfs", "systemd")
CGROUP_VERSIONS: Final = (1, 2)

_SLICE = ".slice"
# containerd's prefix for the scopes of its containers (getCgroupsPath).
RUNTIME_PREFIX: Final = "cri-containerd"


class CgroupLayoutError(ValueError):
    """A cgroup version, driver, QoS class or cgroups path the simulated node cannot use."""


def check_cgroup_flavor(version: int, driver: str) -> None:
    """Raise :class:`CgroupLayoutError` (one line, naming the choices) for a bad pair."""
    if version not in CGROUP_VERSIONS:
        raise CgroupLayoutError(f"cgroup version must be 1 or 2, got {version!r}")
    if driver not in CGROUP_DRIVERS:
        raise CgroupLayoutError(
            f"cgroup driver must be one of {', '.join(CGROUP_DRIVERS)}, got {driver!r}"
        )


def _check_qos(qos: str) -> None:
    if qos not in QOS_CLASSES:
        raise CgroupLayoutError(f"QoS class must be one of {', '.join(QOS_CLASSES)}, got {qos!r}")


def pod_cgroup_parent(driver: str, qos: str, pod_uid: str) -> str:
    """The pod's cgroup as the kubelet names it: the sandbox's ``cgroup_parent``."""
    _check_qos(qos)
    if not pod_uid or "/" in pod_uid or ":" in pod_uid or pod_uid in (".", ".."):
        raise CgroupLayoutError(f"pod uid {pod_uid!r} cannot name a cgroup")
    parts = ["kubepods"] if qos == "guaranteed" else ["kubepods", qos]
    parts.append(f"pod{pod_uid}")
    if driver == "cgroupfs":
        return "/" + "/".join(parts)
    if driver != "systemd":
        raise CgroupLayoutError(f"unknown cgroup driver {driver!r}")
    # ToSystemd: each part escaped ("-" -> "_"), each slice named after all of its parents.
    escaped = [p.replace("-", "_") for p in parts]
    slices = ["-".join(escaped[: i + 1]) + _SLICE for i in range(len(escaped))]
    return "/" + "/".join(slices)


def container_cgroups_path(cgroup_parent: str, container_id: str) -> str:
    """containerd's ``getCgroupsPath``: the ``linux.cgroups_path`` of a sandbox or container."""
    base = posixpath.basename(cgroup_parent)
    if base.endswith(_SLICE):
        return f"{base}:{RUNTIME_PREFIX}:{container_id}"
    return posixpath.join(cgroup_parent, container_id)


def _expand_slice(slice_name: str, whole: str) -> list[str]:
    """runc's ExpandSlice: ``a-b.slice`` -> ``a.slice/a-b.slice``; ``-.slice`` is the root."""
    stem = slice_name.removesuffix(_SLICE)
    if not slice_name.endswith(_SLICE) or not stem or "/" in stem:
        raise CgroupLayoutError(f"cgroups path {whole!r}: {slice_name!r} is not a slice")
    if stem == "-":
        return []
    words = stem.split("-")
    if "" in words:
        raise CgroupLayoutError(f"cgroups path {whole!r}: {slice_name!r} has an empty word")
    return ["-".join(words[: i + 1]) + _SLICE for i in range(len(words))]


def cgroup_dir_parts(cgroups_path: str) -> list[str]:
    """The directories below the hierarchy root that a cgroups path names, top down.

    A systemd ``slice:prefix:name`` path is expanded as runc does; anything else is a
    cgroupfs path (leading ``/`` optional). Refuses ``.``/``..`` and empty results, so a
    path can never leave the tree.
    """
    if ":" in cgroups_path and not cgroups_path.startswith("/"):
        fields = cgroups_path.split(":")
        if len(fields) != 3 or not fields[2] or "/" in fields[1] + fields[2]:
            raise CgroupLayoutError(
                f"cgroups path {cgroups_path!r} is not a systemd 'slice:prefix:name' path"
            )
        slice_name, prefix, name = fields
        parts = _expand_slice(slice_name or "system.slice", cgroups_path)
        parts.append(name if name.endswith(_SLICE) else f"{prefix}-{name}.scope")
    else:
        parts = [p for p in cgroups_path.split("/") if p]
    if not parts or any(p in (".", "..") or ":" in p for p in parts):
        raise CgroupLayoutError(f"cgroups path {cgroups_path!r} is not a cgroup in the tree")
    return parts
