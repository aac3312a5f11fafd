"""The hotplug watcher on its own: it sends one ``TopologyChanged`` per change of the online
CPUs (compared with the owner's, their one holder) and changes nothing itself; the owner
applies it; ``report_health`` marks the devices of claims on offline CPUs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import trio
from builders import FAKE_SYSFS
from prometheus_client import CollectorRegistry

from dracpu.allocation.store import AllocationStore, ClaimRecord, PreparedDevice
from dracpu.cpuset import CPUSet
from dracpu.daemon.hotplug import HotplugWatcher, SysfsSource, report_health
from dracpu.devices import DeviceSettings, build_inventory
from dracpu.kubelet.health import HealthService
from dracpu.messages import TopologyChanged
from dracpu.metrics import DriverMetrics
from dracpu.state import NodeState
from dracpu.topology.discover import discover_from_root

FIXTURE = "xeon-2s-ht"


def set_online(sysfs: Path, cpu: int, online: bool) -> None:
    """Take a CPU offline (or back) as the kernel shows it: its own file and the list."""
    cpu_dir = sysfs / "devices/system/cpu"
    (cpu_dir / f"cpu{cpu}" / "online").write_text("1\n" if online else "0\n")
    now = CPUSet.parse((cpu_dir / "online").read_text().strip())
    now = (now | CPUSet([cpu])) if online else (now - CPUSet([cpu]))
    (cpu_dir / "online").write_text(f"{now.format()}\n")


def node(sysfs: Path) -> NodeState:
    topo = discover_from_root(sysfs)
    inventory = build_inventory(topo, DeviceSettings(mode="grouped", group_by="numanode"))
    state = NodeState(AllocationStore(topo.all_cpus, CPUSet()))
    state.use_topology(topo, inventory, topo.online)
    return state


def watched_node(
    tmp_path: Path, buffer: int
) -> tuple[Path, NodeState, HotplugWatcher, trio.MemoryReceiveChannel[TopologyChanged]]:
    """A copy of the fixture's sysfs, its owner, and a watcher polling it every 10 ms into
    a channel of ``buffer`` changes."""
    sysfs = tmp_path / "sys"
    shutil.copytree(FAKE_SYSFS / FIXTURE, sysfs)
    state = node(sysfs)
    send, receive = trio.open_memory_channel[TopologyChanged](buffer)
    watcher = HotplugWatcher(SysfsSource(root=str(sysfs)), state.view, send, interval=0.01)
    return sysfs, state, watcher, receive


async def set_online_and_receive(
    sysfs: Path, cpu: int, online: bool, receive: trio.MemoryReceiveChannel[TopologyChanged]
) -> TopologyChanged:
    """Change the CPU's online state and wait (10 s at most) for the watcher's message."""
    set_online(sysfs, cpu, online)
    with trio.fail_after(10):
        return await receive.receive()


def test_a_bad_interval_is_refused() -> None:
    state = NodeState(AllocationStore(CPUSet.parse("0-3"), CPUSet()))
    send, _ = trio.open_memory_channel[TopologyChanged](1)
    with pytest.raises(ValueError, match="hotplug check interval must be positive, got 0"):
        HotplugWatcher(SysfsSource(root="/nonexistent"), state.view, send, interval=0)


async def test_each_change_is_one_message_the_owner_applies(tmp_path: Path) -> None:
    sysfs, state, watcher, receive = watched_node(tmp_path, 1)
    before = state.view.online
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        change = await set_online_and_receive(sysfs, 79, False, receive)
        # The watcher changed nothing: the owner still has the old online CPUs.
        assert state.view.online == before
        assert (change.went, change.came) == ("79", "")
        assert state.inventory is not None
        state.apply_topology(change.topology, state.inventory)
        assert state.view.online == before - CPUSet([79])
        assert 79 not in state.view.shared_pool
        back = await set_online_and_receive(sysfs, 79, True, receive)
        assert (back.went, back.came) == ("", "79")
        nursery.cancel_scope.cancel()
    assert watcher.events == 2
    # The run's clone closed when it stopped; once the watcher is closed for good the
    # receiver ends on its own.
    watcher.close()
    with pytest.raises(trio.EndOfChannel):
        await receive.receive()


def test_report_health_marks_the_devices_of_claims_on_offline_cpus() -> None:
    state = NodeState(AllocationStore(CPUSet.parse("0-7"), CPUSet()))
    device = (PreparedDevice(pool_name="node-a", device_name="cpudev003"),)
    record = ClaimRecord(
        uid="u1", namespace="default", name="c1", cpus=CPUSet.parse("2-3"), devices=device
    )
    state.restore([record])  # a prepared claim, as after a restart
    state.set_offline(CPUSet.parse("3"))
    health = HealthService(node_name="node-a", devices=["cpudev001", "cpudev003"])
    registry = CollectorRegistry()
    metrics = DriverMetrics(registry)
    report_health(state.view, ["cpudev001"], health, metrics)
    assert dict(health.report().unhealthy) == {
        "cpudev003": "claim default/c1 holds CPU(s) 3, which are offline"
    }
    assert registry.get_sample_value("dracpu_claims_on_offline_cpus") == 1
    state.set_offline(CPUSet())
    report_health(state.view, ["cpudev001"], health, metrics)
    assert dict(health.report().unhealthy) == {}
    assert registry.get_sample_value("dracpu_claims_on_offline_cpus") == 0


async def test_a_change_not_applied_yet_is_sent_once_and_a_revert_is_sent_at_once(
    tmp_path: Path,
) -> None:
    # The owner's online CPUs change only when the receiver applies a change; the polls
    # in between must not send the same change again.
    sysfs, state, watcher, receive = watched_node(tmp_path, 10)
    before = state.view.online
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        first = await set_online_and_receive(sysfs, 79, False, receive)
        assert (first.went, first.came) == ("79", "")
        await trio.sleep(0.2)  # twenty polls, the change still not applied
        with pytest.raises(trio.WouldBlock):
            receive.receive_nowait()
        # Back online before the first change was applied: the owner will apply both in
        # order, so the reverse change is sent now, relative to the first.
        back = await set_online_and_receive(sysfs, 79, True, receive)
        assert (back.went, back.came) == ("", "79")
        assert state.inventory is not None
        state.apply_topology(first.topology, state.inventory)
        state.apply_topology(back.topology, state.inventory)
        assert state.view.online == before
        await trio.sleep(0.2)
        with pytest.raises(trio.WouldBlock):
            receive.receive_nowait()
        nursery.cancel_scope.cancel()
    assert watcher.events == 2
