"""One Kubernetes watch request, read in a worker thread and delivered to Trio.

The official client's generated ``list_*`` method is called with ``watch=True`` and
``_preload_content=False``; a worker thread reads the chunked stream line by line and
hands each event to a callback that runs in the Trio thread. Cancelling the Trio side
shuts the socket down, so the thread leaves its blocking read at once instead of
lingering until the server's ``timeoutSeconds``. Every failure leaves as a ``K8sError``;
an expired ``resourceVersion`` (HTTP 410 or an ``ERROR`` event with code 410) is ``Gone``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec
import trio
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from dracpu.k8s.client import Gone, K8sError, KubeClient, translate_error

__all__ = ["WatchEvent", "WatchStream", "watch_once"]


class _Meta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    resourceVersion: str = ""


class _Object(msgspec.Struct):
    # One shape for both: an object (metadata) and the Status of an ERROR event.
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    kind: str = ""
    code: int = 0
    reason: str = ""
    message: str = ""


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


_event_decoder = msgspec.json.Decoder(_Event)
_object_decoder = msgspec.json.Decoder(_Object)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """``type`` is ADDED, MODIFIED, DELETED or BOOKMARK; ``object`` is the raw JSON of the
    object, for callers that decode it into their own types."""

    type: str
    name: str
    namespace: str
    resource_version: str
    object: bytes


class WatchStream:
    """Shared by the Trio task and the worker thread of one watch request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._response: Any = None
        self._finished = False
        self.cancelled = False
        self.attached = False  # the server answered 200: the stream was open at some point
        self.exited = threading.Event()  # set when the worker thread is done

    @property
    def streaming(self) -> bool:
        """The stream is open now: answered, and neither ended nor cancelled."""
        with self._lock:
            return self._response is not None and not self._finished and not self.cancelled

    def attach(self, response: Any) -> bool:
        """Called by the thread once headers are in; False when already cancelled."""
        with self._lock:
            if self.cancelled:
                _close(response)
                return False
            self._response = response
            self.attached = True
            return True

    def finish(self, *, clean: bool) -> None:
        """Called by the thread when it stops reading: a cleanly ended stream gives its
        connection back to the pool, anything else closes it."""
        with self._lock:
            self._finished = True
            response, self._response = self._response, None
        if response is not None:
            if clean:
                response.release_conn()
            else:
                _close(response)

    def cancel(self) -> None:
        """From Trio: make a blocked read return now. The socket is shut down, not
        closed, under the lock: the thread still owns the connection and closes it."""
        with self._lock:
            self.cancelled = True
            if self._finished or self._response is None:
                return
            try:
                self._response.shutdown()
            except (ValueError, RuntimeError, OSError):
                _close(self._response)


def _close(response: Any) -> None:
    with contextlib.suppress(Exception):
        response.close()


def _lines(response: Any) -> Iterator[bytes]:
    pending = b""
    for chunk in response.stream(65536, decode_content=True):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield line
    if pending.strip():
        yield pending


def _decode(line: bytes, what: str) -> WatchEvent:
    try:
        event = _event_decoder.decode(line)
        obj = _object_decoder.decode(event.object)
    except msgspec.DecodeError as exc:
        raise K8sError(f"watch {what}: bad event: {exc}") from exc
    if event.type == "ERROR":
        message = obj.message or f"watch error, code {obj.code}"
        if obj.code == 410:
            raise Gone(message, status=410, reason=obj.reason)
        raise K8sError(f"watch {what}: {message}", status=obj.code or None, reason=obj.reason)
    if event.type not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
        raise K8sError(f"watch {what}: unknown event type {event.type!r}")
    meta = obj.metadata
    return WatchEvent(
        event.type, meta.name, meta.namespace, meta.resourceVersion, bytes(event.object)
    )


async def watch_once(
    kube: KubeClient,
    list_fn: Callable[..., Any],
    /,
    *args: Any,
    on_event: Callable[[WatchEvent], None],
    resource_version: str | None,
    timeout_seconds: int | None,
    allow_bookmarks: bool = True,
    limiter: trio.CapacityLimiter | None = None,
    stream: WatchStream | None = None,
    what: str = "",
    idle_timeout: float | None = None,
    **params: Any,
) -> int:
    """Run one watch request until the server ends it; the number of events delivered.

    ``on_event`` runs in the Trio thread, one event at a time, in order. ``params`` go
    to ``list_fn`` (``field_selector=...``). The client-side read timeout is a little
    longer than ``timeout_seconds``, so a silently dead connection also ends; with
    ``idle_timeout`` it is at most that many seconds without a byte, for a caller that
    asks for bookmarks and counts on the server sending one about every minute.
    """
    handle = stream or WatchStream()
    label = what or getattr(list_fn, "__name__", "watch")
    kwargs = _request_params(
        params,
        resource_version=resource_version,
        timeout_seconds=timeout_seconds,
        allow_bookmarks=allow_bookmarks,
        idle_timeout=idle_timeout,
        connect_timeout=kube.request_timeout,
    )
    read = partial(_read_events, handle, label, on_event, list_fn, args, kwargs)
    try:
        return await trio.to_thread.run_sync(
            read, limiter=limiter or trio.CapacityLimiter(1), abandon_on_cancel=True
        )
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
        raise translate_error(exc) from exc
    except K8sError:
        raise
    except Exception as exc:
        # Anything else from the client (e.g. its argument validation) is still a failed
        # watch to the caller, who backs off and keeps its resync going.
        raise K8sError(f"watch {label}: {type(exc).__name__}: {exc}") from exc
    finally:
        # Normal end: nothing to do (finish() ran). Cancelled: unblock the thread.
        handle.cancel()


def _request_params(
    params: Mapping[str, Any],
    *,
    resource_version: str | None,
    timeout_seconds: int | None,
    allow_bookmarks: bool,
    idle_timeout: float | None,
    connect_timeout: float,
) -> dict[str, Any]:
    """The keyword arguments of the ``list_fn`` call that opens the watch."""
    kwargs: dict[str, Any] = dict(params)
    kwargs.update(watch=True, allow_watch_bookmarks=allow_bookmarks, _preload_content=False)
    if resource_version:
        kwargs["resource_version"] = resource_version
    # The client insists on a number; a day stands for "no read timeout".
    read_timeout = 86400.0
    if timeout_seconds is not None:
        kwargs["timeout_seconds"] = timeout_seconds
        read_timeout = timeout_seconds + 30.0
    if idle_timeout is not None:
        read_timeout = min(read_timeout, idle_timeout)
    kwargs["_request_timeout"] = (connect_timeout, read_timeout)
    return kwargs


def _read_events(
    handle: WatchStream,
    label: str,
    on_event: Callable[[WatchEvent], None],
    list_fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> int:
    """The worker thread: open the stream, decode it line by line and hand each event to
    the Trio thread; the number delivered."""
    clean = False
    try:
        response = list_fn(*args, **kwargs)
        if not handle.attach(response):
            return 0
        count = 0
        for line in _lines(response):
            event = _decode(line, label)
            if not trio.from_thread.run_sync(_deliver, handle, on_event, event):
                return count
            count += 1
        clean = True
        return count
    finally:
        handle.finish(clean=clean)
        handle.exited.set()


def _deliver(
    handle: WatchStream, on_event: Callable[[WatchEvent], None], event: WatchEvent
) -> bool:
    """In the Trio thread: one event to the caller, unless the watch was abandoned."""
    if handle.cancelled:  # an abandoned watch: drop what is still in flight
        return False
    on_event(event)
    return True
