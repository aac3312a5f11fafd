"""Fake cgroup trees in a temp dir, laid out the way runc and the NRI simulator write them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import trio

from dracpu.cgroupfs.drift import DriftReport
from dracpu.cgroupfs.watcher import DriftWatcher
from dracpu.cpuset import CPUSet
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


class FakeView:
    """An ``IntentView`` over plain data the test changes at will.

    ``on_list`` (optional) runs right after the drift watcher took the list of intents,
    so a test can move the owner on while the check reads. ``asked`` records the ids of
    each ``still_wanted`` question, in order.
    """

    def __init__(
        self,
        intents: Iterable[ContainerIntent] = (),
        pool: str = "",
        *,
        synchronized: bool = True,
        on_list: Callable[[], None] | None = None,
    ) -> None:
        self.owner = {i.container_id: i for i in intents}
        self.pool = pool
        self.synchronized = synchronized
        self.on_list = on_list
        self.asked: list[list[str]] = []

    def set(self, intents: Iterable[ContainerIntent]) -> None:
        self.owner = {i.container_id: i for i in intents}

    def intents(self) -> list[ContainerIntent]:
        listed = list(self.owner.values())
        if self.on_list is not None:
            self.on_list()
        return listed

    def intents_of(self, ids: Iterable[str]) -> dict[str, ContainerIntent]:
        return {i: self.owner[i] for i in ids if i in self.owner}

    def still_wanted(self, intents: Iterable[ContainerIntent]) -> list[ContainerIntent]:
        asked = list(intents)
        self.asked.append([i.container_id for i in asked])
        current = self.intents_of(i.container_id for i in asked)
        return [
            i
            for i in asked
            if (c := current.get(i.container_id)) is not None
            and c.cpus == i.cpus
            and (not i.mems or c.mems == i.mems)
        ]

    @property
    def shared_pool(self) -> CPUSet:
        return CPUSet.parse(self.pool)

    @property
    def has_synchronized(self) -> bool:
        return self.synchronized


async def check_with_writer(watcher: DriftWatcher, view: FakeView) -> DriftReport:
    """One drift check with its writer task running, as in the daemon."""
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.writer.run, view)
        report = await watcher.check()
        nursery.cancel_scope.cancel()
    return report


def check(watcher: DriftWatcher, view: FakeView) -> DriftReport:
    """:func:`check_with_writer` from a synchronous test."""
    return trio.run(check_with_writer, watcher, view)
