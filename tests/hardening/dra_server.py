"""The DRA socket served by a child process of its own, so that its RSS is the server's.

``python rss_server.py DIR`` serves the kubelet harness node's DRA service under ``DIR``,
with claims checked as the daemon's API claim source checks them (``check_claim_ref``
before any lookup) and the heap settled as ``dracpu run`` settles it once ready; prints
the DRA socket's path on one line, then serves until its stdin closes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
for helper_dir in (TESTS, TESTS / "kubelet"):
    if str(helper_dir) not in sys.path:
        sys.path.append(str(helper_dir))

import trio  # noqa: E402
from kubelet_harness import make_node, start_plugin  # noqa: E402

from dracpu import heap  # noqa: E402
from dracpu.allocation.prepare import ClaimAllocation  # noqa: E402
from dracpu.k8s.claims import check_claim_ref  # noqa: E402
from dracpu.kubelet import MemoryClaimSource  # noqa: E402


class CheckedClaims:
    """The harness's claims in memory, refused as ``ApiClaimSource`` refuses them."""

    def __init__(self, claims: MemoryClaimSource) -> None:
        self._claims = claims

    async def get(self, namespace: str, name: str, uid: str) -> ClaimAllocation:
        check_claim_ref(namespace, name)
        return await self._claims.get(namespace, name, uid)


async def main(root: str) -> None:
    cdi_dir = os.path.join(root, "cdi")
    os.mkdir(cdi_dir)
    node = make_node(cdi_dir)
    node.service.claims = CheckedClaims(node.claims)
    async with trio.open_nursery() as nursery:
        served = await start_plugin(nursery, os.path.join(root, "k"), node.service)
        heap.settle()
        print(served.plugin.dra_socket, flush=True)
        # Serve until the parent closes our stdin.
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
        await served.stop()


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
