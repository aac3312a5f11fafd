"""SIGTERM: `dracpu run` stops within 5 s with exit code 0 and removes its sockets; the
ResourceSlices stay (the kubelet removes them when the plugin is gone)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import trio

from dracpu_sim.node import SimNode

XEON = str(Path(__file__).parents[1] / "fake_sysfs" / "xeon-2s-ht")


async def test_sigterm_stops_cleanly_and_fast(short_tmp: str) -> None:
    node = SimNode(workdir=short_tmp, node_cpus="0-79")
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        daemon = await node.start_daemon(sysfs_root=XEON)
        reg = Path(node.kubelet_root, "plugins_registry", "dra.cpu-reg.sock")
        dra = Path(node.kubelet_root, "plugins", "dra.cpu", "dra.sock")
        assert reg.exists() and dra.exists()
        assert oct(os.stat(reg).st_mode & 0o777) == "0o600"
        slices = len(node.api.list("resourceslices"))
        started = time.monotonic()
        code = await daemon.stop(timeout=10)
        elapsed = time.monotonic() - started
        nursery.cancel_scope.cancel()
    assert code == 0
    assert elapsed < 5, f"shutdown took {elapsed:.1f} s"
    assert not reg.exists() and not dra.exists()
    assert slices == 1 and len(node.api.list("resourceslices")) == 1
    log = Path(node.workdir, "dracpu.log").read_text()
    assert '"exiting" reason="received signal" signal="SIGTERM"' in log
