"""Both ttrpc roles driven over one multiplexed byte stream, as the session shell will do.

The "runtime" here is just the mirror image built from the same codecs: its client calls
Plugin on conn 1, its server answers Runtime on conn 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dracpu.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Multiplexer, MuxData
from dracpu.nri.ttrpc import (
    ClientEvent,
    RequestReceived,
    ResponseReceived,
    ServerEvent,
    TTRPCClientConnection,
    TTRPCServerConnection,
)
from dracpu.proto.nri import api_pb2


@dataclass
class Endpoint:
    """One side of the socket: a mux, the ttrpc server of one conn, the client of the other."""

    serve_conn: int
    call_conn: int
    mux: Multiplexer = field(default_factory=Multiplexer)
    server: TTRPCServerConnection = field(default_factory=TTRPCServerConnection)
    client: TTRPCClientConnection = field(default_factory=TTRPCClientConnection)

    def outbound(self) -> bytes:
        for message in self.server.messages_to_send():
            self.mux.send(self.serve_conn, message)
        for message in self.client.messages_to_send():
            self.mux.send(self.call_conn, message)
        return self.mux.data_to_send()

    def inbound(self, wire: bytes) -> tuple[list[ServerEvent], list[ClientEvent]]:
        served: list[ServerEvent] = []
        answered: list[ClientEvent] = []
        for event in self.mux.receive_data(wire):
            assert isinstance(event, MuxData)
            if event.conn_id == self.serve_conn:
                served += self.server.receive_data(event.payload)
            else:
                answered += self.client.receive_data(event.payload)
        return served, answered


def test_registration_crosses_configure_and_a_large_reply_is_fragmented() -> None:
    plugin = Endpoint(serve_conn=PLUGIN_SERVICE_CONN, call_conn=RUNTIME_SERVICE_CONN)
    runtime = Endpoint(serve_conn=RUNTIME_SERVICE_CONN, call_conn=PLUGIN_SERVICE_CONN)

    register = api_pb2.RegisterPluginRequest(plugin_name="dracpu", plugin_idx="90")
    reg_id = plugin.client.send_request(
        "nri.pkg.api.v1alpha1.Runtime",
        "RegisterPlugin",
        register.SerializeToString(),
        timeout_nano=5_000_000_000,
    )
    served, _ = runtime.inbound(plugin.outbound())
    assert [(e.stream_id, e.method) for e in served if isinstance(e, RequestReceived)] == [
        (1, "RegisterPlugin")
    ]

    # The runtime calls Configure before its RegisterPlugin reply goes out (6.4 step 3).
    configure = api_pb2.ConfigureRequest(runtime_name="containerd", request_timeout=2000)
    cfg_id = runtime.client.send_request(
        "nri.pkg.api.v1alpha1.Plugin", "Configure", configure.SerializeToString()
    )
    runtime.server.send_response(1, b"")
    wire = runtime.outbound()
    served, answered = plugin.inbound(wire)
    assert answered == [ResponseReceived(reg_id, b"")]
    [request] = served
    assert isinstance(request, RequestReceived)
    assert request.stream_id == cfg_id == 1
    assert api_pb2.ConfigureRequest.FromString(request.payload) == configure

    plugin.server.send_response(
        cfg_id, api_pb2.ConfigureResponse(events=0x068C).SerializeToString()
    )
    _, answered = runtime.inbound(plugin.outbound())
    assert answered == [ResponseReceived(cfg_id, b"\x10\x8c\x0d")]

    # A CreateContainer reply of ~8.7 KB goes out as 4096 + rest (6.2) and reassembles.
    create_id = runtime.client.send_request("nri.pkg.api.v1alpha1.Plugin", "CreateContainer")
    plugin.inbound(runtime.outbound())
    reply = api_pb2.CreateContainerResponse(
        update=[
            api_pb2.ContainerUpdate(
                container_id=f"c{i:04d}" * 8,
                linux=api_pb2.LinuxContainerUpdate(
                    resources=api_pb2.LinuxResources(cpu=api_pb2.LinuxCPU(cpus="0-3,8-11"))
                ),
                ignore_failure=True,
            )
            for i in range(180)
        ]
    ).SerializeToString()
    assert len(reply) > 8192
    plugin.server.send_response(create_id, reply)
    wire = plugin.outbound()
    first_len = int.from_bytes(wire[4:8], "big")
    assert first_len == 4096
    second_len = int.from_bytes(wire[8 + 4096 + 4 : 8 + 4096 + 8], "big")
    assert 8 + 4096 + 8 + second_len == len(wire)
    _, answered = runtime.inbound(wire)
    assert answered == [ResponseReceived(create_id, reply)]
