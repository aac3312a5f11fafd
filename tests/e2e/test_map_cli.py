"""`dracpu map` against a running daemon's /debug/state, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import trio
from builders import pod, resource_claim

from dracpu_sim.node import SimNode, free_port

XEON = str(Path(__file__).parents[1] / "fake_sysfs" / "xeon-2s-ht")


def dracpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dracpu", *args], capture_output=True, text=True, timeout=60
    )


async def test_map_of_a_running_daemon(short_tmp: str) -> None:
    node = SimNode(workdir=short_tmp, node_cpus="0-79")
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        daemon = await node.start_daemon(sysfs_root=XEON, extra_args=["--reserved-cpus=79"])
        await node.create(resource_claim("four", 4))
        await node.create(pod("p", "four"))
        with trio.fail_after(30):
            while node.pod_states().get("default/p", {}).get("phase") != "Running":
                await trio.sleep(0.1)
        # dracpu writes the claim's status.devices beside the prepare: wait for it.
        with trio.fail_after(30):
            while "written" not in (await node.debug_state())["claimStatus"]["claims"].values():
                await trio.sleep(0.1)
        state = await node.debug_state()
        proc = await trio.to_thread.run_sync(dracpu, "map", "--url", daemon.debug_url)
        nursery.cancel_scope.cancel()
    assert proc.returncode == 0, proc.stderr
    cpus = state["claims"][0]["cpus"]
    lines = proc.stdout.splitlines()
    assert lines[0] == "node demo-node"
    assert lines[1].startswith("  Socket 0 · NUMA 0 · L3 0   ")
    assert lines[2].startswith("  Socket 1 · NUMA 1 · L3 1   ")
    assert lines[2].endswith(".r")  # CPU 79 is reserved: the second thread of the last core
    assert f"    A  default/four  {cpus} (4 CPUs)" in lines
    legend = lines.index(f"    A  default/four  {cpus} (4 CPUs)")
    assert lines[legend + 1] == "       status.devices: written"
    # The reserved CPU is the pool's floor: shared, and marked r.
    assert f"    .  shared pool   {state['sharedPool']} (76 CPUs)" in lines
    assert "    r  reserved      79 (1 CPU)" in lines
    assert json.dumps(state)  # the document the map was drawn from is plain JSON


def test_map_errors() -> None:
    port = free_port()
    proc = dracpu("map", "--url", f"http://127.0.0.1:{port}")
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"dracpu: cannot read http://127.0.0.1:{port}/debug/state: ")
