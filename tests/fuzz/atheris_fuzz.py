"""Coverage-guided fuzzing with atheris, for long runs outside CI (optional).

CI runs the hypothesis targets next to this file; this script drives the byte-stream
parsers with libFuzzer's coverage feedback instead, which reaches states random generation
rarely does (frame sequences that get past one check to the next). It needs ``atheris``
(a binary wheel on x86_64 Linux, CPython 3.11), which is not a dependency of dracpu:

    pip install atheris
    python tests/fuzz/atheris_fuzz.py h2 -max_total_time=600
    python tests/fuzz/atheris_fuzz.py ttrpc|mux|http|apiserver|env ...

Every target checks what the hypothesis tests check: only the module's own error type,
bounded buffers. A crash is written by libFuzzer as ``crash-<sha1>``; reproduce it with
``python tests/fuzz/atheris_fuzz.py TARGET crash-<sha1>``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import atheris

with atheris.instrument_imports():
    from grpclib.const import Status

    from dracpu.cdi.env import DRAEnvError, parse_dra_env
    from dracpu.cpuset import CPUSet
    from dracpu.grpc.connection import GRPCServerConnection, RequestReceived
    from dracpu.grpc.framing import MAX_MESSAGE_SIZE
    from dracpu.http import HTTPApp, HTTPLimits, ServerConnection
    from dracpu.nri.errors import ProtocolError
    from dracpu.nri.mux import MAX_FRAME_PAYLOAD, Multiplexer
    from dracpu.nri.ttrpc import HEADER_LENGTH, MAX_DATA_LENGTH, TTRPCServerConnection
    from dracpu_sim.apiserver.faults import CallCounter, FaultInjector
    from dracpu_sim.apiserver.handler import (
        DropConnection,
        Handler,
        Request,
        Response,
        WatchStart,
    )
    from dracpu_sim.apiserver.store import ObjectStore

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class _EmptyDebugView:
    """The debug view the HTTP target serves: an empty document."""

    def debug_state(self) -> object:
        return {}


def _chunks(data: bytes) -> list[bytes]:
    """Split the input at the first bytes' values, so the fuzzer controls read sizes."""
    if not data:
        return []
    cuts = sorted({b * len(data) // 256 for b in data[:4]})
    pieces, prev = [], 0
    for cut in [*cuts, len(data)]:
        pieces.append(data[prev:cut])
        prev = cut
    return [p for p in pieces if p]


def h2_target(data: bytes) -> None:
    server = GRPCServerConnection(max_concurrent_streams=16)
    server.initiate()
    server.data_to_send()
    for piece in _chunks(PREFACE + data):
        for event in server.receive_data(piece):
            if isinstance(event, RequestReceived):
                server.send_message(event.stream_id, event.message[:8])
                server.send_status(event.stream_id, Status.OK)
        assert server.buffered_request_bytes <= 4 * MAX_MESSAGE_SIZE
        assert len(server._h2.incoming_buffer._data) < 9 + 16384
        server.data_to_send()


def ttrpc_target(data: bytes) -> None:
    server = TTRPCServerConnection()
    try:
        for piece in _chunks(data):
            server.receive_data(piece)
            assert server.pending_bytes <= HEADER_LENGTH + MAX_DATA_LENGTH
            server.messages_to_send()
        server.receive_eof()
    except ProtocolError:
        pass


def mux_target(data: bytes) -> None:
    mux = Multiplexer()
    try:
        for piece in _chunks(data):
            mux.receive_data(piece)
            assert mux.pending_bytes <= 8 + MAX_FRAME_PAYLOAD
        mux.receive_eof()
    except ProtocolError:
        pass


def http_target(data: bytes) -> None:
    core = ServerConnection(
        HTTPApp(debug=_EmptyDebugView()), HTTPLimits(max_header_bytes=512, max_body_bytes=64)
    )
    for piece in [*_chunks(data), b""]:
        core.receive_data(piece)
        while True:
            step = core.step()
            if step.data:
                assert step.data.startswith(b"HTTP/1.1 ")
            if step.close:
                return
            if step.need_data:
                break
    assert core.timed_out().close


def apiserver_target(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    handler = Handler(ObjectStore(), FaultInjector(), CallCounter())
    method = fdp.PickValueInList(["GET", "POST", "PUT", "PATCH", "DELETE"])
    target = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 120))
    ctype = fdp.PickValueInList(
        ["application/merge-patch+json", "application/json-patch+json", "application/json"]
    )
    body = fdp.ConsumeBytes(4096)
    answer = handler.handle(Request(method, target, {"content-type": ctype}, body))
    assert isinstance(answer, Response | WatchStart | DropConnection)
    if isinstance(answer, Response):
        assert 200 <= answer.status < 600


def env_target(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    entries = [fdp.ConsumeUnicodeNoSurrogates(40) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    try:
        for cpus in parse_dra_env(entries).values():
            assert CPUSet.parse(cpus.format()) == cpus
    except DRAEnvError:
        pass


TARGETS: dict[str, Callable[[bytes], None]] = {
    "h2": h2_target,
    "ttrpc": ttrpc_target,
    "mux": mux_target,
    "http": http_target,
    "apiserver": apiserver_target,
    "env": env_target,
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(TARGETS)}}} [libFuzzer options]")
    target = TARGETS[sys.argv.pop(1)]
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
