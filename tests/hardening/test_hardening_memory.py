"""Memory that maximal requests take comes back once they are over.

The DRA socket is served by a child process (``dra_server.py``), so the RSS read from
``/proc/<pid>/status`` is the server's alone. 50 prepares whose claim name fills the
message to just under the 4 MiB limit arrive two at a time on 25 connections at once,
and the server's RSS must be back under 150 MB within 10 s of the last answer, with the
connections still open.

Before the fix the server sat at ~290 MB after this (69 MB before it): each open
connection held its last request in the read loop, message buffers were copied twice
more at the end and reallocated on the way up, and glibc kept the freed heap resident.
Now the connection keeps nothing, the heap's reclaimer collects and trims once the burst
is over, and RSS is back at ~70 MB about a second later (quiet machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from kubelet_harness import claim, prepare_request, prepare_stub, short_dir

from dracpu.grpc.framing import MAX_MESSAGE_SIZE

MiB = 1024 * 1024
CALLS = 50
CONNECTIONS = 25
RSS_BOUND_MB = 150.0
WITHIN = 10.0  # seconds after the last answer
SERVER = Path(__file__).with_name("dra_server.py")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
def server() -> Iterator[tuple[int, str]]:
    root = short_dir("rss.")
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "dra", root],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        path = proc.stdout.readline().strip()
        assert path and os.path.exists(path), "the server did not start"
        yield proc.pid, path
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_rss_comes_back_after_maximal_hostile_calls(server: tuple[int, str]) -> None:
    pid, path = server
    # The largest request the server accepts: a claim name that fills the message.
    request = prepare_request("v1", claim("u-long", name="n" * (MAX_MESSAGE_SIZE - 64)))
    assert MAX_MESSAGE_SIZE - 64 < request.ByteSize() <= MAX_MESSAGE_SIZE
    options = [
        ("grpc.use_local_subchannel_pool", 1),  # a connection per channel
        ("grpc.max_send_message_length", 8 * MiB),
    ]
    channels = [grpc.insecure_channel("unix:" + path, options=options) for _ in range(CONNECTIONS)]
    try:
        calls = [prepare_stub(channel) for channel in channels]

        def hostile(i: int) -> grpc.StatusCode:
            try:
                calls[i % CONNECTIONS](request, timeout=120)
            except grpc.RpcError as exc:
                return exc.code()  # type: ignore[no-any-return]
            return grpc.StatusCode.OK

        before = rss_mb(pid)
        with ThreadPoolExecutor(CONNECTIONS) as pool:
            codes = list(pool.map(hostile, range(CALLS)))
        # Refused before any lookup: no API server could hold such a name.
        assert codes == [grpc.StatusCode.UNKNOWN] * CALLS
        after = rss_mb(pid)
        deadline = time.monotonic() + WITHIN
        samples = [after]
        while samples[-1] >= RSS_BOUND_MB and time.monotonic() < deadline:
            time.sleep(0.1)
            samples.append(rss_mb(pid))
        assert samples[-1] < RSS_BOUND_MB, (before, samples[::10])
    finally:
        for channel in channels:
            channel.close()
