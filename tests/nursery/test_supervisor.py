"""The root supervisor under MockClock: start order, restarts with backoff, critical
failures, readiness, shutdown order and grace, signals."""

from __future__ import annotations

import io
import itertools
import logging
import os
import random
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from functools import partial

import pytest
import trio
import trio.testing
from builders import no_signals

from dracpu.logs import KlogFormatter
from dracpu.nursery import (
    Service,
    ServiceFailed,
    ServiceStatus,
    Supervisor,
    SupervisorStopping,
    restart_delay,
    run_daemon,
)


class Boom(Exception):
    pass


@pytest.fixture
def log_text() -> Iterator[io.StringIO]:
    """Error lines of the supervisor, formatted as the daemon writes them."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(KlogFormatter())
    logger = logging.getLogger("dracpu.nursery.supervisor")
    logger.addHandler(handler)
    try:
        yield out
    finally:
        logger.removeHandler(handler)


async def forever(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    await trio.sleep_forever()


class Flaky:
    """Starts, then crashes after ``run_for`` seconds, ``crashes`` times; then stays up."""

    def __init__(self, crashes: int, *, run_for: float = 0.0, before_started: bool = False):
        self.crashes = crashes
        self.run_for = run_for
        self.before_started = before_started
        self.attempt_times: list[float] = []

    async def run(self, *, task_status: trio.TaskStatus[int]) -> None:
        attempt = len(self.attempt_times)
        self.attempt_times.append(trio.current_time())
        if self.before_started and attempt < self.crashes:
            raise Boom(f"attempt {attempt} failed early")
        task_status.started(attempt)
        await trio.sleep(self.run_for)
        if attempt < self.crashes:
            raise Boom(f"attempt {attempt} crashed")
        await trio.sleep_forever()


class Ticker:
    """A healthy service that counts its runs and its ticks."""

    def __init__(self) -> None:
        self.runs = 0
        self.ticks = 0
        self.cancelled = False

    async def run(self, *, task_status: trio.TaskStatus[None]) -> None:
        self.runs += 1
        task_status.started()
        try:
            while True:
                await trio.sleep(1)
                self.ticks += 1
        except trio.Cancelled:
            self.cancelled = True
            raise


async def test_start_waits_for_started_and_returns_its_value(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = Supervisor()
    async with sup.open():

        async def slow_start(*, task_status: trio.TaskStatus[int]) -> None:
            await trio.sleep(3)
            task_status.started(8080)
            await trio.sleep_forever()

        port = await sup.start(Service(name="http", run=slow_start))
        assert port == 8080
        assert trio.current_time() == 3
        assert sup.status() == {
            "http": ServiceStatus(name="http", state="running", critical=False, restarts=0)
        }
        await sup.stop()
        assert sup.status()["http"].state == "stopped"


async def test_start_order_is_the_callers_order(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor()
    async with sup.open():
        events: list[str] = []

        def make(name: str, delay: float):  # type: ignore[no-untyped-def]
            async def run(*, task_status: trio.TaskStatus[None]) -> None:
                events.append(f"begin {name}")
                await trio.sleep(delay)
                events.append(f"started {name}")
                task_status.started()
                await trio.sleep_forever()

            return run

        await sup.start(Service(name="topology", run=make("topology", 2)))
        await sup.start(Service(name="state", run=make("state", 1)))
        async with trio.open_nursery() as side_by_side:
            side_by_side.start_soon(sup.start, Service(name="kubelet", run=make("kubelet", 3)))
            side_by_side.start_soon(sup.start, Service(name="nri", run=make("nri", 1)))
        await sup.start(Service(name="slices", run=make("slices", 0)))
        assert events[:4] == ["begin topology", "started topology", "begin state", "started state"]
        # The pair starts side by side (in either order); neither waits for the other.
        assert set(events[4:6]) == {"begin kubelet", "begin nri"}
        assert events[6:] == ["started nri", "started kubelet", "begin slices", "started slices"]
        assert set(sup.status()) == {"topology", "state", "kubelet", "nri", "slices"}
        await sup.stop()


async def test_crash_restarts_with_configured_backoff_and_leaves_others_alone(
    autojump_clock: trio.testing.MockClock, log_text: io.StringIO
) -> None:
    sup = Supervisor(rand=random.Random(42).random)
    async with sup.open():
        flaky = Flaky(crashes=4, run_for=1.0)
        ticker = Ticker()
        await sup.start(Service(name="ticker", run=ticker.run))
        service = Service(
            name="nri",
            run=flaky.run,
            backoff_initial=0.5,
            backoff_factor=3.0,
            backoff_cap=5.0,
            backoff_jitter=0.5,
        )
        await sup.start(service)
        await trio.sleep(100.5)

        expected_rng = random.Random(42)
        expected = [0.0]
        for failures in range(1, 5):
            delay = restart_delay(
                failures, initial=0.5, factor=3.0, cap=5.0, jitter=0.5, rand=expected_rng.random
            )
            expected.append(expected[-1] + 1.0 + delay)
        assert flaky.attempt_times == pytest.approx(expected)
        gaps = [b - a - 1.0 for a, b in itertools.pairwise(expected)]
        # The ceilings grow 0.5, 1.5, 4.5, then the 5 s cap; jitter takes off at most half.
        for gap, ceiling in zip(gaps, [0.5, 1.5, 4.5, 5.0], strict=True):
            assert ceiling / 2 <= gap <= ceiling

        status = sup.status()
        assert status["nri"] == ServiceStatus(
            name="nri",
            state="running",
            critical=False,
            restarts=4,
            last_error="Boom: attempt 3 crashed",
        )
        assert ticker.runs == 1 and not ticker.cancelled
        assert ticker.ticks == 100
        assert status["ticker"].restarts == 0
        lines = [line for line in log_text.getvalue().splitlines() if line.startswith("E")]
        assert len(lines) == 4
        assert (
            '"service crashed; restarting" err="Boom: attempt 0 crashed" service="nri"' in lines[0]
        )
        assert "restarts=0" in lines[0] and "restarts=3" in lines[3]
        assert 'raise Boom(f"attempt {attempt} crashed")' in log_text.getvalue()  # the traceback
        await sup.stop()
        assert ticker.cancelled


async def test_status_shows_backoff_while_waiting(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor(rand=lambda: 0.0)
    async with sup.open():
        flaky = Flaky(crashes=1, run_for=1.0)
        await sup.start(Service(name="s", run=flaky.run, backoff_initial=10, backoff_jitter=0))
        await trio.sleep(5)
        assert sup.status()["s"].state == "backoff"
        assert sup.status()["s"].last_error == "Boom: attempt 0 crashed"
        await trio.sleep(10)
        assert sup.status()["s"].state == "running"
        assert sup.status()["s"].restarts == 1
        await sup.stop()


async def test_a_long_stable_run_resets_the_backoff(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor(rand=lambda: 0.99999)
    async with sup.open():
        flaky = Flaky(crashes=3, run_for=120.0)  # each run outlives stable_after (60 s)
        await sup.start(Service(name="s", run=flaky.run, backoff_initial=1, backoff_jitter=0))
        await trio.sleep(1000)
        gaps = [b - a - 120.0 for a, b in itertools.pairwise(flaky.attempt_times)]
        assert gaps == pytest.approx([1.0, 1.0, 1.0])
        await sup.stop()


async def test_crash_before_started_is_retried_and_start_keeps_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = Supervisor(rand=lambda: 0.0)
    async with sup.open():
        flaky = Flaky(crashes=2, before_started=True)
        value = await sup.start(
            Service(name="kubelet", run=flaky.run, backoff_initial=1, backoff_jitter=0)
        )
        assert value == 2
        assert trio.current_time() == 3.0  # 1 s, then 2 s of backoff
        assert sup.status()["kubelet"].restarts == 2
        await sup.stop()


async def test_start_raises_when_the_service_fails_for_good_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = Supervisor(rand=lambda: 0.0)
    async with sup.open():
        flaky = Flaky(crashes=10, before_started=True)
        with pytest.raises(ServiceFailed) as info:
            await sup.start(Service(name="topology", run=flaky.run, max_restarts=2))
        assert str(info.value) == 'service "topology" failed to start: Boom: attempt 2 failed early'
        assert len(flaky.attempt_times) == 3
        assert sup.status()["topology"].state == "failed"
        assert sup.fatal_error is None  # not critical


async def test_noncritical_service_out_of_restarts_fails_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = Supervisor(rand=lambda: 0.0)
    async with sup.open():
        ticker = Ticker()
        await sup.start(Service(name="ticker", run=ticker.run))
        flaky = Flaky(crashes=10, run_for=1.0)
        await sup.start(Service(name="watcher", run=flaky.run, max_restarts=1))
        await trio.sleep(60)
        assert sup.status()["watcher"].state == "failed"
        assert sup.status()["watcher"].restarts == 1
        assert sup.status()["watcher"].last_error == "Boom: attempt 1 crashed"
        assert sup.fatal_error is None
        assert sup.status()["ticker"].state == "running" and not ticker.cancelled
        await sup.stop()


async def test_no_restart_policy(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor()
    async with sup.open():
        flaky = Flaky(crashes=10, run_for=1.0)
        await sup.start(Service(name="once", run=flaky.run, restart=False))
        await trio.sleep(10)
        assert len(flaky.attempt_times) == 1
        assert sup.status()["once"].state == "failed"


async def test_critical_failure_stops_everything_with_the_error(
    autojump_clock: trio.testing.MockClock, log_text: io.StringIO
) -> None:
    sup = Supervisor(rand=lambda: 0.0)
    ticker = Ticker()
    flaky = Flaky(crashes=100, run_for=2.0)

    async def startup(s: Supervisor) -> None:
        await s.start(Service(name="http", run=ticker.run))
        await s.start(
            Service(
                name="nri",
                run=flaky.run,
                critical=True,
                max_restarts=3,
                backoff_initial=1,
                backoff_jitter=0,
            )
        )

    code = await sup.run_until_signal(startup, signal_receiver=no_signals)
    assert code == 1
    assert sup.fatal_error == 'service "nri" failed 4 times in a row: Boom: attempt 3 crashed'
    # 4 runs of 2 s and backoffs of 1, 2, 4 s
    assert trio.current_time() == 15.0
    assert ticker.cancelled
    assert {name: st.state for name, st in sup.status().items()} == {
        "http": "stopped",
        "nri": "failed",
    }
    text = log_text.getvalue()
    assert (
        '"failed to run" err="service \\"nri\\" failed 4 times in a row: '
        'Boom: attempt 3 crashed"' in text
    )


async def test_startup_error_exits_1_and_stops_what_started(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = Supervisor()
    ticker = Ticker()

    async def startup(s: Supervisor) -> None:
        await s.start(Service(name="http", run=ticker.run))
        raise RuntimeError("driver failed to initialize: no online CPUs")

    code = await sup.run_until_signal(startup, signal_receiver=no_signals)
    assert code == 1
    assert sup.fatal_error == "RuntimeError: driver failed to initialize: no online CPUs"
    assert ticker.cancelled
    assert not sup.startup_complete.is_set()


async def test_shutdown_is_reverse_start_order_with_cleanup(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = Supervisor()
    async with sup.open():
        stopped: list[tuple[str, float]] = []

        def make(name: str, cleanup: float):  # type: ignore[no-untyped-def]
            async def run(*, task_status: trio.TaskStatus[None]) -> None:
                task_status.started()
                try:
                    await trio.sleep_forever()
                finally:
                    # Draining in-flight work: shielded, bounded, as the servers do.
                    with trio.CancelScope(shield=True):
                        await trio.sleep(cleanup)
                    stopped.append((name, trio.current_time()))

            return run

        for name, cleanup in (("http", 0.5), ("kubelet", 2.0), ("nri", 1.0), ("slices", 0.0)):
            await sup.start(Service(name=name, run=make(name, cleanup)))
        await sup.stop()
        assert stopped == [("slices", 0.0), ("nri", 1.0), ("kubelet", 3.0), ("http", 3.5)]
        assert sup.abandoned == []
        assert all(st.state == "stopped" for st in sup.status().values())
        with pytest.raises(SupervisorStopping, match='cannot start service "late"'):
            await sup.start(Service(name="late", run=forever))


async def test_service_ignoring_cancellation_is_abandoned_after_grace(
    autojump_clock: trio.testing.MockClock, log_text: io.StringIO
) -> None:
    sup = Supervisor()
    async with sup.open():
        release = trio.Event()
        ticker = Ticker()

        async def stubborn(*, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            with trio.CancelScope(shield=True):
                await release.wait()

        await sup.start(Service(name="http", run=ticker.run))
        await sup.start(Service(name="stubborn", run=stubborn))
        await sup.stop()
        assert trio.current_time() == 5.0
        assert sup.abandoned == ["stubborn"]
        assert sup.status()["stubborn"].state == "failed"
        assert sup.status()["stubborn"].last_error == "did not stop within 5s; abandoned"
        assert ticker.cancelled  # the others were still stopped
        assert '"service did not stop; abandoning it" service="stubborn" grace=5.0' in (
            log_text.getvalue()
        )
        release.set()  # let the test run end


async def test_per_service_grace_period(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor(grace_period=5.0)
    async with sup.open():
        release = trio.Event()

        async def stubborn(*, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            with trio.CancelScope(shield=True):
                await release.wait()

        await sup.start(Service(name="stubborn", run=stubborn, grace_period=0.25))
        await sup.stop()
        assert trio.current_time() == 0.25
        release.set()


async def test_one_shot_service_that_returns_before_started(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = Supervisor()
    async with sup.open():
        done: list[str] = []

        async def restore_state(*, task_status: trio.TaskStatus[None]) -> None:
            await trio.sleep(1)
            done.append("restored")

        assert await sup.start(Service(name="restore", run=restore_state)) is None
        assert done == ["restored"]
        assert sup.status()["restore"].state == "stopped"


async def test_started_twice_is_a_crash(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor()
    async with sup.open():

        async def twice(*, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            task_status.started()

        await sup.start(Service(name="twice", run=twice, restart=False))
        await trio.testing.wait_all_tasks_blocked()
        assert (
            sup.status()["twice"].last_error == 'RuntimeError: service "twice" called started twice'
        )


async def test_exception_group_crash_lists_its_leaves(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = Supervisor()
    async with sup.open():

        async def two_failures(*, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()

            async def fail(msg: str) -> None:
                raise Boom(msg)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(fail, "left")
                nursery.start_soon(fail, "right")

        await sup.start(Service(name="pair", run=two_failures, restart=False))
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(sup.status()["pair"].last_error.split("; ")) == ["Boom: left", "Boom: right"]


async def test_duplicate_service_name(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor()
    async with sup.open():
        await sup.start(Service(name="http", run=forever))
        with pytest.raises(ValueError, match='service "http" is already supervised'):
            await sup.start(Service(name="http", run=forever))
        await sup.stop()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, 'service "": name must not be empty'),
        ({"backoff_initial": -1}, "backoff_initial must be >= 0, got -1"),
        ({"backoff_factor": 0.5}, "backoff_factor must be >= 1, got 0.5"),
        ({"backoff_cap": 0.1}, r"backoff_cap \(0.1\) must be >= backoff_initial \(0.5\)"),
        ({"backoff_jitter": 2}, r"backoff_jitter must be within \[0, 1\], got 2"),
        ({"max_restarts": -1}, "max_restarts must be >= 0, got -1"),
        ({"grace_period": -1.0}, "grace_period must be >= 0, got -1.0"),
    ],
)
def test_bad_service_definitions(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"name": "svc", "run": forever, **kwargs}
    with pytest.raises(ValueError, match=message):
        Service(**args)  # type: ignore[arg-type]


def test_bad_supervisor_grace() -> None:
    with pytest.raises(ValueError, match="grace_period must be >= 0, got -5"):
        Supervisor(grace_period=-5)


# -- readiness ---------------------------------------------------------------------------


async def test_crash_marks_the_services_component_not_ready(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = Supervisor(rand=lambda: 0.0)
    async with sup.open():
        flag = sup.readiness.declare("nri", "runtime not connected")

        class Session:
            runs = 0

            async def run(self, *, task_status: trio.TaskStatus[None]) -> None:
                self.runs += 1
                task_status.started()
                flag.set_ready()
                await trio.sleep(1)
                if self.runs == 1:
                    raise Boom("connection reset")
                await trio.sleep_forever()

        await sup.start(
            Service(name="nri", run=Session().run, backoff_initial=10, backoff_jitter=0)
        )
        assert sup.readiness.ready
        await trio.sleep(2)
        assert not sup.readiness.ready
        assert sup.readiness.reasons()["nri"] == "restarting after crash: Boom: connection reset"
        # Waiting for readiness wakes when the restarted service reports, at 1 + 10 s.
        await sup.readiness.wait_ready()
        assert trio.current_time() == 11.0
        await sup.stop()


async def test_crash_of_a_service_without_a_component_changes_no_readiness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = Supervisor(rand=lambda: 0.0)
    async with sup.open():
        sup.readiness.declare("nri").set_ready()
        flaky = Flaky(crashes=1, run_for=1.0)
        await sup.start(Service(name="drift", run=flaky.run, backoff_initial=10))
        await trio.sleep(2)
        assert sup.status()["drift"].state == "backoff"
        assert sup.readiness.components() == {"nri": True}


# -- signals -----------------------------------------------------------------------------


class FakeSignals:
    def __init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel[int](10)
        self.asked: tuple[int, ...] = ()

    @contextmanager
    def __call__(self, *signals: int) -> Iterator[AsyncIterator[int]]:
        self.asked = signals
        yield self.receive


async def test_fake_signal_stops_cleanly_with_exit_0(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = Supervisor()
    ticker = Ticker()
    signals = FakeSignals()

    async def startup(s: Supervisor) -> None:
        await s.start(Service(name="http", run=ticker.run))

    async def send_later() -> None:
        await sup.startup_complete.wait()
        await trio.sleep(30)
        await signals.send.send(signal.SIGINT)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_later)
        code = await sup.run_until_signal(startup, signal_receiver=signals)
    assert code == 0
    assert signals.asked == (signal.SIGTERM, signal.SIGINT)
    assert sup.signal_received == signal.SIGINT
    assert sup.stop_reason == "received signal SIGINT"
    assert ticker.ticks == 30 and ticker.cancelled


async def test_second_signal_stops_waiting(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor()
    signals = FakeSignals()
    release = trio.Event()

    async def stubborn(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        with trio.CancelScope(shield=True):
            await release.wait()

    async def startup(s: Supervisor) -> None:
        await s.start(Service(name="a", run=stubborn))
        await s.start(Service(name="b", run=stubborn))

    async def send_twice() -> None:
        await sup.startup_complete.wait()
        await signals.send.send(signal.SIGTERM)
        await trio.sleep(1)
        await signals.send.send(signal.SIGTERM)

    exits: list[tuple[int, float]] = []

    def exit_process(code: int) -> None:
        # The process would end here; the test lets the stubborn services go instead.
        exits.append((code, trio.current_time()))
        release.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_twice)
        code = await run_daemon(
            startup, supervisor=sup, exit_process=exit_process, signal_receiver=signals
        )
    assert code == 0
    assert exits == [(0, 1.0)]  # not 2 x 5 s of grace
    assert sup.abandoned == ["b", "a"]


async def test_signal_during_startup_cancels_the_rest_of_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = Supervisor()
    signals = FakeSignals()
    reached: list[str] = []

    async def never_starts(*, task_status: trio.TaskStatus[None]) -> None:
        await trio.sleep_forever()

    async def startup(s: Supervisor) -> None:
        await s.start(Service(name="kubelet", run=never_starts))
        reached.append("after kubelet")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(signals.send.send, signal.SIGTERM))
        code = await sup.run_until_signal(startup, signal_receiver=signals)
    assert code == 0
    assert reached == []
    assert sup.status()["kubelet"].state == "stopped"


async def test_real_sigterm_is_received(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor()
    ticker = Ticker()

    async def startup(s: Supervisor) -> None:
        await s.start(Service(name="http", run=ticker.run))

    async def kill_later() -> None:
        await sup.startup_complete.wait()
        os.kill(os.getpid(), signal.SIGTERM)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(kill_later)
        code = await sup.run_until_signal(startup)
    assert code == 0
    assert sup.signal_received == signal.SIGTERM
    assert ticker.cancelled


async def test_request_stop_and_outer_cancellation_still_stop_services(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = Supervisor()
    ticker = Ticker()

    async def startup(s: Supervisor) -> None:
        await s.start(Service(name="http", run=ticker.run))

    with trio.move_on_after(7.5):
        await sup.run_until_signal(startup, signal_receiver=no_signals)
    assert ticker.ticks == 7 and ticker.cancelled
    assert sup.status()["http"].state == "stopped"

    sup2 = Supervisor()

    async def startup2(s: Supervisor) -> None:
        await s.start(Service(name="http", run=forever))
        s.request_stop("demo finished")

    assert await sup2.run_until_signal(startup2, signal_receiver=no_signals) == 0
    assert sup2.stop_reason == "demo finished"


async def test_an_outer_cancellation_still_stops_in_reverse_order_with_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The services' scopes are shielded: only stop() cancels them, one at a time.
    sup = Supervisor()
    stopped: list[tuple[str, float]] = []

    def make(name: str):  # type: ignore[no-untyped-def]
        async def run(*, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await trio.sleep(1)  # draining
                stopped.append((name, trio.current_time()))

        return run

    async def startup(s: Supervisor) -> None:
        for name in ("http", "kubelet", "slices"):
            await s.start(Service(name=name, run=make(name)))

    with trio.move_on_after(10):
        await sup.run_until_signal(startup, signal_receiver=no_signals)
    assert stopped == [("slices", 11.0), ("kubelet", 12.0), ("http", 13.0)]
