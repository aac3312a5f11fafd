"""Shutdown with work hung in worker threads: a service whose blocking call is abandoned on
cancel (``abandon_on_cancel=True``) stops at once, so SIGTERM ends the daemon within its
grace period; one that waits for its thread is the bug the grace period guards against,
and the daemon exits anyway at the end of it."""

from __future__ import annotations

import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager

import trio
import trio.testing

from dracpu.nursery import Service, Supervisor, run_daemon


class Hang:
    """A blocking call that never returns until the test lets it (a hung cgroupfs write,
    a kubernetes call to a dead API server, a read of a stuck NFS file)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def __call__(self) -> None:
        self.entered.set()
        self.release.wait(timeout=60)


class OneSignal:
    """A signal source that delivers SIGTERM when ``send`` is called."""

    def __init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel[int](1)

    @contextmanager
    def __call__(self, *signals: int) -> Iterator[AsyncIterator[int]]:
        yield self.receive


def stuck_in_thread(hang: Hang, *, abandon: bool):  # type: ignore[no-untyped-def]
    async def run(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        await trio.to_thread.run_sync(hang, abandon_on_cancel=abandon)

    return run


def stuck_startup(
    name: str, hang: Hang, *, abandon: bool
) -> Callable[[Supervisor], Awaitable[None]]:
    """The daemon's start-up: one service stuck in ``hang``, started once its thread is in."""

    async def startup(s: Supervisor) -> None:
        await s.start(Service(name=name, run=stuck_in_thread(hang, abandon=abandon)))
        await trio.to_thread.run_sync(hang.entered.wait)

    return startup


async def sigterm_at(sup: Supervisor, signals: OneSignal, at: float) -> None:
    """SIGTERM at ``at`` seconds (clock time), once start-up is complete."""
    await sup.startup_complete.wait()
    await trio.sleep_until(at)
    await signals.send.send(signal.SIGTERM)


async def test_an_abandonable_thread_does_not_hold_up_shutdown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hang = Hang()
    sup = Supervisor()
    signals = OneSignal()
    exits: list[int] = []

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sigterm_at, sup, signals, 10)
            code = await run_daemon(
                stuck_startup("cgroup-writer", hang, abandon=True),
                supervisor=sup,
                exit_process=exits.append,
                signal_receiver=signals,
            )
        # Stopped the moment the signal came: no grace period spent, nothing left over.
        assert (code, exits, sup.abandoned) == (0, [], [])
        assert trio.current_time() == 10.0
        assert sup.status()["cgroup-writer"].state == "stopped"
        assert not hang.release.is_set()  # the thread itself is still blocked, abandoned
    finally:
        hang.release.set()


async def test_a_thread_waited_for_is_given_the_grace_period_then_the_process_exits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hang = Hang()
    sup = Supervisor(grace_period=5.0)
    signals = OneSignal()
    exits: list[tuple[int, float]] = []

    def exit_process(code: int) -> None:
        exits.append((code, trio.current_time()))
        hang.release.set()  # the process would be gone; here the thread may finish

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sigterm_at, sup, signals, 10)
            await run_daemon(
                stuck_startup("checkpoint", hang, abandon=False),
                supervisor=sup,
                exit_process=exit_process,
                signal_receiver=signals,
            )
        assert exits == [(0, 15.0)]  # the signal at 10 s, plus the 5 s grace
        assert sup.abandoned == ["checkpoint"]
    finally:
        hang.release.set()


async def test_other_services_stop_in_order_around_an_abandoned_thread(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hang = Hang()
    sup = Supervisor()
    stopped: list[str] = []

    def tracked(name: str):  # type: ignore[no-untyped-def]
        async def run(*, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                stopped.append(name)

        return run

    try:
        async with sup.open():
            await sup.start(Service(name="http", run=tracked("http")))
            await sup.start(Service(name="drift", run=stuck_in_thread(hang, abandon=True)))
            await sup.start(Service(name="slices", run=tracked("slices")))
            await trio.to_thread.run_sync(hang.entered.wait)
        assert stopped == ["slices", "http"]
        assert sup.abandoned == [] and trio.current_time() == 0
    finally:
        hang.release.set()
