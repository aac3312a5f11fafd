"""The one readiness source and the one wake-up pattern: ``Readiness`` (components, reasons,
flags, the read-only view) and ``Pulse``. Waiters wake at the moment of the report that
changes their answer, on a mock clock, with nothing polling."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from fixed_views import FixedDebug

from dracpu.http import HTTPApp, Request
from dracpu.nursery import Pulse, Readiness, ReadinessView, ReadyFlag

COMPONENTS = ("kubelet-registration", "nri", "slices")


# -- Pulse -------------------------------------------------------------------------------------


async def test_a_fire_wakes_every_waiter_of_that_moment_and_no_later_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pulse = Pulse()
    woke: list[tuple[str, float]] = []

    async def waiter(name: str) -> None:
        await pulse.wait()
        woke.append((name, trio.current_time()))

    pulse.fire()  # nobody waits yet: remembered by no one
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, "a")
        nursery.start_soon(waiter, "b")
        await trio.sleep(2)
        assert woke == []
        pulse.fire()
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(woke) == [("a", 2.0), ("b", 2.0)]
        nursery.start_soon(waiter, "late")
        await trio.sleep(1)
        assert len(woke) == 2  # the earlier fire does not wake a later waiter
        pulse.fire()
    assert woke[-1] == ("late", 3.0)
    assert pulse.fired == 3


async def test_wait_until_looks_only_after_fires(autojump_clock: trio.testing.MockClock) -> None:
    pulse = Pulse()
    looks: list[float] = []
    value = 0

    def reached() -> bool:
        looks.append(trio.current_time())
        return value >= 2

    async def bump() -> None:
        nonlocal value
        for at in (1.0, 5.0):
            await trio.sleep_until(at)
            value += 1
            pulse.fire()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(bump)
        await pulse.wait_until(reached)
    assert looks == [0.0, 1.0, 5.0]  # once at the start, then once per fire
    await pulse.wait_until(lambda: True)  # already true: no wait
    assert trio.current_time() == 5.0


async def test_wait_past_keeps_a_fire_that_came_while_busy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pulse = Pulse()
    noted = pulse.fired
    pulse.fire()  # while the waiter was busy elsewhere (a check, a flush)
    await pulse.wait_past(noted)  # not lost: returns at once
    assert trio.current_time() == 0
    noted = pulse.fired
    woke: list[float] = []

    async def waiter() -> None:
        await pulse.wait_past(noted)
        woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(4)
        assert woke == []
        pulse.fire()
    assert woke == [4.0]


# -- Readiness ---------------------------------------------------------------------------------


def test_components_reasons_and_declaring_again() -> None:
    readiness = Readiness()
    assert readiness.ready  # nothing declared yet
    registration = readiness.declare("kubelet-registration", "waiting for the kubelet")
    nri = readiness.declare("nri", "runtime not connected")
    readiness.declare("slices")
    assert not readiness.ready
    assert readiness.components() == {
        "kubelet-registration": False,
        "nri": False,
        "slices": False,
    }
    assert readiness.reasons() == {
        "kubelet-registration": "waiting for the kubelet",
        "nri": "runtime not connected",
        "slices": "not ready yet",
    }
    registration.set_ready()
    nri.set_not_ready("not synchronized")
    assert readiness.reasons()["nri"] == "not synchronized"
    assert readiness.reasons()["kubelet-registration"] == ""
    nri.set(True)
    readiness.declare("slices").set_ready()  # a second flag for the same component
    assert readiness.ready
    assert readiness.declare("nri", "ignored").ready  # declaring again resets nothing
    nri.set_not_ready("")
    assert readiness.reasons()["nri"] == "not ready"


def test_bad_component_names_are_refused() -> None:
    readiness = Readiness()
    with pytest.raises(ValueError, match="a readiness component needs a name"):
        readiness.declare("")
    with pytest.raises(KeyError, match='readiness component "nri" was never declared'):
        readiness.set("nri", True)
    readiness.mark_down("drift", "crashed")  # a service without a component: nothing
    assert readiness.components() == {}


def test_only_changes_wake_waiters() -> None:
    readiness = Readiness()
    nri = readiness.declare("nri")
    fired = readiness._changed.fired
    nri.set_not_ready("not ready yet")  # what it already says
    assert readiness._changed.fired == fired
    nri.set_not_ready("runtime not connected")  # a new reason is news
    nri.set_ready()
    nri.set_ready()
    assert readiness._changed.fired == fired + 2


def test_the_view_reads_and_waits_but_cannot_set() -> None:
    readiness = Readiness()
    readiness.declare("nri")
    view = readiness.view()
    assert isinstance(view, ReadinessView)
    assert view.components() == {"nri": False} and not view.ready
    for name in ("set", "declare", "mark_down", "set_ready"):
        assert not hasattr(view, name)
    view.components()["nri"] = True  # a copy: the source is untouched
    assert readiness.components() == {"nri": False}


def test_a_standalone_flag_has_a_readiness_of_its_own() -> None:
    flag = ReadyFlag.standalone("nri", "runtime not connected")
    assert (flag.name, flag.ready, flag.reason) == ("nri", False, "runtime not connected")
    flag.set_ready()
    assert flag.ready and flag.reason == ""


async def test_a_readyz_waiter_wakes_when_the_last_component_reports(
    autojump_clock: trio.testing.MockClock,
) -> None:
    readiness = Readiness()
    flags = [readiness.declare(name) for name in COMPONENTS]
    app = HTTPApp(readiness=readiness.view())
    woke: list[tuple[float, int]] = []

    async def waiter() -> None:
        await readiness.view().wait_ready()
        status = app.handle(Request(method="GET", target="/readyz")).status
        woke.append((trio.current_time(), status))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        for at, flag in zip((1.0, 2.0, 3.75), flags, strict=True):
            await trio.sleep_until(at)
            assert woke == []
            flag.set_ready()
        await trio.testing.wait_all_tasks_blocked()
        assert woke == [(3.75, 200)]  # that moment, and /readyz already says so


async def test_a_component_waiter_ignores_the_others(
    autojump_clock: trio.testing.MockClock,
) -> None:
    readiness = Readiness()
    nri, slices = readiness.declare("nri"), readiness.declare("slices")
    woke: list[float] = []

    async def wait_slices() -> None:
        await slices.wait_ready()
        woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_slices)
        await trio.sleep(1)
        nri.set_ready()
        await trio.sleep(1)
        assert woke == []
        slices.set_ready()
    assert woke == [2.0]


def test_debug_and_readiness_views_serve_the_same_source() -> None:
    readiness = Readiness()
    readiness.declare("nri").set_not_ready("runtime not connected")
    main = HTTPApp(readiness=readiness.view())
    debug = HTTPApp.debug_only(FixedDebug({"ready": readiness.components()}))
    assert main.handle(Request(method="GET", target="/readyz")).body == (
        b"[-] nri: runtime not connected\nreadyz check failed\n"
    )
    assert b'"nri": false' in debug.handle(Request(method="GET", target="/debug/state")).body
