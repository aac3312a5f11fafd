"""A listen address another process holds (issue 26: `--bind-address=:8080` on hostNetwork):
one line per attempt naming the address and what to change, no traceback, and a quiet
retry with backoff that starts the server once the port is free."""

from __future__ import annotations

import errno
import io
import logging
import random
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing
from fixed_views import FixedDebug, fixed_readiness

from dracpu.http import HTTPApp, serve_http
from dracpu.http.server import ListenError, listen_error_message
from dracpu.logs import KlogFormatter
from dracpu.nursery import Service, ServiceBlocked, ServiceFailed, Supervisor

MAIN_PATHS = ("/healthz", "/readyz", "/metrics")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def log_text() -> Iterator[io.StringIO]:
    """Every dracpu log line of the test, formatted as the daemon writes them."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(KlogFormatter())
    logger = logging.getLogger("dracpu")
    level = logger.level
    logger.setLevel(logging.WARNING)  # whatever verbosity an earlier test left on the root
    logger.addHandler(handler)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture
def taken_port() -> Iterator[tuple[socket.socket, int]]:
    """A loopback port another process (this socket) listens on."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        yield holder, holder.getsockname()[1]
    finally:
        holder.close()


def main_app() -> HTTPApp:
    return HTTPApp(readiness=fixed_readiness({"nri": True}), registry=None)


async def test_serve_http_on_a_taken_port_raises_one_listen_error(
    taken_port: tuple[socket.socket, int],
) -> None:
    _, port = taken_port
    with pytest.raises(ListenError) as info:
        await serve_http("127.0.0.1", port, main_app())
    assert isinstance(info.value, ServiceBlocked)
    assert info.value.errno == errno.EADDRINUSE
    assert (info.value.host, info.value.port) == ("127.0.0.1", port)
    assert isinstance(info.value.__cause__, OSError)
    assert "\n" not in str(info.value)


async def test_a_taken_port_is_one_line_per_attempt_then_it_starts_when_freed(
    autojump_clock: trio.testing.MockClock,
    log_text: io.StringIO,
    taken_port: tuple[socket.socket, int],
) -> None:
    holder, port = taken_port
    sup = Supervisor(rand=random.Random(7).random)
    attempts = 0
    serve = partial(serve_http, "127.0.0.1", port, main_app())

    async def counted(*, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal attempts
        attempts += 1
        await serve(task_status=task_status)

    bound: list[int] = []

    async def start() -> None:
        bound.append(await sup.start(Service(name="http", run=counted)))

    async with sup.open(), trio.open_nursery() as nursery:
        nursery.start_soon(start)
        # Backoff 0.5 s doubling to the 30 s cap, jittered down by up to 20 %: about six
        # attempts in 30 s, then one every 24-30 s. Not hundreds.
        await trio.sleep(30)
        assert bound == []
        assert 4 <= attempts <= 7
        assert sup.status()["http"].state == "backoff"
        text = log_text.getvalue()
        lines = [line for line in text.splitlines() if line.startswith("E")]
        assert len(lines) == attempts
        assert "Traceback" not in text and "stacktrace" not in text
        assert len(text.splitlines()) == len(lines)  # nothing but those lines
        for line in lines:
            assert '"service cannot run; retrying"' in line
            assert 'service="http"' in line
            assert f"cannot listen on 127.0.0.1:{port} (port {port} on 127.0.0.1)" in line
            assert "another process on this node already listens there" in line
            assert "choose a free port with --bind-address=127.0.0.1:PORT" in line
            assert "healthz" in line and "containerPort" in line and "probes" in line
            assert "retryIn=" in line
        assert "attempts=1 " in lines[0] + " " and f"attempts={attempts}" in lines[-1]

        holder.close()  # the other process goes away: the next retry binds
        await trio.sleep(31)
        assert bound == [port]
        assert sup.status()["http"].state == "running"
        await sup.stop()


async def test_a_service_that_stays_blocked_gives_up_without_a_traceback(
    autojump_clock: trio.testing.MockClock,
    log_text: io.StringIO,
    taken_port: tuple[socket.socket, int],
) -> None:
    _, port = taken_port
    sup = Supervisor(rand=random.Random(7).random)
    service = Service(
        name="debug-http",
        run=partial(serve_http, "127.0.0.1", port, HTTPApp.debug_only(FixedDebug())),
        max_restarts=2,
    )
    async with sup.open():
        with pytest.raises(ServiceFailed) as info:
            await sup.start(service)
    assert "--debug-address=127.0.0.1:PORT" in str(info.value)
    text = log_text.getvalue()
    assert "Traceback" not in text and "stacktrace" not in text
    assert len(text.splitlines()) == 3  # two retries, then the give-up line
    assert '"service failed; not restarting"' in text.splitlines()[-1]


async def test_a_group_of_blocked_leaves_is_quiet_too(
    autojump_clock: trio.testing.MockClock, log_text: io.StringIO
) -> None:
    async def both_taken(*, task_status: trio.TaskStatus[None]) -> None:
        raise ExceptionGroup("listeners", [ServiceBlocked("port 1 taken"), ServiceBlocked("2")])

    sup = Supervisor(rand=random.Random(7).random)
    async with sup.open():
        with pytest.raises(ServiceFailed):
            await sup.start(Service(name="http", run=both_taken, max_restarts=0))
    text = log_text.getvalue()
    assert "Traceback" not in text and len(text.splitlines()) == 1


async def test_a_bug_still_gets_its_traceback(
    autojump_clock: trio.testing.MockClock, log_text: io.StringIO
) -> None:
    async def broken(*, task_status: trio.TaskStatus[None]) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")

    sup = Supervisor(rand=random.Random(7).random)
    async with sup.open():
        with pytest.raises(ServiceFailed):
            await sup.start(Service(name="http", run=broken, max_restarts=0))
    assert "Traceback" in log_text.getvalue()


@pytest.mark.parametrize(
    ("host", "port", "paths", "err", "expected"),
    [
        (
            "",
            8080,
            MAIN_PATHS,
            OSError(errno.EADDRINUSE, "Address already in use"),
            "cannot listen on :8080 (port 8080 on every interface) for /healthz, /readyz, "
            "/metrics: another process on this node already listens there (`ss -ltnp "
            "'sport = :8080'` on the node names it); choose a free port with "
            "--bind-address=:PORT and give the DaemonSet's `healthz` containerPort the same "
            "port (the startup, liveness and readiness probes use that named port; "
            "deploy/base/daemonset.yaml)",
        ),
        (
            "127.0.0.1",
            8081,
            ("/debug/state",),
            OSError(errno.EADDRINUSE, "Address already in use"),
            "cannot listen on 127.0.0.1:8081 (port 8081 on 127.0.0.1) for /debug/state: "
            "another process on this node already listens there (`ss -ltnp 'sport = :8081'` "
            "on the node names it); choose a free port with --debug-address=127.0.0.1:PORT",
        ),
        (
            "::1",
            8080,
            MAIN_PATHS,
            OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"),
            "cannot listen on [::1]:8080 (port 8080 on ::1) for /healthz, /readyz, /metrics: "
            "cannot assign requested address; choose another address with --bind-address and "
            "give the DaemonSet's `healthz` containerPort the same port (the startup, liveness "
            "and readiness probes use that named port; deploy/base/daemonset.yaml)",
        ),
    ],
)
def test_the_message_names_the_address_the_flag_and_the_manifest(
    host: str, port: int, paths: tuple[str, ...], err: OSError, expected: str
) -> None:
    assert listen_error_message(host, port, paths, err) == expected


KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- {name: c, cluster: {server: "http://127.0.0.1:9"}}
contexts:
- {name: c, context: {cluster: c, user: u}}
current-context: c
users:
- {name: u, user: {}}
"""


def test_the_daemon_on_a_taken_bind_address_logs_one_line_per_attempt(
    tmp_path: Path, taken_port: tuple[socket.socket, int]
) -> None:
    # The case end to end: `dracpu run` whose --bind-address another process holds.
    _, port = taken_port
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    daemon = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "dracpu"), "run",
         f"--kubeconfig={tmp_path / 'kubeconfig'}", f"--bind-address=127.0.0.1:{port}",
         "--debug-address=127.0.0.1:0", f"--state-dir={tmp_path / 'state'}",
         f"--cdi-dir={tmp_path / 'cdi'}", f"--kubelet-root-dir={tmp_path / 'kubelet'}",
         f"--nri-socket={tmp_path / 'nri.sock'}", f"--cgroup-root={tmp_path / 'cg'}",
         f"--sysfs-root={REPO / 'tests' / 'fake_sysfs' / 'xeon-2s-ht'}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # Read until the second attempt (a slow machine takes seconds to import and start).
    watchdog = threading.Timer(60, daemon.kill)
    watchdog.start()
    seen: list[str] = []
    try:
        assert daemon.stderr is not None
        for line in daemon.stderr:
            seen.append(line)
            attempts = sum("service cannot run" in s or "service crashed" in s for s in seen)
            if attempts == 2:
                break
    finally:
        watchdog.cancel()
        daemon.send_signal(signal.SIGTERM)
        _, rest = daemon.communicate(timeout=30)
    err = "".join(seen) + rest
    assert daemon.returncode == 0, err
    assert "Traceback" not in err and "stacktrace" not in err
    retries = [line for line in err.splitlines() if "service cannot run" in line]
    assert len(retries) >= 2, err
    for line in retries:
        assert line.startswith("E")
        assert f'err="cannot listen on 127.0.0.1:{port} (port {port} on 127.0.0.1)' in line
        assert "--bind-address=127.0.0.1:PORT" in line and 'service="http"' in line
