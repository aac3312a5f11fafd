"""GETs to the API server on the Trio thread: h11 over Trio streams, no worker thread.

A GET through the ``kubernetes`` client runs urllib3 in a worker thread. On a node drain
(64 claims prepared at once, each reading its claim) that thread hop and the interpreter
lock it takes back after every system call of urllib3 cost more CPU than the request
itself: measured with bench/grpc.py's real path, about 0.9 ms of the daemon's CPU per
claim read, most of it futex waits and context switches. ``LoopGetter`` sends the same
request from the event loop.

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

import h11
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
_DEFAULT_POOL = 10  # urllib3's PoolManager default when the configuration names none


class _Dropped(Exception):
    """A kept-alive connection ended before any byte of the answer: safe to resend."""


class _Connection:
    __slots__ = ("h11", "stream")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

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
    async def get(self, path: str, *, timeout: float) -> bytes:
        """The body of a 2xx answer to ``GET <prefix><path>`` (``path`` already
        percent-encoded). Raises ``K8sError``: the translated status of any other answer,
        ``ConnectionFailed`` when none came within ``timeout`` seconds."""
        headers = [
            ("Host", self._host_header),
            ("Accept", "application/json"),
            ("User-Agent", self._user_agent),
        ]
        authorization = await self._authorization()
        if authorization:
            headers.append(("Authorization", authorization))
        request = h11.Request(method="GET", target=(self._prefix + path).encode(), headers=headers)
        with trio.move_on_after(timeout) as scope:
            return await self._send_with_retries(request)
        assert scope.cancelled_caught
        raise ConnectionFailed(
            f"connection to the API server failed: no answer within {timeout:g} s"
        )

    async def _send_with_retries(self, request: h11.Request) -> bytes:
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

    async def _exchange(self, request: h11.Request) -> bytes:
        reused = bool(self._idle)
        connection = self._idle.pop() if reused else await self._connect()
        done = False
        try:
            status, reason, headers, body = await self._round_trip(connection, request, reused)
            keep = connection.h11.our_state is h11.DONE and connection.h11.their_state is h11.DONE
            if keep and len(self._idle) < self._max_idle:
                connection.h11.start_next_cycle()
                self._idle.append(connection)
                done = True
        finally:
            if not done:
                connection.close_now()
        if not 200 <= status <= 299:
            raise status_error(status, reason, headers, body)
        return body

    async def _round_trip(
        self, connection: _Connection, request: h11.Request, reused: bool
    ) -> tuple[int, str, dict[bytes, bytes], bytes]:
        conn = connection.h11
        await connection.stream.send_all(conn.send(request) + conn.send(h11.EndOfMessage()))
        status, reason, headers = 0, "", {}
        chunks: list[bytes] = []
        answered = eof = False
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                if eof and not answered:
                    if reused:
                        raise _Dropped("the kept-alive connection was closed") from None
                    closed = "the API server closed the connection without answering"
                    raise OSError(closed) from None
                raise OSError(f"bad HTTP answer: {exc}") from None
            if event is h11.NEED_DATA:
                try:
                    data = await connection.stream.receive_some(_READ_SIZE)
                except (OSError, trio.BrokenResourceError):
                    if reused and not answered:
                        raise _Dropped("the kept-alive connection was closed") from None
                    raise
                eof = not data
                conn.receive_data(bytes(data))
                continue
            if isinstance(event, h11.ConnectionClosed):
                raise OSError("the API server closed the connection mid-answer")
            if isinstance(event, h11.Response):
                answered = True
                status = event.status_code
                reason = event.reason.decode("latin-1")
                headers = {k.lower(): v for k, v in event.headers}
            elif isinstance(event, h11.InformationalResponse):
                answered = True
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return status, reason, headers, b"".join(chunks)


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
