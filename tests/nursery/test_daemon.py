"""The supervisor with real services: the HTTP server started, restarted and stopped through
it, and the daemon main's exit when a service has to be abandoned."""

from __future__ import annotations

from functools import partial

import pytest
import trio
import trio.testing
from builders import fetch, no_signals

from dracpu.http import HTTPApp, serve_http
from dracpu.nursery import Service, Supervisor, SupervisorStopping, run_daemon


async def test_http_server_under_the_supervisor() -> None:
    sup = Supervisor()
    flags = [sup.readiness.declare(name) for name in ("kubelet-registration", "nri", "slices")]
    app = HTTPApp(readiness=sup.readiness.view())
    seen: dict[str, object] = {}

    async def startup(s: Supervisor) -> None:
        port = await s.start(Service(name="http", run=partial(serve_http, "127.0.0.1", 0, app)))
        seen["before"] = await trio.to_thread.run_sync(fetch, port, "/readyz")
        for flag in flags:
            flag.set_ready()
        app.mark_started()
        seen["after"] = await trio.to_thread.run_sync(fetch, port, "/readyz")
        seen["healthz"] = await trio.to_thread.run_sync(fetch, port, "/healthz")
        seen["port"] = port
        s.request_stop("test done")

    assert await sup.run_until_signal(startup, signal_receiver=no_signals) == 0
    assert seen["before"] == (
        503,
        b"[-] kubelet-registration: not ready yet\n[-] nri: not ready yet\n"
        b"[-] slices: not ready yet\nreadyz check failed\n",
    )
    assert seen["after"] == (200, b"ok")
    assert seen["healthz"] == (200, b"")
    assert sup.status()["http"].state == "stopped"
    with pytest.raises(ConnectionRefusedError):
        await trio.to_thread.run_sync(fetch, seen["port"], "/healthz")


async def test_stopped_before_it_started(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor()

    async def never(*, task_status: trio.TaskStatus[None]) -> None:
        await trio.sleep_forever()

    errors: list[str] = []

    async def start_it() -> None:
        try:
            await sup.start(Service(name="kubelet", run=never))
        except SupervisorStopping as exc:
            errors.append(str(exc))

    async with sup.open() as root, trio.open_nursery() as nursery:
        nursery.start_soon(start_it)
        await trio.sleep(1)
        await root.stop()
    assert errors == ['service "kubelet" was stopped before it started']


async def test_run_daemon_exits_the_process_when_a_service_is_abandoned(
    autojump_clock: trio.testing.MockClock,
) -> None:
    release = trio.Event()
    exits: list[int] = []

    def exit_process(code: int) -> None:
        exits.append(code)
        release.set()  # the process would end here

    async def stubborn(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        with trio.CancelScope(shield=True):
            await release.wait()

    async def startup(s: Supervisor) -> None:
        await s.start(Service(name="stubborn", run=stubborn))
        s.fail("NRI session lost for good")

    code = await run_daemon(startup, exit_process=exit_process, signal_receiver=no_signals)
    assert (code, exits) == (1, [1])
    assert trio.current_time() == 5.0


async def test_run_daemon_returns_normally_when_everything_stopped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    exits: list[int] = []

    async def startup(s: Supervisor) -> None:
        s.request_stop("done")

    code = await run_daemon(startup, exit_process=exits.append, signal_receiver=no_signals)
    assert (code, exits) == (0, [])
