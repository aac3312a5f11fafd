"""GETs to the API server on the Trio thread over Trio streams, no worker thread.

A GET through the ``kubernetes`` client runs urllib3 in a worker thread. On a node drain
(64 claims prepared at once, each reading its claim) that thread hop and the interpreter
lock it takes back after every system call of urllib3 cost more CPU than the request
itself: measured with bench/grpc.py's real path, about 0.9 ms of the daemon's CPU per
claim read, most of it futex waits and context switches. ``LoopGetter`` sends the same
request from the event loop.

Answers are parsed by httptools (llhttp, the HTTP/1.1 parser of Node.js, in C): about
2 us per claim read where h11's pure-Python state machine took about 50 us, on the path
every prepare takes. The request is one GET line and four header lines, written here;
a field that could not go on the wire (a line break, a non-ASCII byte) is refused
before anything is sent.

It takes every connection fact from the client's ``kubernetes.client.Configuration``, as
the client's ``RESTClientObject`` hands them to urllib3 (kubernetes/client/rest.py):
the server URL (with any path prefix), ``verify_ssl``, the CA (``ssl_ca_cert`` or
``ca_cert_data``), the client certificate and key, ``tls_server_name`` (SNI and the name
checked) and ``assert_hostname=False``, ``socket_options``, and the bearer token from
``auth_settings()`` with its refresh hook (the in-cluster loader re-reads the service
account token every minute that way). ``supports`` says which configurations it cannot
serve (a proxy, a hostname to assert other than the server's), and the caller keeps the
kubernetes client for those.

Behaviour kept from the thread path (``KubeClient.get_raw``): kept-alive connections
(at most as many idle as urllib3's pool keeps), a failed connect or a connection that
drops before its answer retried at once as ``transport_retry`` does for idempotent
requests, no retry on any HTTP answer, one timeout for the whole request, and every
failure a ``K8sError`` (see ``status_error``).
"""

from __future__ import annotations

import contextlib
import math
import ssl
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httptools
import trio
from kubernetes import client as k8s_client
from urllib3.util.retry import Retry

from dracpu.k8s.errors import (
    ConnectionFailed,
    K8sError,
    error_for_status,
    status_fields,
)

__all__ = ["LoopGetter"]

# How long a token from a refresh hook is reused. The hooks re-read a file or run a
# credential plugin, so they run in a worker thread, at most this often; the in-cluster
# hook itself re-reads the token only once a minute.
TOKEN_REUSE = 1.0
_READ_SIZE = 65536
# The largest header section read (h11, used before, stopped at 16 KiB; the API server's
# are well under 1 KiB, but admission warnings can make them longer).
MAX_HEADER_BYTES = 65536
_DEFAULT_POOL = 10  # urllib3's PoolManager default when the configuration names none


class _Dropped(Exception):
    """A kept-alive connection ended before any byte of the answer: safe to resend."""


class _Connection:
    __slots__ = ("stream",)

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream

    def close_now(self) -> None:
        """Close the socket without awaiting (TLS close_notify is not sent; the API
        server, like any HTTPS server, does not wait for it)."""
        stream = self.stream
        while isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        if isinstance(stream, trio.SocketStream):
            # Outside a Trio run the socket's own finaliser closes it.
            with contextlib.suppress(RuntimeError):
                stream.socket.close()


class _Answer:
    """One answer as httptools reports it while parsing (the ``on_*`` callbacks).

    1xx answers are passed over: the final one follows on the same connection. Bytes
    after the final answer mean the connection is not reused; a header section larger
    than ``MAX_HEADER_BYTES`` is refused (llhttp sets no limit of its own)."""

    __slots__ = (
        "body",
        "complete",
        "extra",
        "head_bytes",
        "headers",
        "headers_done",
        "keep_alive",
        "parser",
        "reason",
        "started",
    )

    def __init__(self) -> None:
        self.parser: httptools.HttpResponseParser | None = None
        self.reason = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.started = False  # a status line began
        self.headers_done = False
        self.head_bytes = 0  # bytes read before the final answer's headers ended
        self.complete = False
        self.keep_alive = False
        self.extra = False

    def on_message_begin(self) -> None:
        if self.complete:
            self.extra = True
        self.started = True

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.headers_done:  # llhttp reports a chunked body's trailers here too
            self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.parser is not None
        if 100 <= self.parser.get_status_code() <= 199:
            # An informational answer (no body): the final one comes next.
            self.reason, self.headers, self.headers_done = b"", {}, False
            return
        self.complete = True
        # Asked here: llhttp resets the message's flags once this callback returns.
        self.keep_alive = self.parser.should_keep_alive()

    def count(self, read: int) -> None:
        """Called after each read that did not end the header section."""
        if not self.headers_done:
            self.head_bytes += read
            if self.head_bytes > MAX_HEADER_BYTES:
                raise OSError(
                    f"bad HTTP answer: header section larger than {MAX_HEADER_BYTES} bytes"
                )

    def close_delimited(self) -> bool:
        """Whether the body runs to the end of the connection (neither a length nor
        chunks), so the connection's end completes it."""
        if not self.headers_done or self.complete:
            return False
        encoding = self.headers.get(b"transfer-encoding", b"").lower()
        return b"content-length" not in self.headers and b"chunked" not in encoding


def _field_ok(value: str) -> bool:
    return not any(c in value for c in "\r\n\0")


def _retry_count(retries: Any) -> int:
    """Resends allowed after a failed connect or a drop, from urllib3's setting."""
    if isinstance(retries, Retry):
        total = retries.total
        return 3 if total is None or total is True else max(0, int(total))
    if retries is None:
        return Retry.DEFAULT.total if isinstance(Retry.DEFAULT.total, int) else 3
    if isinstance(retries, bool):
        return 3 if retries else 0
    return max(0, int(retries))


class LoopGetter:
    """GET requests from the Trio thread for one ``Configuration``. Constructing it does
    no I/O (the TLS context reads the CA and client key files when first needed)."""

    def __init__(self, configuration: k8s_client.Configuration, *, user_agent: str = "") -> None:
        problem = self.unsupported(configuration)
        if problem:
            raise ValueError(f"cannot GET on the event loop: {problem}")
        self.configuration = configuration
        url = urlsplit(str(configuration.host))
        self._https = url.scheme == "https"
        self._host = url.hostname or ""
        self._port = url.port or (443 if self._https else 80)
        self._prefix = url.path.rstrip("/")
        default_port = 443 if self._https else 80
        netloc = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = netloc if self._port == default_port else f"{netloc}:{self._port}"
        self._user_agent = user_agent
        self._retries = _retry_count(configuration.retries)
        pool = configuration.connection_pool_maxsize
        self._max_idle = _DEFAULT_POOL if pool is None else max(1, int(pool))
        self._idle: list[_Connection] = []
        self._ssl: ssl.SSLContext | None = None
        self._token: tuple[float, str | None] | None = None  # (read at, header value)
        self.connections_opened = 0  # for tests and benchmarks

    @staticmethod
    def unsupported(configuration: k8s_client.Configuration) -> str:
        """Why this configuration needs the kubernetes client's own transport, or ""."""
        url = urlsplit(str(configuration.host))
        if url.scheme not in ("http", "https") or not url.hostname:
            return f"server URL {configuration.host!r} is not http(s)://host"
        if configuration.proxy:
            return "a proxy is configured"
        if configuration.assert_hostname not in (None, True, False):
            return "assert_hostname names another host"
        return ""

    # -- connections ---------------------------------------------------------------
    def _tls_context(self) -> ssl.SSLContext:
        # As urllib3's ssl_wrap_socket builds it for the client's pool arguments.
        if self._ssl is None:
            config = self.configuration
            context = ssl.create_default_context()
            if config.verify_ssl:
                if config.ssl_ca_cert or config.ca_cert_data:
                    context = ssl.create_default_context(
                        cafile=config.ssl_ca_cert, cadata=config.ca_cert_data
                    )
                context.check_hostname = config.assert_hostname is not False
            else:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if config.cert_file:
                context.load_cert_chain(config.cert_file, config.key_file)
            self._ssl = context
        return self._ssl

    async def _connect(self) -> _Connection:
        stream: trio.abc.Stream = await trio.open_tcp_stream(self._host, self._port)
        assert isinstance(stream, trio.SocketStream)
        for level, option, value in self.configuration.socket_options or ():
            stream.setsockopt(level, option, value)
        self.connections_opened += 1
        if self._https:
            server_name = self.configuration.tls_server_name or self._host
            tls = trio.SSLStream(
                stream, self._tls_context(), server_hostname=server_name, https_compatible=True
            )
            try:
                await tls.do_handshake()
            except BaseException:
                _Connection(stream).close_now()
                raise
            stream = tls
        return _Connection(stream)

    def close(self) -> None:
        """Close every kept-alive connection (no await: callable from sync code)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close_now()

    # -- headers -------------------------------------------------------------------
    async def _authorization(self) -> str | None:
        config = self.configuration
        if config.refresh_api_key_hook is None:
            return self._bearer(config.auth_settings())
        now = time.monotonic()
        if self._token is None or now - self._token[0] >= TOKEN_REUSE:
            settings = await trio.to_thread.run_sync(config.auth_settings)
            self._token = (now, self._bearer(settings))
        return self._token[1]

    @staticmethod
    def _bearer(settings: Mapping[str, Any]) -> str | None:
        bearer = settings.get("BearerToken")
        return str(bearer["value"]) if bearer and bearer.get("value") else None

    # -- requests ------------------------------------------------------------------
    def _request(self, path: str, authorization: str | None) -> bytes:
        """``GET <prefix><path>`` as bytes; ``ConnectionFailed`` for a field that cannot
        go on the wire (a line break or a non-ASCII character), as nothing was sent."""
        target = self._prefix + path
        fields = [
            ("Host", self._host_header),
            ("Accept", "application/json"),
            ("User-Agent", self._user_agent),
        ]
        if authorization:
            fields.append(("Authorization", authorization))
        if (
            not target.startswith("/")
            or not target.isascii()
            or not target.isprintable()
            or (" " in target)
        ):
            raise ConnectionFailed(f"cannot send the request: bad target {target[:80]!r}")
        lines = [f"GET {target} HTTP/1.1"]
        for name, value in fields:
            if not value.isascii() or not _field_ok(value):
                raise ConnectionFailed(f"cannot send the request: bad {name} header")
            lines.append(f"{name}: {value}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")

    async def get(self, path: str, *, timeout: float) -> bytes:
        """The body of a 2xx answer to ``GET <prefix><path>`` (``path`` already
        percent-encoded). Raises ``K8sError``: the translated status of any other answer,
        ``ConnectionFailed`` when none came within ``timeout`` seconds."""
        request = self._request(path, await self._authorization())
        with trio.move_on_after(timeout) as scope:
            return await self._send_with_retries(request)
        assert scope.cancelled_caught
        raise ConnectionFailed(
            f"connection to the API server failed: no answer within {timeout:g} s"
        )

    async def _send_with_retries(self, request: bytes) -> bytes:
        resends = self._retries
        while True:
            try:
                return await self._exchange(request)
            except (_Dropped, OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
                # trio.SSLStream reports TLS failures as BrokenResourceError from the
                # ssl error; a certificate refused would be refused again.
                cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
                if isinstance(cause, ssl.SSLCertVerificationError) or resends <= 0:
                    raise ConnectionFailed(
                        f"connection to the API server failed: {_describe(exc)}"
                    ) from exc
                resends -= 1

    async def _exchange(self, request: bytes) -> bytes:
        reused = bool(self._idle)
        connection = self._idle.pop() if reused else await self._connect()
        done = False
        try:
            status, reason, headers, body, keep = await self._round_trip(
                connection, request, reused
            )
            if keep and len(self._idle) < self._max_idle:
                self._idle.append(connection)
                done = True
        finally:
            if not done:
                connection.close_now()
        if not 200 <= status <= 299:
            raise status_error(status, reason, headers, body)
        return body

    async def _round_trip(
        self, connection: _Connection, request: bytes, reused: bool
    ) -> tuple[int, str, dict[bytes, bytes], bytes, bool]:
        """Send ``request`` and read its answer: (status, reason, headers with lowercase
        names, body, whether the connection can carry the next request)."""
        await connection.stream.send_all(request)
        answer = _Answer()
        parser = httptools.HttpResponseParser(answer)
        answer.parser = parser
        try:
            while not answer.complete:
                try:
                    data = await connection.stream.receive_some(_READ_SIZE)
                except (OSError, trio.BrokenResourceError):
                    if reused and not answer.started:
                        raise _Dropped("the kept-alive connection was closed") from None
                    raise
                if not data:
                    if answer.close_delimited():
                        break  # the end of the connection is the end of the body
                    if not answer.started:
                        if reused:
                            raise _Dropped("the kept-alive connection was closed")
                        raise OSError("the API server closed the connection without answering")
                    raise OSError("the API server closed the connection mid-answer")
                try:
                    parser.feed_data(data)
                except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                    if not answer.complete:
                        raise OSError(f"bad HTTP answer: {_parser_error(exc)}") from None
                    # Bytes after a whole answer (llhttp refuses any after "Connection:
                    # close"): the answer stands, the connection is not used again.
                    answer.extra = True
                answer.count(len(data))
            status = parser.get_status_code()
            keep = answer.complete and answer.keep_alive and not answer.extra
        finally:
            answer.parser = None  # the parser holds the answer's callbacks
        reason = answer.reason.decode("latin-1")
        return status, reason, answer.headers, b"".join(answer.body), keep


def _parser_error(exc: BaseException) -> str:
    if isinstance(exc, httptools.HttpParserUpgrade):
        return "a protocol upgrade"
    return str(exc) or type(exc).__name__


def _describe(exc: BaseException) -> str:
    if isinstance(exc, trio.BrokenResourceError) and exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _retry_after(headers: dict[bytes, bytes]) -> float | None:
    raw = headers.get(b"retry-after")
    try:
        value = float(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def status_error(status: int, reason: str, headers: dict[bytes, bytes], body: bytes) -> K8sError:
    """The ``K8sError`` for a non-2xx answer, exactly as ``translate_error`` makes it from
    the kubernetes client's ``ApiException`` for the same answer."""
    message, status_reason = status_fields(body)
    return error_for_status(
        status, message or f"({status}) {reason or 'error'}", status_reason, _retry_after(headers)
    )
