"""The root supervisor: starts the daemon's services in order, restarts the ones that crash,
holds the readiness source, and shuts everything down on SIGTERM/SIGINT or a fatal error.

Every service is a child task of one root nursery (``open``; ``run_until_signal`` opens
it) and runs in a cancel scope of its own:

- ``await supervisor.start(service)`` returns once the service called
  ``task_status.started()`` (with that value), so the caller writes the start order as
  plain sequential code. A service that crashes before it started is restarted with
  backoff and ``start`` keeps waiting; one that fails for good raises ``ServiceFailed``.
- A crash after that is logged with the exception and the service alone is restarted
  after ``restart_delay``; the others never notice. A ``ServiceBlocked`` (a port another
  process holds) is not a crash: it is one line per attempt, without a traceback.
- A service's scope is shielded from cancellation from outside: only ``stop()`` cancels
  it, so however the root is left (a signal, a fatal error, the caller cancelled), the
  services stop in reverse start order, each given its grace period to finish its cleanup
  (remove sockets, answer in-flight RPCs, usually in bounded shielded sections).
- Nothing a service does may keep cancellation from reaching it for longer than that:
  blocking calls that can hang run in worker threads with ``abandon_on_cancel=True``
  where leaving the thread behind is safe, and commit sections that must finish are
  shielded with a bound. A service that is still running after its grace period anyway
  is a bug; it is named in ``abandoned`` and logged, the others are still stopped, and
  ``run_daemon`` ends the process (``os._exit``) instead of waiting for it, so the pod's
  termination grace is kept.

Readiness (``readiness``) is the daemon's one source: services set their component
through a ``ReadyFlag``, and a crashed service's component is marked down until it sets it
again.
"""

from __future__ import annotations

import logging
import os
import random
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from dracpu.gofmt import go_quote
from dracpu.logs import get_logger
from dracpu.nursery.backoff import restart_delay
from dracpu.nursery.readiness import Readiness
from dracpu.nursery.service import (
    Service,
    ServiceBlocked,
    ServiceFailed,
    ServiceState,
    ServiceStatus,
    SupervisorStopping,
)

# Service and its companions live in dracpu.nursery.service; Service is also exported
# here for the importers that take it with the Supervisor.
__all__ = ["DEFAULT_GRACE_PERIOD", "Service", "Supervisor", "describe_error", "run_daemon"]

log = get_logger(__name__)

DEFAULT_GRACE_PERIOD: Final = 5.0
DEFAULT_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)

SignalReceiver = Callable[..., AbstractContextManager[AsyncIterator[int]]]


def describe_error(exc: BaseException) -> str:
    """``Type: message`` for one exception; the leaves, joined by ``; ``, for a group."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe_error(leaf) for leaf in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_blocked(exc: BaseException) -> bool:
    """A ``ServiceBlocked``, or a group of nothing else: its message is the whole story."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_blocked(leaf) for leaf in exc.exceptions)
    return isinstance(exc, ServiceBlocked)


def _blocked_message(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_blocked_message(leaf) for leaf in exc.exceptions)
    return str(exc)


def _has_cancelled(exc: BaseException) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(trio.Cancelled) is not None
    return False


@dataclass(eq=False)
class _Entry:
    service: Service
    state: ServiceState = "starting"
    restarts: int = 0
    failures_in_row: int = 0
    last_error: str = ""
    start_value: object = None
    started: bool = False
    start_error: str | None = None
    # Shielded: only stop() cancels a service, whatever happens to the scopes around
    # the root nursery, so the stop order and grace periods always hold.
    scope: trio.CancelScope = field(default_factory=lambda: trio.CancelScope(shield=True))
    first_outcome: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)

    def status(self) -> ServiceStatus:
        return ServiceStatus(
            name=self.service.name,
            state=self.state,
            critical=self.service.critical,
            restarts=self.restarts,
            last_error=self.last_error,
        )


class _TaskStatus:
    """The ``task_status`` handed to one run of a service."""

    def __init__(self, entry: _Entry) -> None:
        self._entry = entry
        self.called = False

    def started(self, value: object = None) -> None:
        if self.called:
            raise RuntimeError(f"service {go_quote(self._entry.service.name)} called started twice")
        self.called = True
        entry = self._entry
        entry.state = "running"
        entry.start_value = value
        entry.started = True
        entry.first_outcome.set()
        log.info("service started", v=2, service=entry.service.name, restarts=entry.restarts)


class Supervisor:
    """The daemon's root: the services' nursery, restart policy, readiness and signals.

    ``rand`` (values in ``[0, 1)``) drives the backoff jitter, so tests can seed it; time
    comes from Trio's clock, so ``MockClock`` drives every delay. ``readiness`` is the
    daemon's readiness source (a fresh one unless given).
    """

    def __init__(
        self,
        *,
        rand: Callable[[], float] | None = None,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        readiness: Readiness | None = None,
    ) -> None:
        if not grace_period >= 0:
            raise ValueError(f"grace_period must be >= 0, got {grace_period}")
        self.grace_period = grace_period
        self.readiness = readiness if readiness is not None else Readiness()
        self._rand = rand or random.Random().random
        self._entries: dict[str, _Entry] = {}
        self._nursery: trio.Nursery | None = None
        self._stop_requested = trio.Event()
        self._stopping = False
        self._hurry = False
        self._current_wait: trio.CancelScope | None = None
        self.stop_reason = ""
        self.fatal_error: str | None = None
        self.abandoned: list[str] = []
        # Set when stop() is over with services in ``abandoned`` still running.
        self.left_running = trio.Event()
        self.startup_complete = trio.Event()
        self.signal_received: int | None = None

    # -- the root nursery ----------------------------------------------------------------

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Supervisor]:
        """The root nursery: services ``start``ed inside the block are its children.
        Leaving the block (normally, by an error, or cancelled) ``stop``s them all, in
        reverse start order, then waits for them, as a nursery does."""
        if self._nursery is not None:
            raise RuntimeError("the supervisor's root nursery is already open")
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                yield self
            finally:
                with trio.CancelScope(shield=True):
                    await self.stop()
                # What else runs in the root (the signal watcher, a start-up still
                # waiting) ends here; the services' own scopes were cancelled above.
                nursery.cancel_scope.cancel()

    # -- services ------------------------------------------------------------------------

    async def start(self, service: Service) -> Any:
        """Start ``service`` in the root nursery and wait until it called
        ``task_status.started(value)``; return that value. Raises ``ServiceFailed`` if it
        failed for good first."""
        if self._stopping:
            raise SupervisorStopping(
                f"cannot start service {go_quote(service.name)}: the supervisor is stopping"
            )
        if self._nursery is None:
            raise RuntimeError(
                f"cannot start service {go_quote(service.name)}: the supervisor's root "
                "nursery is not open (run_until_signal or `async with supervisor.open()`)"
            )
        if service.name in self._entries:
            raise ValueError(f"service {go_quote(service.name)} is already supervised")
        entry = _Entry(service)
        self._entries[service.name] = entry
        log.info("starting service", v=2, service=service.name)
        self._nursery.start_soon(self._host, entry, name=f"dracpu.service.{service.name}")
        await entry.first_outcome.wait()
        if entry.state == "failed" and entry.start_error is not None:
            raise ServiceFailed(service.name, entry.start_error)
        if not entry.started and entry.scope.cancel_called:
            raise SupervisorStopping(
                f"service {go_quote(service.name)} was stopped before it started"
            )
        return entry.start_value

    def status(self) -> dict[str, ServiceStatus]:
        """Every service's state, in start order."""
        return {name: entry.status() for name, entry in self._entries.items()}

    async def _host(self, entry: _Entry) -> None:
        """One service's task in the root nursery. Never raises: a service's error is its
        own (logged, restarted or given up), and must not cancel its siblings."""
        try:
            with entry.scope:
                await self._supervise(entry)
        except BaseException as exc:
            if _has_cancelled(exc):
                raise  # not ours (the scope is shielded); the nursery's to handle
            # Raised while stopping: nothing to restart, but it is worth a line.
            entry.last_error = describe_error(exc)
            log.error("service failed while stopping", service=entry.service.name, err=exc)
        finally:
            if entry.state != "failed":
                entry.state = "stopped"
            entry.first_outcome.set()
            entry.done.set()

    async def _supervise(self, entry: _Entry) -> None:
        service = entry.service
        while True:
            entry.state = "starting"
            task_status = _TaskStatus(entry)
            began = trio.current_time()
            try:
                await service.run(task_status=task_status)
            except BaseException as exc:
                if _has_cancelled(exc) or entry.scope.cancel_called:
                    raise
                if task_status.called and trio.current_time() - began >= service.stable_after:
                    entry.failures_in_row = 0
                entry.failures_in_row += 1
                entry.last_error = describe_error(exc)
                # Its own component (same name), if it has one, is not ready until the
                # restarted service says so again.
                self.readiness.mark_down(
                    service.name, f"restarting after crash: {entry.last_error}"
                )
                if not self._may_restart(entry):
                    self._give_up(entry, exc, started=task_status.called)
                    return
                delay = restart_delay(
                    entry.failures_in_row,
                    initial=service.backoff_initial,
                    factor=service.backoff_factor,
                    cap=service.backoff_cap,
                    jitter=service.backoff_jitter,
                    rand=self._rand,
                )
                if _is_blocked(exc):
                    # Not a bug, and the same every time until the operator acts: one
                    # line per attempt, no traceback.
                    log.error(
                        "service cannot run; retrying",
                        service=service.name,
                        err=_blocked_message(exc),
                        retryIn=f"{delay:.3f}s",
                        attempts=entry.failures_in_row,
                    )
                else:
                    log.error(
                        "service crashed; restarting",
                        service=service.name,
                        err=exc,
                        stack=True,
                        restartIn=f"{delay:.3f}s",
                        restarts=entry.restarts,
                    )
                entry.state = "backoff"
                await trio.sleep(delay)
                entry.restarts += 1
                continue
            entry.state = "stopped"
            log.info("service finished", v=2, service=service.name)
            return

    def _may_restart(self, entry: _Entry) -> bool:
        service = entry.service
        if not service.restart:
            return False
        return service.max_restarts is None or entry.failures_in_row <= service.max_restarts

    def _give_up(self, entry: _Entry, exc: BaseException, *, started: bool) -> None:
        service = entry.service
        entry.state = "failed"
        if not started:
            entry.start_error = entry.last_error
        if service.restart:
            error = (
                f"service {go_quote(service.name)} failed {entry.failures_in_row} times in a "
                f"row: {entry.last_error}"
            )
        else:
            error = f"service {go_quote(service.name)} failed: {entry.last_error}"
        log.error(
            "service failed; not restarting",
            service=service.name,
            err=exc,
            stack=not _is_blocked(exc),
        )
        if service.critical:
            self.fail(error)

    # -- stopping ------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Ask ``run_until_signal`` to shut everything down (exit code 0 unless ``fail``)."""
        if not self._stop_requested.is_set():
            self.stop_reason = reason
            self._stop_requested.set()

    def fail(self, error: str) -> None:
        """A fatal error: shut everything down; ``run_until_signal`` returns 1."""
        if self.fatal_error is None:
            self.fatal_error = error
            log.error("fatal error; stopping", err=error)
        self.request_stop(error)

    async def stop(self) -> None:
        """Cancel every service, last started first, each given its grace period. Run it
        shielded if the caller may be cancelled. Safe to call again."""
        self._stopping = True
        for entry in reversed(list(self._entries.values())):
            name = entry.service.name
            if entry.done.is_set() or name in self.abandoned:
                continue
            entry.scope.cancel()
            grace = entry.service.grace_period
            grace = self.grace_period if grace is None else grace
            with trio.move_on_after(0 if self._hurry else grace) as waited:
                self._current_wait = waited
                await entry.done.wait()
            self._current_wait = None
            if not entry.done.is_set():
                self.abandoned.append(name)
                entry.state = "failed"
                entry.last_error = f"did not stop within {grace:g}s; abandoned"
                log.error("service did not stop; abandoning it", service=name, grace=grace)
            else:
                log.info("service stopped", v=2, service=name)
        if self.abandoned:
            self.left_running.set()

    def _hurry_stop(self) -> None:
        self._hurry = True
        if self._current_wait is not None:
            self._current_wait.cancel()

    @property
    def exit_code(self) -> int:
        """1 after a fatal error, else 0."""
        return 0 if self.fatal_error is None else 1

    # -- the daemon's main loop ----------------------------------------------------------

    async def run_until_signal(
        self,
        startup: Callable[[Supervisor], Awaitable[object]],
        *,
        signals: tuple[int, ...] = DEFAULT_SIGNALS,
        signal_receiver: SignalReceiver = trio.open_signal_receiver,
    ) -> int:
        """Open the root nursery, run ``startup(self)`` in it (which ``start``s the
        services in order), then serve until a signal (exit code 0), a fatal error (1) or
        ``request_stop``; then ``stop``.

        A second signal while stopping stops waiting for the remaining services.
        ``signal_receiver`` is ``trio.open_signal_receiver`` or a test double with its
        shape.
        """
        startup_scope = trio.CancelScope()
        with signal_receiver(*signals) as received:
            async with self.open() as root:
                assert root._nursery is not None
                root._nursery.start_soon(self._watch_signals, received)
                root._nursery.start_soon(self._run_startup, startup, startup_scope)
                try:
                    await self._stop_requested.wait()
                finally:
                    startup_scope.cancel()
        if self.fatal_error is not None:
            log.error("failed to run", err=self.fatal_error)
        return self.exit_code

    async def _run_startup(
        self, startup: Callable[[Supervisor], Awaitable[object]], scope: trio.CancelScope
    ) -> None:
        try:
            with scope:
                await startup(self)
        except Exception as exc:  # groups from nurseries in startup included
            self.fail(describe_error(exc))
            return
        if not scope.cancelled_caught:
            self.startup_complete.set()
            log.info("all services started", services=len(self._entries))

    async def _watch_signals(self, received: AsyncIterator[int]) -> None:
        async for signum in received:
            name = _signal_name(signum)
            if self.signal_received is None:
                self.signal_received = signum
                log.info("exiting", reason="received signal", signal=name)
                self.request_stop(f"received signal {name}")
            else:
                log.warning("second signal while stopping; not waiting any longer", signal=name)
                self._hurry_stop()


async def run_daemon(
    startup: Callable[[Supervisor], Awaitable[object]],
    *,
    supervisor: Supervisor | None = None,
    exit_process: Callable[[int], object] = os._exit,
    signal_receiver: SignalReceiver = trio.open_signal_receiver,
) -> int:
    """The daemon's async main: ``run_until_signal``. When stopping left a service
    running past its grace period (a bug: something kept cancellation out), flush the logs
    and leave the process with ``exit_process(code)`` at that moment: the root nursery
    would otherwise wait for that task for ever."""
    sup = supervisor or Supervisor()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_exit_when_left_running, sup, exit_process)
        code = await sup.run_until_signal(startup, signal_receiver=signal_receiver)
        nursery.cancel_scope.cancel()
    return code


async def _exit_when_left_running(sup: Supervisor, exit_process: Callable[[int], object]) -> None:
    await sup.left_running.wait()
    if sup.fatal_error is not None:
        log.error("failed to run", err=sup.fatal_error)
    log.error("exiting with services still running", services=",".join(sup.abandoned))
    for handler in logging.getLogger().handlers:
        handler.flush()
    exit_process(sup.exit_code)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
