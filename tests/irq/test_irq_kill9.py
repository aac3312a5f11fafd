"""Acceptance: a real ``dracpu run`` (child process of the simulated node) with a fake procfs
moves interrupt masks off the CPUs of a claim that asks (isolateIRQs in its opaque config)
at prepare, gives them back at unprepare, and after a kill -9 in between the restarted
daemon keeps the ban while the claim is prepared and gives everything back once it is not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from builders import pod, resource_claim
from fake_proc import affinities, default_mask, make_proc

from dracpu.cpuset import CPUSet
from dracpu_sim.node import SimNode

XEON = str(Path(__file__).parents[1] / "fake_sysfs" / "xeon-2s-ht")
DEFAULT = "ffff,ffffffff,ffffffff"  # 80 CPUs, as the kernel prints it
ORIGINAL = {0: "0", 8: "0-79", 24: "0-79", 25: "40-79", 26: "0-39", 27: "3"}
ISOLATE = {
    "opaque": {
        "driver": "dra.cpu",
        "parameters": {
            "apiVersion": "dra.cpu/v1alpha1",
            "kind": "AllocationOptions",
            "isolateIRQs": True,
        },
    }
}


async def wait_for(predicate: Any, what: str, timeout: float = 30.0) -> None:
    with trio.move_on_after(timeout):
        while True:
            if await predicate():
                return
            await trio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def expected(banned: CPUSet) -> dict[int, str]:
    """Each original minus the banned CPUs, or the original when nothing would be left."""
    out = {}
    for irq, text in ORIGINAL.items():
        left = CPUSet.parse(text) - banned
        out[irq] = (left or CPUSet.parse(text)).format()
    return out


def hex80(cpus: CPUSet) -> str:
    mask = cpus.mask
    return f"{mask >> 64:04x},{(mask >> 32) & 0xFFFFFFFF:08x},{mask & 0xFFFFFFFF:08x}"


async def test_masks_follow_the_claim_across_a_kill9(short_tmp: str) -> None:
    # Its own tree, given after the simulated node's (the last --proc-root wins).
    proc = make_proc(Path(short_tmp, "irqtest"), DEFAULT, ORIGINAL)
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text("boot-a\n")
    node = SimNode(workdir=short_tmp, node_cpus="0-79", node_mems="0-1")
    args = ["--proc-root", str(proc)]
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        await node.start_daemon(sysfs_root=XEON, extra_args=args)
        await node.create(resource_claim("iso", 4, config=[ISOLATE]))
        await node.create(resource_claim("plain", 2))
        await node.create(pod("pi", "iso"))
        await node.create(pod("pp", "plain"))

        async def claim_cpus() -> dict[str, CPUSet]:
            state = await node.debug_state()
            return {c["name"]: CPUSet.parse(c["cpus"]) for c in state["claims"]}

        async def both_prepared() -> bool:
            return len(await claim_cpus()) == 2

        await wait_for(both_prepared, "both claims prepared")
        banned = (await claim_cpus())["iso"]
        assert len(banned) == 4

        async def banned_now() -> bool:
            return affinities(proc) == expected(banned)

        await wait_for(banned_now, "the masks without the isolating claim's CPUs")
        assert default_mask(proc) == hex80(CPUSet.parse("0-79") - banned)
        assert affinities(proc)[27] == "3"  # its one CPU is not the claim's, or it is left

        # kill -9 with the claim prepared: the restarted daemon keeps the ban.
        await node.restart_daemon()
        assert affinities(proc) == expected(banned)
        state = await node.debug_state()
        assert state["irq"]["bannedCPUs"] == banned.format()

        # kill -9, and the claim is unprepared while the daemon is down or right after.
        await node.kill_daemon()
        await node.delete_pod("default", "pi")
        await node.launch_daemon(sysfs_root=XEON, extra_args=args)
        await node.wait_ready()

        async def given_back() -> bool:
            return affinities(proc) == ORIGINAL and default_mask(proc) == DEFAULT

        await wait_for(given_back, "every mask back after the unprepare")
        assert set(await claim_cpus()) == {"plain"}
        state = await node.debug_state()
        assert state["irq"]["bannedCPUs"] == "" and state["irq"]["remembered"] == 0
        nursery.cancel_scope.cancel()
