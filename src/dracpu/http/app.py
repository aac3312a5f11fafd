"""The daemon's HTTP endpoints as a pure request → response function (behavior.md §15).

``HTTPApp`` knows nothing about sockets: the Trio shell in ``server.py`` hands it a parsed
``Request`` and writes back the ``Response``. One app per listener: the main one
(``--bind-address``) serves ``/healthz``, ``/readyz`` and ``/metrics``; the debug one
(``--debug-address``, loopback by default) serves only ``/debug/state``
(``HTTPApp.debug_only``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, Protocol
from urllib.parse import parse_qs, urlsplit

import msgspec
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from dracpu.logs import get_logger

__all__ = ["DebugView", "HTTPApp", "ReadinessSource", "Request", "Response"]

log = get_logger(__name__)

TEXT_PLAIN: Final = "text/plain; charset=utf-8"
APPLICATION_JSON: Final = "application/json"
_GET_METHODS: Final = ("GET", "HEAD")


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """A request head (the endpoints take no bodies); header names are lower case."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...] = ()

    def header(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.headers:
            if key == name:
                return value
        return None


class Response(msgspec.Struct, frozen=True, kw_only=True):
    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: tuple[tuple[str, str], ...] = ()


def text_response(status: int, text: str, *, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(
        status=status,
        body=text.encode(),
        content_type=TEXT_PLAIN,
        headers=(("x-content-type-options", "nosniff"), *headers),
    )


Handler = Callable[[Request], Response]


class ReadinessSource(Protocol):
    """What ``/readyz`` reads: ``dracpu.nursery.ReadinessView`` (the daemon's one
    readiness source, read-only)."""

    def components(self) -> Mapping[str, bool]:
        """Component -> ready."""
        ...

    def reasons(self) -> Mapping[str, str]:
        """Component -> why it is not ready ("" or absent: no reason given)."""
        ...


class DebugView(Protocol):
    """What ``/debug/state`` reads: the daemon's read-only view (``daemon.views``)."""

    def debug_state(self) -> object:
        """Any value msgspec can encode as JSON (Structs, dicts, lists, strings, numbers)."""
        ...


class HTTPApp:
    """Routes for one listener. An endpoint exists only when what it serves was given:
    ``/metrics`` with ``registry``, ``/readyz`` with ``readiness``, ``/debug/state``
    with ``debug``; ``/healthz`` unless ``healthz=False``. Every route answers ``GET``
    and ``HEAD``.

    ``readiness`` and ``debug`` are read-only views, read once per request; the app
    never changes what it serves.
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        readiness: ReadinessSource | None = None,
        debug: DebugView | None = None,
        healthz: bool = True,
    ) -> None:
        self._registry = registry
        self._readiness = readiness
        self._debug = debug
        self._started = False
        self._routes: dict[str, Handler] = {}
        if healthz:
            self._routes["/healthz"] = self._healthz
        if readiness is not None:
            self._routes["/readyz"] = self._readyz
        if registry is not None:
            self._routes["/metrics"] = self._metrics
        if debug is not None:
            self._routes["/debug/state"] = self._debug_state
        if not self._routes:
            raise ValueError("an HTTPApp needs at least one endpoint")

    @classmethod
    def debug_only(cls, debug: DebugView) -> HTTPApp:
        """The app of the debug listener: ``/debug/state`` and nothing else."""
        return cls(debug=debug, healthz=False)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(self._routes)

    @property
    def started(self) -> bool:
        return self._started

    def mark_started(self) -> None:
        """The driver finished starting: ``/healthz`` answers 200 from now on."""
        self._started = True

    def handle(self, request: Request) -> Response:
        path = urlsplit(request.target).path
        handler = self._routes.get(path)
        if handler is None:
            return text_response(404, "404 page not found\n")
        if request.method not in _GET_METHODS:
            return text_response(
                405, "405 method not allowed\n", headers=(("allow", ", ".join(_GET_METHODS)),)
            )
        try:
            return handler(request)
        except Exception as exc:
            # A failing view is a bug elsewhere; the endpoint says so and keeps serving.
            log.error("HTTP endpoint failed", path=path, err=exc, stack=True)
            return text_response(500, f"500 internal server error: {path}: {exc}\n")

    # -- endpoints -----------------------------------------------------------------------

    def _healthz(self, request: Request) -> Response:
        return Response(status=200 if self._started else 503)

    def _readyz(self, request: Request) -> Response:
        assert self._readiness is not None
        components = dict(self._readiness.components())
        reasons = dict(self._readiness.reasons())
        ready = all(components.values())
        query = parse_qs(urlsplit(request.target).query, keep_blank_values=True)
        if ready and "verbose" not in query:
            return text_response(200, "ok")
        lines = []
        for name in sorted(components):
            if components[name]:
                lines.append(f"[+] {name} ok")
            else:
                lines.append(f"[-] {name}: {reasons.get(name) or 'not ready'}")
        lines.append("readyz check passed" if ready else "readyz check failed")
        return text_response(200 if ready else 503, "\n".join(lines) + "\n")

    def _metrics(self, request: Request) -> Response:
        assert self._registry is not None
        encoder, content_type = choose_encoder(request.header("accept") or "")
        return Response(status=200, body=encoder(self._registry), content_type=content_type)

    def _debug_state(self, request: Request) -> Response:
        assert self._debug is not None
        state = self._debug.debug_state()
        try:
            body = msgspec.json.format(msgspec.json.encode(state), indent=2) + b"\n"
        except (TypeError, msgspec.EncodeError) as exc:
            message = f"500 internal server error: cannot encode debug state: {exc}\n"
            return text_response(500, message)
        return Response(status=200, body=body, content_type=APPLICATION_JSON)
