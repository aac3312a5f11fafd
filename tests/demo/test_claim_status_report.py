"""The claims' status.devices in the demo report: reading it back (waiting for dracpu's
entries) and the text report's line per claim."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from dracpu_sim.demo.claim_status import ours_show, read_statuses, status_line


def claim(name: str, *devices: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": name, "namespace": "default"}, "status": {}}
    if devices:
        body["status"]["devices"] = list(devices)
    return body


def ours(cpus: str, *, full: bool = True, ready: str = "True") -> dict[str, Any]:
    return {
        "driver": "dra.cpu",
        "pool": "demo-node",
        "device": "cpudevnuma000",
        "conditions": [{"type": "Ready", "status": ready}],
        "data": {"cpuset": cpus, "numaNodes": "0", "fullCores": full},
    }


GPU = {"driver": "gpu.example.com", "pool": "p", "device": "gpu-0"}


def test_ours_show_compares_cpusets_not_spellings() -> None:
    assert ours_show({"devices": [ours("0,1,2")]}, "0-2")
    assert not ours_show({"devices": [ours("0-3")]}, "0-2")
    assert not ours_show({"devices": [GPU]}, "0-2")
    assert not ours_show({"devices": [ours("not a cpuset")]}, "0-2")
    assert not ours_show({}, "0")


def test_status_line_says_ready_cpus_numa_and_cores() -> None:
    assert status_line({"devices": [GPU, ours("4-7")]}) == (
        "status.devices (1 entry): Ready, cpuset 4-7, NUMA 0, full cores"
    )
    two = {"devices": [ours("1,5", full=False, ready="False"), ours("1,5", full=False)]}
    assert status_line(two) == (
        "status.devices (2 entries): not Ready, cpuset 1,5, NUMA 0, shares cores"
    )
    assert status_line({"devices": [GPU]}) is None
    assert status_line(None) is None


async def test_read_statuses_waits_for_our_entries(autojump_clock: trio.testing.MockClock) -> None:
    reads = 0

    def list_claims() -> list[dict[str, Any]]:
        nonlocal reads
        reads += 1
        # The entry lands on the third read, as when the writer is a moment behind.
        return [claim("a", GPU, ours("0-1")) if reads >= 3 else claim("a", GPU), claim("b")]

    start = trio.current_time()
    statuses = await read_statuses(list_claims, {"default/a": "0-1", "default/b": ""})
    assert reads == 3
    assert trio.current_time() - start < 1.0
    assert statuses == {
        "default/a": {"devices": [GPU, ours("0-1")]},
        "default/b": {"devices": []},
    }


async def test_read_statuses_gives_up_and_reports_what_is_there(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    statuses = await read_statuses(lambda: [claim("a")], {"default/a": "3"}, timeout=5.0)
    assert trio.current_time() - start >= 5.0
    assert statuses == {"default/a": {"devices": []}}
