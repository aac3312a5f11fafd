"""Fake cgroup trees in a temp dir, laid out the way runc and the NRI simulator write them."""

from __future__ import annotations

from pathlib import Path

from dracpu.messages import ContainerIntent


def v1_root(tmp: Path, cpus: str = "0-7", mems: str = "0-1") -> Path:
    """A cgroup root with a v1 cpuset mount at ``<root>/cpuset``; returns the root."""
    hierarchy = tmp / "cpuset"
    hierarchy.mkdir(parents=True)
    (hierarchy / "cpuset.cpus").write_text(cpus + "\n")
    (hierarchy / "cpuset.mems").write_text(mems + "\n")
    return tmp


def v2_root(tmp: Path, cpus: str = "0-7") -> Path:
    """A unified (v2) cgroup root."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp / "cpuset.cpus.effective").write_text(cpus + "\n")
    return tmp


def make_cgroup(
    hierarchy: Path, rel: str, cpus: str | None = "0-7", mems: str | None = "0-1"
) -> Path:
    """mkdir -p ``rel`` under the hierarchy; cpuset files only in the last directory."""
    directory = hierarchy / rel.strip("/")
    directory.mkdir(parents=True, exist_ok=True)
    if cpus is not None:
        (directory / "cpuset.cpus").write_text(cpus + "\n")
    if mems is not None:
        (directory / "cpuset.mems").write_text(mems + "\n")
    return directory


def read(path: Path) -> str:
    return path.read_text().strip()


def intent(cid: str, pod: str = "p1", cpus: str = "0-1", mems: str = "") -> ContainerIntent:
    """A container in the simulator's convention: ``/kubepods/pod<uid>/<id>``."""
    return ContainerIntent(
        container_id=cid,
        cgroups_path=f"/kubepods/pod{pod}/{cid}",
        cpus=cpus,
        mems=mems,
        pod_uid=pod,
        name=f"ctr-{cid}",
    )
