"""Issue 28's acceptance: hostile claim names on one connection leave another connection's
calls under 10 ms at the median and 100 ms at the worst.

The node is the daemon's path: the DRA service in a child process of its own
(``dra_server.py``), reading claims from a simulated API server in another child process
through the daemon's own claim source and kubernetes client. The test process holds only
grpcio clients, so their threads never share the server's interpreter lock.

The hostile client, on one connection: 30 prepares whose claim name fills the 4 MiB message,
one with a 64 KiB namespace, then 1,000 prepares in a row of the longest legal name (253
characters: each one a real GET, answered 404). The victim, on a connection of its own,
prepares a small valid claim the API server does not know, again and again; only its calls
made while the attack runs count. Before the names were checked ahead of the lookup,
urllib3 checked a 4 MiB URL character by character in a worker thread holding the
interpreter (~56 ms, twice per call) and the victim's calls reached 143-245 ms.

Timed assertions are the point of this test (the issue asks for them). On a 2-core machine
shared with other work a whole attack can lose its core for a while, so the bounds must
hold in one of ATTEMPTS attacks, each measured and asserted in full; the bounds themselves
are the issue's.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubelet_harness import claim, prepare_request, prepare_stub, short_dir

from dracpu.grpc.framing import MAX_MESSAGE_SIZE

MiB = 1024 * 1024
MEDIAN_BOUND = 0.010  # seconds
WORST_BOUND = 0.100
ATTEMPTS = 3
MIN_SAMPLES = 200
LONG_NAME_CALLS = 1000
BIG_NAME_CALLS = 30
SERVER = Path(__file__).with_name("dra_server.py")
UID = "6f1c2a3e-0b5d-4c1e-9a57-{:012d}"


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SERVER), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def dra_socket() -> Iterator[str]:
    """The DRA socket of a server child that reads claims from an API server child."""
    root = short_dir("acc.")
    kubeconfig = os.path.join(root, "kubeconfig")
    api = _start("apiserver", kubeconfig)
    dra = None
    try:
        assert api.stdout is not None
        assert api.stdout.readline().startswith("http://"), "the API server did not start"
        dra = _start("dra", root, kubeconfig)
        assert dra.stdout is not None
        path = dra.stdout.readline().strip()
        assert path and os.path.exists(path), "the DRA server did not start"
        yield path
    finally:
        if dra is not None:
            _stop(dra)
        _stop(api)
        shutil.rmtree(root, ignore_errors=True)


def _channel(path: str) -> grpc.Channel:
    # A connection of its own (no subchannel shared with another channel).
    return grpc.insecure_channel(
        "unix:" + path,
        options=[("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", 8 * MiB)],
    )


def _refused(call: Any, request: Any) -> grpc.RpcError:
    try:
        call(request, timeout=60)
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("a hostile call succeeded")


class Victim:
    """Prepares a small claim unknown to the API server, on its own connection, from a
    thread, until stopped; keeps (start, seconds) of each call."""

    def __init__(self, path: str) -> None:
        self.channel = _channel(path)
        self.call = prepare_stub(self.channel)
        self.request = prepare_request("v1", claim(UID.format(0), name="victim"))
        self.calls: list[tuple[float, float]] = []
        self._stop = threading.Event()

    def one(self) -> float:
        started = time.perf_counter()
        error = _refused(self.call, self.request)
        took = time.perf_counter() - started
        assert error.code() == grpc.StatusCode.UNKNOWN, error
        assert error.details() == (
            'retrieve claim default/victim: resourceclaims.resource.k8s.io "victim" not found'
        ), error.details()
        return took

    def run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self.calls.append((started, self.one()))
            time.sleep(0.001)

    def stop(self) -> None:
        self._stop.set()

    def during(self, start: float, end: float) -> list[float]:
        return [took for started, took in self.calls if start <= started <= end]


def attack(path: str) -> None:
    """The issue's hostile sequence on one connection; every call is refused as it should
    be (the shortened name in the text; a real 404 for the legal ones)."""
    channel = _channel(path)
    call = prepare_stub(channel)
    try:
        big = "n" * (MAX_MESSAGE_SIZE - 512)
        for i in range(BIG_NAME_CALLS):
            error = _refused(call, prepare_request("v1", claim(UID.format(i + 1), name=big)))
            assert error.code() == grpc.StatusCode.UNKNOWN
            assert error.details() == (
                f"retrieve claim default/{'n' * 64}...({len(big)} characters): "
                "invalid name: must be 1 to 253 characters, not " + str(len(big))
            ), error.details()[:200]
        namespace = "s" * (64 * 1024)
        error = _refused(call, prepare_request("v1", claim(UID.format(99), namespace=namespace)))
        assert error.details().startswith(
            f"retrieve claim {'s' * 64}...(65536 characters)/claim-"
        ), error.details()[:200]
        assert error.details().endswith("invalid namespace: must be 1 to 63 characters, not 65536")
        for i in range(LONG_NAME_CALLS):
            name = f"{i:05d}" + "l" * 248  # 253 characters, a legal name nobody created
            error = _refused(call, prepare_request("v1", claim(UID.format(1000 + i), name=name)))
            assert error.code() == grpc.StatusCode.UNKNOWN
            assert error.details().endswith(f'"{name}" not found'), error.details()[-80:]
    finally:
        channel.close()


def measure(path: str) -> list[float]:
    """The victim's latencies (seconds) while one attack runs."""
    victim = Victim(path)
    try:
        for _ in range(50):  # warm up both sides: connection, client pool, caches
            victim.one()
        thread = threading.Thread(target=victim.run)
        thread.start()
        try:
            time.sleep(0.05)
            start = time.perf_counter()
            attack(path)
            end = time.perf_counter()
        finally:
            victim.stop()
            thread.join()
        return victim.during(start, end)
    finally:
        victim.channel.close()


def check(latencies: list[float]) -> None:
    ordered = sorted(latencies)
    assert len(ordered) >= MIN_SAMPLES, len(ordered)
    median, worst = statistics.median(ordered), ordered[-1]
    summary = f"{len(ordered)} calls: median {median * 1e3:.2f} ms, worst {worst * 1e3:.1f} ms"
    assert median < MEDIAN_BOUND, summary
    assert worst < WORST_BOUND, summary + f"; slowest {[round(t * 1e3) for t in ordered[-5:]]}"


@pytest.mark.skipif(sys.platform != "linux", reason="unix sockets and child processes")
def test_hostile_names_leave_another_connection_under_10ms_median_100ms_worst(
    dra_socket: str,
) -> None:
    for attempt in range(ATTEMPTS):
        latencies = measure(dra_socket)
        try:
            check(latencies)
            return
        except AssertionError:
            if attempt == ATTEMPTS - 1:
                raise
