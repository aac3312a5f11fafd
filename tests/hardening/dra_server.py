"""The DRA socket served by a child process of its own, so that its RSS and its CPU are the
server's alone and a client in the test process never shares its interpreter lock.

``python dra_server.py dra DIR`` serves the kubelet harness node's DRA service under
``DIR``, with claims checked as the daemon's API claim source checks them
(``check_claim_ref`` before any lookup). ``python dra_server.py dra DIR KUBECONFIG`` reads
the claims from the API server that kubeconfig names, through the daemon's own claim
source (``ApiClaimSource`` over ``KubeClient``). Either way the heap is settled as
``dracpu run`` settles it once ready; the DRA socket's path is printed on one line, and
the server runs until its stdin closes.

``python dra_server.py apiserver KUBECONFIG`` runs the simulated API server on a loopback
port, writes a kubeconfig for it and prints its URL on one line.
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
from kubelet_harness import NODE, make_node, start_plugin  # noqa: E402

from dracpu import heap  # noqa: E402
from dracpu.allocation.prepare import ClaimAllocation  # noqa: E402
from dracpu.k8s.claims import check_claim_ref  # noqa: E402
from dracpu.k8s.client import KubeClient  # noqa: E402
from dracpu.kubelet import ApiClaimSource, MemoryClaimSource  # noqa: E402


class CheckedClaims:
    """The harness's claims in memory, refused as ``ApiClaimSource`` refuses them."""

    def __init__(self, claims: MemoryClaimSource) -> None:
        self._claims = claims

    async def get(self, namespace: str, name: str, uid: str) -> ClaimAllocation:
        check_claim_ref(namespace, name)
        return await self._claims.get(namespace, name, uid)


async def serve_dra(root: str, kubeconfig: str | None) -> None:
    cdi_dir = os.path.join(root, "cdi")
    os.mkdir(cdi_dir)
    node = make_node(cdi_dir)
    kube = None
    if kubeconfig is None:
        node.service.claims = CheckedClaims(node.claims)
    else:
        kube = KubeClient.from_kubeconfig(kubeconfig)
        node.service.claims = ApiClaimSource(kube, NODE)
    try:
        async with trio.open_nursery() as nursery:
            served = await start_plugin(nursery, os.path.join(root, "k"), node.service)
            heap.settle()
            print(served.plugin.dra_socket, flush=True)
            # Serve until the parent closes our stdin.
            await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
            await served.stop()
    finally:
        if kube is not None:
            kube.close()


async def serve_api(kubeconfig: str) -> None:
    from dracpu_sim.apiserver import main_apiserver

    await main_apiserver(0, kubeconfig)


if __name__ == "__main__":
    if sys.argv[1] == "apiserver":
        trio.run(serve_api, sys.argv[2])
    else:
        trio.run(serve_dra, sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
