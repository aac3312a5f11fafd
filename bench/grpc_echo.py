"""Unary echo throughput: dracpu's Trio + h2 server vs grpclib's asyncio server.

Both serve the generated DRA v1 NodePrepareResources method from a child process; a grpcio
client in this process keeps 16 calls in flight. Runs alternate A/B and the median is
reported, with server CPU per call read from /proc (protocols.md 1.13).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

CALLS = 3000
IN_FLIGHT = 16
PAIRS = 4
SERVERS = ("trio", "grpclib")


def _serve(kind: str, path: str) -> None:
    from dracpu.proto.dra.v1 import api_grpc
    from dracpu.proto.dra.v1 import api_pb2 as pb

    class Echo(api_grpc.DRAPluginBase):
        async def NodePrepareResources(self, stream: Any) -> None:
            request = await stream.recv_message()
            reply = pb.NodePrepareResourcesResponse()
            for claim in request.claims:
                reply.claims[claim.uid].devices.add(pool_name="p", device_name=claim.name)
            await stream.send_message(reply)

        async def NodeUnprepareResources(self, stream: Any) -> None:
            raise NotImplementedError

    if kind == "trio":
        import trio

        from dracpu.grpc import serve_unix

        trio.run(serve_unix, path, Echo().__mapping__())
    else:
        import asyncio

        from grpclib.server import Server

        async def main() -> None:
            server = Server([Echo()])
            await server.start(path=path)
            await server.wait_closed()

        asyncio.run(main())


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_once(kind: str) -> tuple[float, float]:
    import grpc

    from dracpu.proto.dra.v1 import api_pb2 as pb

    path = tempfile.mkdtemp(dir="/tmp", prefix="bench.") + "/s.sock"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, path])
    try:
        while not os.path.exists(path):
            time.sleep(0.01)
        channel = grpc.insecure_channel("unix:" + path)
        stub = channel.unary_unary(
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            request_serializer=pb.NodePrepareResourcesRequest.SerializeToString,
            response_deserializer=pb.NodePrepareResourcesResponse.FromString,
        )
        request = pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace="default", uid="6f1c2a9e-uid", name="claim-a")]
        )
        stub(request, timeout=10, wait_for_ready=True)
        cpu0, t0 = _cpu_seconds(proc.pid), time.perf_counter()
        pending: list[Any] = []
        for _ in range(CALLS):
            if len(pending) >= IN_FLIGHT:
                pending.pop(0).result()
            pending.append(stub.future(request, timeout=10))
        for fut in pending:
            fut.result()
        elapsed = time.perf_counter() - t0
        cpu = _cpu_seconds(proc.pid) - cpu0
        channel.close()
        return CALLS / elapsed, cpu / CALLS * 1e6
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in SERVERS}
    for i in range(PAIRS):
        order = SERVERS if i % 2 == 0 else SERVERS[::-1]
        for kind in order:
            results[kind].append(_run_once(kind))
    for kind in SERVERS:
        rate = statistics.median(r for r, _ in results[kind])
        cpu = statistics.median(c for _, c in results[kind])
        print(f"grpc_unary_{kind}_calls_per_s: {rate:.0f} calls/s")
        print(f"grpc_unary_{kind}_server_cpu_per_call_us: {cpu:.0f} us")
    ratio = statistics.median(
        t[0] / g[0] for t, g in zip(results["trio"], results["grpclib"], strict=True)
    )
    print(f"grpc_unary_trio_vs_grpclib_ratio: {ratio:.2f} x")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        _serve(sys.argv[2], sys.argv[3])
    else:
        main()
