"""One HTTP/1.1 server connection without I/O: bytes in, response bytes out (h11 framing).

``ServerConnection.receive_data`` takes what the socket read (``b""`` at EOF);
``step()`` parses as far as it can and returns a ``Step``: bytes to send, whether to close
afterwards, whether more input is needed. ``phase`` tells the shell which timeout applies
(``idle`` between requests, ``head`` while the request line and headers arrive, ``body``
while a body arrives), and ``timed_out()`` gives the answer when one expires.

Limits: the request line and headers together ≤ ``max_header_bytes`` (431 beyond);
``GET``/``HEAD`` with a body are refused (400); other bodies are read and discarded up to
``max_body_bytes`` (413 beyond) so that the 404/405 answer keeps the connection usable.
One ``step()`` handles at most ``MAX_BODY_EVENTS_PER_STEP`` pieces of body and then says
``more``: a chunked body of 1-byte chunks is ~10,000 h11 events per 64 KiB read (~100 ms
of parsing), and the shell lets other connections run between steps.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Final, Literal

import h11
import msgspec

from dracpu.http.app import HTTPApp, Request, Response, text_response

__all__ = ["HTTPLimits", "Phase", "ServerConnection", "Step"]

Phase = Literal["idle", "head", "body", "closed"]
SERVER_HEADER: Final = ("server", "dracpu")
# RFC 9110 renamed 413; Python < 3.13 still has the old phrase.
_PHRASES: Final = {413: "Content Too Large"}


def reason_phrase(status: int) -> str:
    return _PHRASES.get(status) or HTTPStatus(status).phrase


class HTTPLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Sizes and timeouts (seconds) of behavior.md §15 (Go http.Server fields)."""

    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 1024 * 1024
    read_header_timeout: float = 5.0
    read_timeout: float = 10.0
    write_timeout: float = 10.0
    idle_timeout: float = 120.0


# Body pieces (h11 Data events) parsed per step(); ~10 µs each.
MAX_BODY_EVENTS_PER_STEP = 256


class Step(msgspec.Struct, frozen=True):
    data: bytes = b""
    close: bool = False
    need_data: bool = False
    more: bool = False  # input is left: call step() again, after letting others run


class ServerConnection:
    def __init__(self, app: HTTPApp, limits: HTTPLimits | None = None) -> None:
        self.app = app
        self.limits = limits or HTTPLimits()
        self._conn = h11.Connection(
            h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes
        )
        self._head: h11.Request | None = None
        self._method = ""
        self._body_bytes = 0
        self._closed = False
        self.closing = False
        self.requests_served = 0

    @property
    def phase(self) -> Phase:
        if self._closed:
            return "closed"
        if self._conn.their_state is h11.SEND_BODY:
            return "body"
        if self._conn.their_state is h11.IDLE and not self._conn.trailing_data[0]:
            return "idle"
        return "head"

    def receive_data(self, data: bytes) -> None:
        if self._closed:
            return
        try:
            self._conn.receive_data(data)
        except RuntimeError:
            # Data after EOF or while the peer must close: nothing more will be parsed.
            self._closed = True

    def start_closing(self) -> None:
        """Graceful shutdown: answer what is in flight with ``connection: close``."""
        self.closing = True

    def step(self) -> Step:
        if self._closed:
            return Step(close=True)
        if self._conn.our_state is h11.DONE and self._conn.their_state is h11.DONE:
            self._conn.start_next_cycle()
        try:
            return self._step()
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            if status == 431:
                detail = f"request line and headers exceed {self.limits.max_header_bytes} bytes"
            else:
                detail = f"malformed request: {exc}"
            return self._error(status, detail)

    def timed_out(self) -> Step:
        """The shell's timeout for the current phase expired."""
        phase = self.phase
        if phase == "idle" or phase == "closed":
            self._closed = True
            return Step(close=True)
        what = "request headers" if phase == "head" else "request body"
        return self._error(408, f"timed out reading the {what}")

    def _step(self) -> Step:
        body_events = 0
        while True:
            if body_events >= MAX_BODY_EVENTS_PER_STEP:
                return Step(more=True)
            event = self._conn.next_event()
            if event is h11.NEED_DATA:
                if self._conn.their_state is h11.IDLE and self._conn.trailing_data[1]:
                    self._closed = True  # EOF between requests
                    return Step(close=True)
                return Step(need_data=True)
            if event is h11.PAUSED:
                return Step(need_data=True)  # cannot happen: we always finish a cycle
            if isinstance(event, h11.ConnectionClosed):
                self._closed = True
                return Step(close=True)
            if isinstance(event, h11.Request):
                refused = self._check_head(event)
                if refused is not None:
                    return refused
                self._head = event
                self._body_bytes = 0
            elif isinstance(event, h11.Data):
                body_events += 1
                self._body_bytes += len(event.data)
                if self._body_bytes > self.limits.max_body_bytes:
                    return self._error(
                        413, f"request body exceeds {self.limits.max_body_bytes} bytes"
                    )
            elif isinstance(event, h11.EndOfMessage):
                head, self._head = self._head, None
                assert head is not None
                return self._respond(head)

    def _check_head(self, head: h11.Request) -> Step | None:
        method = self._method = head.method.decode("ascii", "replace")
        # h11 enforces the limit only on a head that is still incomplete in its buffer; a
        # whole one that arrived in one read is measured here (as re-serialised).
        size = len(head.method) + len(head.target) + len(b"  HTTP/1.1\r\n\r\n")
        size += sum(len(name) + len(value) + 4 for name, value in head.headers.raw_items())
        if size > self.limits.max_header_bytes:
            return self._error(
                431, f"request line and headers exceed {self.limits.max_header_bytes} bytes"
            )
        length: int | None = None
        chunked = False
        for name, value in head.headers:
            if name == b"content-length":
                length = int(value)  # h11 validated it
            elif name == b"transfer-encoding":
                chunked = True
        has_body = chunked or (length is not None and length > 0)
        if has_body and method in ("GET", "HEAD"):
            return self._error(400, f"{method} requests must not have a body")
        if length is not None and length > self.limits.max_body_bytes:
            return self._error(413, f"request body exceeds {self.limits.max_body_bytes} bytes")
        return None

    def _respond(self, head: h11.Request) -> Step:
        request = Request(
            method=head.method.decode("ascii", "replace"),
            target=head.target.decode("latin-1"),
            headers=tuple(
                (name.decode("latin-1"), value.decode("latin-1")) for name, value in head.headers
            ),
        )
        response = self.app.handle(request)
        data = self._send(response, head_only=request.method == "HEAD")
        self.requests_served += 1
        close = self._conn.our_state is h11.MUST_CLOSE
        if close:
            self._closed = True
        return Step(data=data, close=close)

    def _send(self, response: Response, *, head_only: bool = False, close: bool = False) -> bytes:
        headers = [SERVER_HEADER]
        if response.content_type is not None:
            headers.append(("content-type", response.content_type))
        headers.extend(response.headers)
        headers.append(("content-length", str(len(response.body))))
        if close or self.closing:
            headers.append(("connection", "close"))
        out = (
            self._conn.send(
                h11.Response(
                    status_code=response.status,
                    headers=headers,
                    reason=reason_phrase(response.status).encode(),
                )
            )
            or b""
        )
        if response.body and not head_only:
            out += self._conn.send(h11.Data(data=response.body)) or b""
        out += self._conn.send(h11.EndOfMessage()) or b""
        return out

    def _error(self, status: int, detail: str) -> Step:
        """Answer ``status`` if a response can still be sent, then close."""
        self._closed = True
        response = text_response(status, f"{status} {reason_phrase(status)}: {detail}\n")
        state = self._conn.our_state
        if state not in (h11.IDLE, h11.SEND_RESPONSE):
            return Step(close=True)
        head_only = state is h11.SEND_RESPONSE and self._method == "HEAD"
        try:
            return Step(data=self._send(response, head_only=head_only, close=True), close=True)
        except h11.LocalProtocolError:
            return Step(close=True)
