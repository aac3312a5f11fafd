"""Registration as readiness: the kubelet's answer wakes ``wait_registered`` at that moment
(no poll) and sets the ``kubelet-registration`` component with the reason /readyz shows."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from dracpu.kubelet.registration import (
    READY_COMPONENT,
    WAITING_REASON,
    RegistrationError,
    RegistrationService,
)
from dracpu.nursery import Readiness


async def test_wait_registered_wakes_when_the_kubelet_answers(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    service = RegistrationService(endpoint="/x/dra.sock")
    woke: list[float] = []

    async def wait() -> None:
        await service.wait_registered()
        woke.append(trio.current_time())

    nursery.start_soon(wait)
    await trio.sleep(3.5)
    assert woke == []
    service.record_status(False, "bad versions")  # a rejection does not end the wait
    await trio.sleep(0.25)
    assert woke == []
    service.record_status(True, "")
    await trio.testing.wait_all_tasks_blocked()
    assert woke == [3.75]  # the answer's moment; a 1 s poll would have said 4.0


async def test_wait_registered_returns_at_once_when_registered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    service = RegistrationService(endpoint="/x/dra.sock")
    service.record_status(True, "")
    await service.wait_registered(timeout=0)
    assert trio.current_time() == 0


async def test_a_later_rejection_makes_it_wait_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    service = RegistrationService(endpoint="/x/dra.sock")
    service.record_status(True, "")
    service.record_status(False, "plugin socket replaced")
    with pytest.raises(RegistrationError, match='last rejection was "plugin socket replaced"'):
        await service.wait_registered(timeout=2)
    assert trio.current_time() == 2


def test_the_answer_is_the_readiness_components_state() -> None:
    readiness = Readiness()
    flag = readiness.declare(READY_COMPONENT, WAITING_REASON)
    service = RegistrationService(endpoint="/x/dra.sock", ready=flag)
    assert readiness.reasons() == {READY_COMPONENT: "waiting for the kubelet"}
    service.record_status(False, "")
    assert readiness.reasons() == {READY_COMPONENT: "waiting for the kubelet"}
    service.record_status(False, "bad versions")
    assert readiness.components() == {READY_COMPONENT: False}
    assert readiness.reasons() == {READY_COMPONENT: "rejected by the kubelet: bad versions"}
    service.record_status(True, "")
    assert readiness.components() == {READY_COMPONENT: True}
    assert readiness.reasons() == {READY_COMPONENT: ""}
    service.record_status(False, "")  # deregistered without a new reason: the last one
    assert readiness.reasons() == {READY_COMPONENT: "rejected by the kubelet: bad versions"}


def test_a_service_without_a_supervisor_has_a_flag_of_its_own() -> None:
    service = RegistrationService(endpoint="/x/dra.sock")
    assert service.ready.name == READY_COMPONENT and not service.ready.ready
    assert service.ready.reason == WAITING_REASON


async def test_the_registration_service_says_why_every_interval_until_registered(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    service = RegistrationService(endpoint="/x/dra.sock", registrar_dir="/k/plugins_registry")
    async with trio.open_nursery() as nursery:
        await nursery.start(service.report_until_registered, 30.0)
        await trio.sleep(70)
        service.record_status(True, "")
        await trio.sleep(100)  # registered: nothing more to say
        nursery.cancel_scope.cancel()
    warnings = [r for r in caplog.records if r.getMessage() == "plugin not registered yet"]
    assert len(warnings) == 2  # at 30 s and 60 s
    err = getattr(warnings[0], "dracpu_kv", {}).get("err", "")
    assert err.startswith("kubelet never reported a registration status, check that it watches ")
