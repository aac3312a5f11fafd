"""The demo's CPU hotplug step: a CPU of a running claim taken offline, then back.

A pod annotated ``demo.dracpu.io/offline-cpu-after-start: "true"`` has, once it runs, the
highest CPU of its claims taken offline in the demo's own copy of the sysfs tree (the
daemon reads that copy; the machine's CPUs are never touched). The demo waits until the
daemon reports the claim's device UNHEALTHY, says so, brings the CPU back and waits until
the device is healthy again. Needs ``--sysfs-root`` naming a directory (a fixture such as
tests/fake_sysfs/xeon-2s-ht), which the demo copies into its work directory.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

import trio

from dracpu.cpuset import CPUSet
from dracpu_sim.demo.scenario import Scenario
from dracpu_sim.node import SimNode

__all__ = ["OFFLINE_AFTER_START", "pods_to_offline", "set_cpu_online", "writable_sysfs"]

OFFLINE_AFTER_START = "demo.dracpu.io/offline-cpu-after-start"
WAIT = 20.0  # the daemon polls the online CPUs every 2 s; a loaded machine is slower


class OfflineError(Exception):
    """The step cannot run (no sysfs directory) or the daemon did not react in time."""


def pods_to_offline(scenario: Scenario) -> list[str]:
    """``namespace/name`` of the pods marked for the step, in scenario order."""
    out = []
    for pod in scenario.pods:
        meta = pod["metadata"]
        if str((meta.get("annotations") or {}).get(OFFLINE_AFTER_START, "")).lower() == "true":
            out.append(f"{meta.get('namespace', 'default')}/{meta['name']}")
    return out


def writable_sysfs(root: str, workdir: str) -> str:
    """A copy of the sysfs tree the demo may change; raises OfflineError for a report."""
    if not os.path.isdir(root) or os.path.realpath(root) == "/sys":
        raise OfflineError(
            f"{OFFLINE_AFTER_START} needs --sysfs-root naming a sysfs tree directory the demo "
            f"can copy (e.g. tests/fake_sysfs/xeon-2s-ht), not {root!r}"
        )
    copy = os.path.join(workdir, "sysfs")
    shutil.copytree(root, copy, symlinks=True)
    return copy


def set_cpu_online(sysfs: str, cpu: int, online: bool) -> None:
    """Flip one CPU in the copied tree as the kernel shows a hotplug."""
    cpu_dir = os.path.join(sysfs, "devices/system/cpu")
    with open(os.path.join(cpu_dir, f"cpu{cpu}", "online"), "w") as f:
        f.write("1\n" if online else "0\n")
    with open(os.path.join(cpu_dir, "online")) as f:
        now = CPUSet.parse(f.read().strip())
    now = now | CPUSet([cpu]) if online else now - CPUSet([cpu])
    with open(os.path.join(cpu_dir, "online"), "w") as f:
        f.write(f"{now.format()}\n")


async def _unhealthy(node: SimNode) -> dict[str, str]:
    state = await node.debug_state()
    marks: dict[str, str] = dict((state.get("health") or {}).get("unhealthy") or {})
    return marks


async def offline_round_trip(
    node: SimNode, sysfs: str, ref: str, cpus: CPUSet, progress: Callable[[str], None]
) -> None:
    """Take the highest of ``cpus`` offline and back; raises OfflineError on a timeout."""
    cpu = cpus.max()
    set_cpu_online(sysfs, cpu, False)
    with trio.move_on_after(WAIT):
        while not (marks := await _unhealthy(node)):
            await trio.sleep(0.1)
        for device, why in sorted(marks.items()):
            progress(f"pod {ref}: CPU {cpu} taken offline: device {device} UNHEALTHY ({why})")
        set_cpu_online(sysfs, cpu, True)
        while await _unhealthy(node):
            await trio.sleep(0.1)
        progress(f"pod {ref}: CPU {cpu} back online: the claim's device is healthy again")
        return
    set_cpu_online(sysfs, cpu, True)
    raise OfflineError(f"pod {ref}: the daemon did not report CPU {cpu} going offline in time")
