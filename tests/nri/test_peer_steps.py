"""The NRI read loop works in steps: a read packed with tiny frames lets the daemon run."""

from __future__ import annotations

import struct

import trio
import trio.testing

from dracpu.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN
from dracpu.nri.peer import MuxPeer
from dracpu.nri.ttrpc import MessageType, RequestReceived, encode_frame
from dracpu.proto.nri import ttrpc_pb2

BODY = ttrpc_pb2.Request(
    service="nri.pkg.api.v1alpha1.Plugin", method="Shutdown"
).SerializeToString()


def _packed_requests(count: int) -> bytes:
    """``count`` ttrpc requests inside one mux frame for the plugin's connection."""
    payload = b"".join(encode_frame(2 * i + 1, MessageType.REQUEST, 0, BODY) for i in range(count))
    return struct.pack(">II", PLUGIN_SERVICE_CONN, len(payload)) + payload


async def test_one_read_of_thousands_of_requests_is_handled_in_steps() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    seen: list[int] = []
    ticks_at: list[int] = []
    ticks = 0

    async def on_request(request: RequestReceived) -> None:
        seen.append(request.stream_id)  # answers nothing and never waits: no checkpoint
        ticks_at.append(ticks)

    peer = MuxPeer(
        ours, serve_conn=PLUGIN_SERVICE_CONN, call_conn=RUNTIME_SERVICE_CONN, on_request=on_request
    )
    count = 2000  # ~70 KiB of requests, more than one step's worth many times over
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.run)

        async def other_work() -> None:
            nonlocal ticks
            while len(seen) < count:
                ticks += 1
                await trio.lowlevel.checkpoint()

        await theirs.send_all(_packed_requests(count))
        await other_work()
        nursery.cancel_scope.cancel()
    assert seen == [2 * i + 1 for i in range(count)]  # all of them, in order
    # The other task ran between the steps, not only before and after the whole read.
    assert len(set(ticks_at)) >= 8
