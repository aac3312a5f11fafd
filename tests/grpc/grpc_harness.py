"""Fake services on the real generated stubs, and a raw h2 client for byte-level checks."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import trio
from builders import grpc_headers
from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError
from hyperframe.frame import DataFrame, Frame, HeadersFrame

from dracpu.grpc.framing import encode_message
from dracpu.proto.dra.v1 import api_grpc as dra_v1_grpc
from dracpu.proto.dra.v1 import api_pb2 as dra_v1
from dracpu.proto.health.v1alpha1 import api_grpc as health_grpc
from dracpu.proto.health.v1alpha1 import api_pb2 as health
from dracpu.proto.pluginregistration import api_grpc as reg_grpc
from dracpu.proto.pluginregistration import api_pb2 as reg

PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
WATCH = "/v1alpha1.DRAResourceHealth/NodeWatchResources"
GET_INFO = "/pluginregistration.Registration/GetInfo"
NON_ASCII_ERROR = "bad: 100% ünï\n"


@dataclass
class Observed:
    """What the fake handlers saw; trio events let tests wait for a handler's progress."""

    started: trio.Event = field(default_factory=trio.Event)
    cancelled: trio.Event = field(default_factory=trio.Event)
    release: trio.Event = field(default_factory=trio.Event)
    stopped: trio.Event = field(default_factory=trio.Event)
    metadata: list[Any] = field(default_factory=list)
    remaining: list[float | None] = field(default_factory=list)


class FakeDRA(dra_v1_grpc.DRAPluginBase):
    """Claim names pick the behaviour: "block", "wait", "fail", "crash", else success."""

    def __init__(self, seen: Observed) -> None:
        self.seen = seen

    async def NodePrepareResources(self, stream: Any) -> None:
        request = await stream.recv_message()
        self.seen.metadata.append(stream.metadata)
        deadline = stream.deadline
        self.seen.remaining.append(None if deadline is None else deadline.time_remaining())
        reply = dra_v1.NodePrepareResourcesResponse()
        for claim in request.claims:
            if claim.name == "block":
                self.seen.started.set()
                try:
                    await trio.sleep_forever()
                finally:
                    self.seen.cancelled.set()
            if claim.name == "wait":
                self.seen.started.set()
                await self.seen.release.wait()
            if claim.name == "fail":
                raise GRPCError(Status.FAILED_PRECONDITION, NON_ASCII_ERROR)
            if claim.name == "crash":
                raise ValueError("boom")
            reply.claims[claim.uid].devices.add(
                pool_name="node-a", device_name=claim.name, cdi_device_ids=[f"x/cpu={claim.uid}"]
            )
        await stream.send_message(reply)

    async def NodeUnprepareResources(self, stream: Any) -> None:
        request = await stream.recv_message()
        reply = dra_v1.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            reply.claims[claim.uid].error = ""
        await stream.send_message(reply)


class FakeHealth(health_grpc.DRAResourceHealthBase):
    """Streams three snapshots (device names h0..h2, padded to `pad` bytes), then ends."""

    def __init__(self, pad: int = 0) -> None:
        self.pad = pad

    async def NodeWatchResources(self, stream: Any) -> None:
        await stream.recv_message()
        for i in range(3):
            device = health.DeviceIdentifier(pool_name="p" * self.pad, device_name=f"h{i}")
            snapshot = health.NodeWatchResourcesResponse(
                devices=[health.DeviceHealth(device=device, health=health.HEALTHY)]
            )
            await stream.send_message(snapshot)


class FakeRegistration(reg_grpc.RegistrationBase):
    async def GetInfo(self, stream: Any) -> None:
        await stream.recv_message()
        await stream.send_message(
            reg.PluginInfo(
                type="DRAPlugin",
                name="dracpu.example.com",
                endpoint="/var/lib/kubelet/plugins/dracpu.example.com/dra.sock",
                supported_versions=["v1.DRAPlugin"],
            )
        )

    async def NotifyRegistrationStatus(self, stream: Any) -> None:
        await stream.recv_message()
        await stream.send_message(reg.RegistrationStatusResponse())


def all_handlers(seen: Observed, pad: int = 0) -> dict[str, Handler]:
    return {
        **FakeDRA(seen).__mapping__(),
        **FakeHealth(pad).__mapping__(),
        **FakeRegistration().__mapping__(),
    }


def socket_path() -> str:
    return tempfile.mkdtemp(dir="/tmp", prefix="g.") + "/s.sock"


def prepare_stub(channel: grpc.Channel) -> Any:
    return channel.unary_unary(
        PREPARE,
        request_serializer=dra_v1.NodePrepareResourcesRequest.SerializeToString,
        response_deserializer=dra_v1.NodePrepareResourcesResponse.FromString,
    )


def prepare_request(*names: str) -> dra_v1.NodePrepareResourcesRequest:
    return dra_v1.NodePrepareResourcesRequest(
        claims=[dra_v1.Claim(namespace="ns", uid=f"uid-{n}", name=n) for n in names]
    )


async def in_thread(fn: Callable[[], Any]) -> Any:
    """Run a blocking grpcio client function off the Trio thread."""
    return await trio.to_thread.run_sync(fn)


def _header_list(headers: Any) -> list[tuple[bytes, bytes]]:
    return [(bytes(k), bytes(v)) for k, v in headers or ()]


@dataclass
class RawResponse:
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    data: bytes = b""
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    reset_code: int | None = None


class RawClient:
    """A bare h2 client on a Trio unix socket, to see exactly what the server sends."""

    def __init__(self, sock: trio.SocketStream) -> None:
        self.sock = sock
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.responses: dict[int, RawResponse] = {}
        self.ended: set[int] = set()
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.eof = False
        self._raw = bytearray()

    @classmethod
    async def connect(cls, path: str) -> RawClient:
        client = cls(await trio.open_unix_socket(path))
        client.h2.initiate_connection()
        await client.flush()
        return client

    async def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            await self.sock.send_all(data)

    async def start(
        self,
        path: str,
        body: bytes | None,
        extra: Sequence[tuple[bytes, bytes]] = (),
        *,
        end: bool = True,
        content_type: bytes = b"application/grpc",
        method: bytes = b"POST",
    ) -> int:
        sid: int = self.h2.get_next_available_stream_id()
        headers = grpc_headers(path.encode(), *extra, method=method, content_type=content_type)
        self.h2.send_headers(sid, headers, end_stream=body is None and end)
        if body is not None:
            self.h2.send_data(sid, body, end_stream=end)
        self.responses[sid] = RawResponse()
        await self.flush()
        return sid

    async def pump(self) -> None:
        """Read once and record what arrived."""
        data = await self.sock.receive_some(65536)
        if not data:
            self.eof = True
            return
        if self.goaway is not None:
            # h2's client rejects every frame after GOAWAY, though a server may still
            # finish accepted streams; parse those frames by hand.
            self._parse_after_goaway(data)
            return
        for ev in self.h2.receive_data(data):
            self._record(ev)
        await self.flush()

    def _parse_after_goaway(self, data: bytes) -> None:
        self._raw += data
        while len(self._raw) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(self._raw[:9]))
            if len(self._raw) < 9 + length:
                return
            frame.parse_body(memoryview(self._raw[9 : 9 + length]))
            del self._raw[: 9 + length]
            resp = self.responses.get(frame.stream_id)
            if resp is None:
                continue
            if isinstance(frame, HeadersFrame):
                headers = _header_list(self.h2.decoder.decode(frame.data, raw=True))
                if resp.headers:
                    resp.trailers = headers
                else:
                    resp.headers = headers
            elif isinstance(frame, DataFrame):
                resp.data += frame.data
            if "END_STREAM" in frame.flags:
                self.ended.add(frame.stream_id)

    def _record(self, ev: h2.events.Event) -> None:
        if isinstance(ev, h2.events.ResponseReceived):
            self.responses[ev.stream_id].headers = _header_list(ev.headers)
        elif isinstance(ev, h2.events.TrailersReceived):
            self.responses[ev.stream_id].trailers = _header_list(ev.headers)
        elif isinstance(ev, h2.events.DataReceived):
            self.responses[ev.stream_id].data += ev.data or b""
            self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, h2.events.StreamEnded):
            self.ended.add(ev.stream_id)
        elif isinstance(ev, h2.events.StreamReset):
            self.responses[ev.stream_id].reset_code = ev.error_code
            self.ended.add(ev.stream_id)
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.goaway = ev

    async def until(self, done: Callable[[], bool]) -> None:
        while not done() and not self.eof:
            await self.pump()

    async def call(self, path: str, body: bytes | None, **kw: Any) -> RawResponse:
        sid = await self.start(path, body, **kw)
        await self.until(lambda: sid in self.ended)
        return self.responses[sid]

    async def aclose(self) -> None:
        await self.sock.aclose()


def empty_message() -> bytes:
    return encode_message(b"")
