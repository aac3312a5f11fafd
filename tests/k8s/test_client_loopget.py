"""LoopGetter: KubeClient.get_raw on the event loop, against a small HTTP/1.1 server of
the test's own (plain and TLS), and the same answers as the kubernetes client's transport."""

from __future__ import annotations

import functools
import json
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
from kubernetes import client as k8s_client

from dracpu.k8s.client import (
    ConnectionFailed,
    K8sError,
    KubeClient,
    NotFound,
    ServerError,
    TooManyRequests,
)
from dracpu.k8s.loopget import LoopGetter

NODE = b'{"kind":"Node","metadata":{"name":"node-a"}}'


@dataclass
class Answer:
    status: int = 200
    body: bytes = NODE
    headers: list[tuple[str, str]] = field(default_factory=list)
    close_after: bool = False  # close the connection after answering, without saying so
    silent: bool = False  # never answer


@dataclass
class FakeServer:
    """Answers each request with the next ``Answer`` (the last one repeats) and records
    every request's target and headers, and how many connections it accepted."""

    answers: list[Answer] = field(default_factory=lambda: [Answer()])
    requests: list[tuple[bytes, dict[bytes, bytes]]] = field(default_factory=list)
    connections: int = 0
    port: int = 0

    def _next(self) -> Answer:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    async def handle(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    conn.receive_data(bytes(data))
                    if not data:
                        return
                    continue
                if isinstance(event, h11.Request):
                    self.requests.append((event.target, {k: v for k, v in event.headers}))
                elif isinstance(event, h11.EndOfMessage):
                    answer = self._next()
                    if answer.silent:
                        await trio.sleep_forever()
                    headers = [("Content-Length", str(len(answer.body))), *answer.headers]
                    out = conn.send(h11.Response(status_code=answer.status, headers=headers))
                    out += conn.send(h11.Data(data=answer.body)) + conn.send(h11.EndOfMessage())
                    await stream.send_all(out)
                    if answer.close_after:
                        return
                    conn.start_next_cycle()
                else:
                    return
        except (trio.BrokenResourceError, h11.ProtocolError, ssl.SSLError):
            return
        finally:
            await trio.aclose_forcefully(stream)


async def start(
    nursery: trio.Nursery, server: FakeServer, wrap: Callable[[trio.abc.Stream], Any] | None
) -> None:
    async def handler(stream: trio.SocketStream) -> None:
        if wrap is None:
            await server.handle(stream)
            return
        tls = wrap(stream)
        try:
            await tls.do_handshake()
        except (trio.BrokenResourceError, ssl.SSLError):
            await trio.aclose_forcefully(stream)
            return
        await server.handle(tls)

    listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    server.port = listeners[0].socket.getsockname()[1]


def configuration(host: str, **settings: Any) -> k8s_client.Configuration:
    config = k8s_client.Configuration()
    config.host = host
    for key, value in settings.items():
        setattr(config, key, value)
    return config


@pytest.fixture
async def plain(nursery: trio.Nursery) -> AsyncIterator[FakeServer]:
    server = FakeServer()
    await start(nursery, server, None)
    yield server


def kube_for(host: str, **settings: Any) -> KubeClient:
    return KubeClient(k8s_client.ApiClient(configuration(host, **settings)), request_timeout=5)


async def test_get_on_the_loop_keeps_one_connection_alive(plain: FakeServer) -> None:
    kube = kube_for(f"http://127.0.0.1:{plain.port}/prefix/")
    assert kube.loop_getter is not None
    try:
        for _ in range(5):
            body = await kube.get_raw("/api/v1/nodes/{name}", name="node a/..")
            assert body == NODE
    finally:
        kube.close()
    assert plain.connections == 1 and kube.loop_getter.connections_opened == 1
    target, headers = plain.requests[0]
    # The URL's path prefix is kept, the parameter percent-encoded.
    assert target == b"/prefix/api/v1/nodes/node%20a%2F.."
    assert headers[b"host"] == f"127.0.0.1:{plain.port}".encode()
    assert headers[b"accept"] == b"application/json"
    assert headers[b"user-agent"] == kube.api_client.user_agent.encode()
    assert b"authorization" not in headers


async def test_bearer_token_and_its_refresh_hook(plain: FakeServer) -> None:
    refreshed: list[int] = []

    def refresh(config: k8s_client.Configuration) -> None:
        refreshed.append(1)
        config.api_key["BearerToken"] = f"token-{len(refreshed)}"

    kube = kube_for(
        f"http://127.0.0.1:{plain.port}",
        api_key={"BearerToken": "token-0"},
        api_key_prefix={"BearerToken": "Bearer"},
        refresh_api_key_hook=refresh,
    )
    try:
        await kube.get_raw("/api/v1/nodes/{name}", name="node-a")
        await kube.get_raw("/api/v1/nodes/{name}", name="node-a")
    finally:
        kube.close()
    # The hook ran once for both requests (reused for TOKEN_REUSE seconds).
    assert refreshed == [1]
    assert [h[b"authorization"] for _, h in plain.requests] == [b"Bearer token-1"] * 2


async def test_without_a_refresh_hook_the_token_is_read_each_time(plain: FakeServer) -> None:
    kube = kube_for(f"http://127.0.0.1:{plain.port}", api_key={"authorization": "Bearer abc"})
    try:
        await kube.get_raw("/api/v1/nodes/{name}", name="node-a")
        kube.api_client.configuration.api_key["authorization"] = "Bearer def"
        await kube.get_raw("/api/v1/nodes/{name}", name="node-a")
    finally:
        kube.close()
    assert [h[b"authorization"] for _, h in plain.requests] == [b"Bearer abc", b"Bearer def"]


async def test_a_connection_closed_by_the_server_is_replaced(plain: FakeServer) -> None:
    plain.answers[:] = [Answer(close_after=True), Answer()]
    kube = kube_for(f"http://127.0.0.1:{plain.port}")
    try:
        assert await kube.get_raw("/api/v1/nodes/{name}", name="node-a") == NODE
        # The kept connection is dead: the GET is sent again on a new one.
        assert await kube.get_raw("/api/v1/nodes/{name}", name="node-a") == NODE
    finally:
        kube.close()
    assert plain.connections == 2
    assert len(plain.requests) == 2


@pytest.mark.parametrize(
    ("answer", "kind", "message", "retry_after"),
    [
        (
            Answer(
                404,
                b'{"kind":"Status","message":"nodes \\"x\\" not found","reason":"NotFound"}',
            ),
            NotFound,
            'nodes "x" not found',
            None,
        ),
        (Answer(503, b"down", [("Retry-After", "7")]), ServerError, "(503) error", 7.0),
        (
            Answer(429, b'{"kind":"Status","message":"slow down"}', [("Retry-After", "-1")]),
            TooManyRequests,
            "slow down",
            None,
        ),
        (Answer(403, b'{"kind":"Status","message":"forbidden"}'), K8sError, "forbidden", None),
    ],
)
async def test_answers_are_translated_as_the_client_translates_them(
    plain: FakeServer, answer: Answer, kind: type[K8sError], message: str, retry_after: Any
) -> None:
    plain.answers[:] = [answer]
    kube = kube_for(f"http://127.0.0.1:{plain.port}")
    try:
        with pytest.raises(K8sError) as info:
            await kube.get_raw("/api/v1/nodes/{name}", name="x")
    finally:
        kube.close()
    assert type(info.value) is kind
    assert info.value.status == answer.status
    # No Status body and no reason phrase: "(503) error", as translate_error words it.
    assert str(info.value) == message
    assert info.value.retry_after == retry_after


async def test_no_answer_within_the_timeout(plain: FakeServer) -> None:
    plain.answers[:] = [Answer(silent=True)]
    kube = KubeClient(
        k8s_client.ApiClient(configuration(f"http://127.0.0.1:{plain.port}")),
        request_timeout=0.2,
    )
    try:
        with pytest.raises(ConnectionFailed) as info:
            await kube.get_raw("/api/v1/nodes/{name}", name="node-a")
    finally:
        kube.close()
    assert str(info.value) == "connection to the API server failed: no answer within 0.2 s"


async def failed_get(port: int) -> str:
    """The ``ConnectionFailed`` message of one GET from the server at ``port``, no resends."""
    kube = KubeClient(k8s_client.ApiClient(configuration(f"http://127.0.0.1:{port}", retries=0)))
    try:
        with pytest.raises(ConnectionFailed) as info:
            await kube.get_raw("/api/v1/nodes/{name}", name="node-a")
    finally:
        kube.close()
    return str(info.value)


async def test_an_answer_that_is_not_http(nursery: trio.Nursery) -> None:
    async def garbage(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await stream.aclose()

    async def silent_close(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.aclose()

    messages = []
    for handler in (garbage, silent_close):
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
        )
        messages.append(await failed_get(listeners[0].socket.getsockname()[1]))
    assert messages[0].startswith("connection to the API server failed: OSError: bad HTTP answer")
    assert messages[1] == (
        "connection to the API server failed: OSError: the API server closed the connection "
        "without answering"
    )


async def raw_server(nursery: trio.Nursery, answers: list[bytes]) -> tuple[int, list[bytes]]:
    """A server that answers each request it reads with the next of ``answers``, byte
    for byte, one connection after another; a ``b""`` closes the connection (at once
    when it follows an answer); returns its port and every request's head."""
    received: list[bytes] = []

    async def handler(stream: trio.SocketStream) -> None:
        got = b""
        try:
            while answers:
                while b"\r\n\r\n" not in got:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    got += data
                request, got = got.split(b"\r\n\r\n", 1)
                received.append(request)
                answer = answers.pop(0)
                if not answer:
                    return
                await stream.send_all(answer)
                if answers and not answers[0]:
                    answers.pop(0)
                    return
        except trio.BrokenResourceError:
            pass
        finally:
            await trio.aclose_forcefully(stream)

    listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return listeners[0].socket.getsockname()[1], received


def ok(body: bytes, *headers: bytes) -> bytes:
    head = b"".join(h + b"\r\n" for h in headers)
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), head, body)


async def two_gets(port: int, **settings: Any) -> tuple[list[bytes], int]:
    kube = KubeClient(k8s_client.ApiClient(configuration(f"http://127.0.0.1:{port}", **settings)))
    assert kube.loop_getter is not None
    try:
        bodies = [await kube.get_raw("/api/v1/nodes/{name}", name=n) for n in ("a", "b")]
    finally:
        kube.close()
    return bodies, kube.loop_getter.connections_opened


async def test_answer_forms_the_parser_reads(nursery: trio.Nursery) -> None:
    # An informational answer first, then a chunked one: one connection, kept alive.
    chunked = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'5\r\n{"a":\r\n2\r\n1}\r\n0\r\n\r\n'
    )
    port, received = await raw_server(nursery, [chunked, ok(b"{}")])
    assert await two_gets(port) == ([b'{"a":1}', b"{}"], 1)
    assert received[0].startswith(b"GET /api/v1/nodes/a HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nAccept: application/json\r\n" in received[0] + b"\r\n"

    # A body that runs to the end of the connection (no length, no chunks) is whole at
    # its end; the next GET needs a new connection.
    close_delimited = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + NODE
    port, _ = await raw_server(nursery, [close_delimited, b"", ok(b"{}")])
    assert await two_gets(port) == ([NODE, b"{}"], 2)

    # "Connection: close" with a length; bytes after the answer: in neither case is the
    # connection used again (the server would answer on it: one connection would do).
    port, _ = await raw_server(nursery, [ok(b"{}", b"Connection: close"), ok(b"[]")])
    assert await two_gets(port) == ([b"{}", b"[]"], 2)
    port, _ = await raw_server(nursery, [ok(b"{}") + b"HTTP/1.1 200", ok(b"[]")])
    assert await two_gets(port) == ([b"{}", b"[]"], 2)
    # ... also bytes llhttp refuses outright, after an answer that said it closes.
    port, _ = await raw_server(nursery, [ok(b"{}", b"Connection: close") + b"X", ok(b"[]")])
    assert await two_gets(port, retries=0) == ([b"{}", b"[]"], 2)
    port, _ = await raw_server(nursery, [ok(b"{}"), ok(b"[]")])
    assert await two_gets(port) == ([b"{}", b"[]"], 1)


async def test_a_chunked_answers_trailers_are_not_its_headers(nursery: trio.Nursery) -> None:
    answer = (
        b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\nRetry-After: 1\r\n"
        b"\r\n2\r\n{}\r\n0\r\nRetry-After: 99\r\n\r\n"
    )
    port, _ = await raw_server(nursery, [answer])
    kube = KubeClient(k8s_client.ApiClient(configuration(f"http://127.0.0.1:{port}")))
    try:
        with pytest.raises(TooManyRequests) as info:
            await kube.get_raw("/api/v1/nodes/{name}", name="node-a")
    finally:
        kube.close()
    assert info.value.retry_after == 1


async def test_answers_the_parser_refuses(nursery: trio.Nursery) -> None:
    cases = {
        # a header section without end
        b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 70000: "header section larger than 65536",
        # a length the body never reaches before the connection ends
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}": "closed the connection mid-answer",
        # conflicting lengths
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}": "bad HTTP",
        # a protocol switch
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n": (
            "bad HTTP answer: a protocol upgrade"
        ),
    }
    for answer, words in cases.items():
        port, _ = await raw_server(nursery, [answer, b""])
        message = await failed_get(port)
        assert words in message, (answer[:60], message)


async def test_a_header_that_cannot_go_on_the_wire_is_refused_before_sending(
    nursery: trio.Nursery,
) -> None:
    port, received = await raw_server(nursery, [ok(b"{}")])
    for token in ("abc\r\nX-Injected: 1", "t\u00f6ken"):
        kube = KubeClient(
            k8s_client.ApiClient(
                configuration(
                    f"http://127.0.0.1:{port}",
                    api_key={"authorization": token},
                    api_key_prefix={"authorization": "Bearer"},
                )
            )
        )
        try:
            with pytest.raises(ConnectionFailed) as info:
                await kube.get_raw("/api/v1/nodes/{name}", name="node-a")
        finally:
            kube.close()
        assert str(info.value) == "cannot send the request: bad Authorization header"
    assert received == []


async def test_a_proxy_keeps_the_kubernetes_transport() -> None:
    config = configuration("http://10.0.0.1:6443", proxy="http://proxy:3128")
    assert LoopGetter.unsupported(config) == "a proxy is configured"
    kube = KubeClient(k8s_client.ApiClient(config))
    assert kube.loop_getter is None
    assert LoopGetter.unsupported(configuration("ftp://x")) == (
        "server URL 'ftp://x' is not http(s)://host"
    )
    assert (
        LoopGetter.unsupported(configuration("https://a:1", assert_hostname="b"))
        == "assert_hostname names another host"
    )
    with pytest.raises(ValueError, match="cannot GET on the event loop: a proxy is configured"):
        LoopGetter(config)
    off = KubeClient(k8s_client.ApiClient(configuration("http://127.0.0.1:1")), loop_get=False)
    assert off.loop_getter is None


# ---- TLS --------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(where: Path, name: str) -> dict[str, Path]:
    """A self-signed CA, a server certificate for 127.0.0.1 and the name ``api.test``,
    and a client certificate, all signed by that CA."""
    where.mkdir()
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
        "-keyout", "ca.key", "-out", "ca.crt", cwd=where,
    )  # fmt: skip
    (where / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:api.test\n")
    for who, ext in (("server", ["-extfile", "san.ext"]), ("client", [])):
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={who}",
            "-keyout", f"{who}.key", "-out", f"{who}.csr", cwd=where,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-out", f"{who}.crt", *ext, cwd=where,
        )  # fmt: skip
    return {
        n: where / n for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")
    }


@pytest.fixture
async def tls(
    nursery: trio.Nursery, tmp_path: Path
) -> AsyncIterator[tuple[FakeServer, dict[str, Path], dict[str, Path]]]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make the test certificates")
    pki = make_pki(tmp_path / "pki", "test-ca")
    other = make_pki(tmp_path / "other", "other-ca")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki["ca.crt"]))
    context.load_cert_chain(pki["server.crt"], pki["server.key"])
    context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS, as an API server asks for it
    server = FakeServer()

    def wrap(stream: trio.abc.Stream) -> trio.SSLStream[trio.abc.Stream]:
        return trio.SSLStream(stream, context, server_side=True, https_compatible=True)

    await start(nursery, server, wrap)
    yield server, pki, other


def tls_kube(
    server: FakeServer, pki: dict[str, Path], ca: dict[str, Path] | None = None, **kw: Any
) -> KubeClient:
    """A client of the TLS server showing pki's client certificate and trusting ``ca``'s
    certificate (pki's own CA unless said)."""
    return kube_for(
        f"https://127.0.0.1:{server.port}",
        ssl_ca_cert=str((pki if ca is None else ca)["ca.crt"]),
        cert_file=str(pki["client.crt"]),
        key_file=str(pki["client.key"]),
        **kw,
    )


async def test_tls_with_the_configured_ca_and_client_certificate(
    tls: tuple[FakeServer, dict[str, Path], dict[str, Path]],
) -> None:
    server, pki, _ = tls
    kube = tls_kube(server, pki)
    try:
        for _ in range(3):
            assert await kube.get_raw("/api/v1/nodes/{name}", name="node-a") == NODE
    finally:
        kube.close()
    assert server.connections == 1
    assert server.requests[0][1][b"host"] == f"127.0.0.1:{server.port}".encode()


async def test_tls_server_name_is_the_name_checked(
    tls: tuple[FakeServer, dict[str, Path], dict[str, Path]],
) -> None:
    server, pki, _ = tls
    kube = tls_kube(server, pki, tls_server_name="api.test")
    wrong = tls_kube(server, pki, tls_server_name="other.test")
    try:
        assert await kube.get_raw("/api/v1/nodes/{name}", name="node-a") == NODE
        with pytest.raises(ConnectionFailed) as info:
            await wrong.get_raw("/api/v1/nodes/{name}", name="node-a")
    finally:
        kube.close()
        wrong.close()
    assert "certificate verify failed" in str(info.value)
    assert "other.test" in str(info.value)


async def test_tls_refuses_a_server_of_another_ca(
    tls: tuple[FakeServer, dict[str, Path], dict[str, Path]],
) -> None:
    server, pki, other = tls
    kube = tls_kube(server, pki, other)
    try:
        with pytest.raises(ConnectionFailed) as info:
            await kube.get_raw("/api/v1/nodes/{name}", name="node-a")
    finally:
        kube.close()
    assert str(info.value).startswith("connection to the API server failed: ")
    assert "certificate verify failed" in str(info.value)
    # A verification failure is not retried: one connection, no request sent.
    assert server.requests == []


async def test_tls_without_verification_and_without_a_client_certificate(
    tls: tuple[FakeServer, dict[str, Path], dict[str, Path]],
) -> None:
    server, pki, other = tls
    unverified = tls_kube(server, pki, other, verify_ssl=False)
    anonymous = kube_for(f"https://127.0.0.1:{server.port}", ssl_ca_cert=str(pki["ca.crt"]))
    try:
        # insecure-skip-tls-verify: the other CA's trust is not consulted.
        assert await unverified.get_raw("/api/v1/nodes/{name}", name="node-a") == NODE
        # The server asks for a client certificate: none, no answer.
        with pytest.raises(ConnectionFailed):
            await anonymous.get_raw("/api/v1/nodes/{name}", name="node-a")
    finally:
        unverified.close()
        anonymous.close()


async def test_the_kubeconfig_client_reads_the_sim_api_server_on_the_loop(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    from dracpu_sim.apiserver import SimAPIServer

    sim = SimAPIServer(seed=9)
    await nursery.start(sim.serve)
    sim.create("nodes", {"metadata": {"name": "node-a"}})
    kube = KubeClient.from_kubeconfig(str(sim.write_kubeconfig(tmp_path / "kubeconfig")))
    assert kube.loop_getter is not None
    try:
        for _ in range(4):
            doc = json.loads(await kube.get_raw("/api/v1/nodes/{name}", name="node-a"))
            assert doc["metadata"]["name"] == "node-a"
    finally:
        kube.close()
    assert kube.loop_getter.connections_opened == 1
    assert sim.calls.get("get", "nodes") == 4


async def test_reads_at_once_share_as_many_connections_as_the_limiter_allows(
    plain: FakeServer,
) -> None:
    # docs/scale.md: 64 claims read 10 times each open 4 connections (max_concurrent_calls).
    kube = kube_for(f"http://127.0.0.1:{plain.port}")

    async def reader() -> None:
        for _ in range(10):
            assert await kube.get_raw("/api/v1/nodes/{name}", name="node-a") == NODE

    try:
        async with trio.open_nursery() as readers:
            for _ in range(64):
                readers.start_soon(reader)
    finally:
        kube.close()
    assert len(plain.requests) == 640
    assert plain.connections == 4
