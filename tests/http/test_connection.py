"""The sans-IO connection core: exact bytes in and out, limits, keep-alive, errors."""

from __future__ import annotations

import os

import pytest
from fixed_views import fixed_readiness
from hypothesis import given, settings
from hypothesis import strategies as st

from dracpu.http import HTTPApp, HTTPLimits, ServerConnection, Step


def examples(default: int) -> int:
    """``FUZZ_EXAMPLES`` raises the example count for long runs; CI uses ``default``."""
    raw = os.environ.get("FUZZ_EXAMPLES", "").strip()
    return int(raw) if raw else default


def make(limits: HTTPLimits | None = None) -> ServerConnection:
    app = HTTPApp(readiness=fixed_readiness({"nri": False}, {"nri": "down"}))
    app.mark_started()
    return ServerConnection(app, limits)


def feed(core: ServerConnection, data: bytes) -> list[Step]:
    """Feed bytes, then run steps until the core needs more data or closes."""
    core.receive_data(data)
    steps = []
    while True:
        step = core.step()
        steps.append(step)
        if step.need_data or step.close:
            return steps


def test_simple_get_exact_bytes() -> None:
    core = make()
    assert core.phase == "idle"
    steps = feed(core, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert steps == [
        Step(data=b"HTTP/1.1 200 OK\r\nserver: dracpu\r\ncontent-length: 0\r\n\r\n"),
        Step(need_data=True),
    ]
    assert core.phase == "idle"
    assert core.requests_served == 1


def test_keep_alive_and_pipelining() -> None:
    core = make()
    steps = feed(
        core,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    statuses = [step.data.split(b"\r\n", 1)[0] for step in steps if step.data]
    assert statuses == [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 503 Service Unavailable",
        b"HTTP/1.1 404 Not Found",
    ]
    assert steps[1].data.endswith(b"\r\n\r\n[-] nri: down\nreadyz check failed\n")
    assert steps[-1].close  # the client asked to close
    assert core.phase == "closed"


def test_http10_closes_after_the_response() -> None:
    core = make()
    (step,) = feed(core, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert step.data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert step.close


def test_head_has_no_body_but_the_length() -> None:
    core = make()
    step = feed(core, b"HEAD /readyz HTTP/1.1\r\nHost: x\r\n\r\n")[0]
    head, _, body = step.data.partition(b"\r\n\r\n")
    assert body == b""
    assert b"content-length: 34" in head


def test_partial_head_is_phase_head() -> None:
    core = make()
    assert feed(core, b"GET /hea") == [Step(need_data=True)]
    assert core.phase == "head"
    steps = feed(core, b"lthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert steps[0].data.startswith(b"HTTP/1.1 200 OK")


def _error(step: Step) -> tuple[bytes, bytes]:
    head, _, body = step.data.partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0], body


def test_malformed_request_line_is_400() -> None:
    core = make()
    (step,) = feed(core, b"NOT HTTP AT ALL\r\n\r\n")
    status, body = _error(step)
    assert status == b"HTTP/1.1 400 Bad Request"
    assert body.startswith(b"400 Bad Request: malformed request: ")
    assert b"connection: close" in step.data
    assert step.close


def test_bad_header_is_400() -> None:
    core = make()
    (step,) = feed(core, b"GET /healthz HTTP/1.1\r\nHost: x\r\nbad header\r\n\r\n")
    status, body = _error(step)
    assert status == b"HTTP/1.1 400 Bad Request"
    assert b"malformed request" in body


def test_missing_host_on_http11_is_400() -> None:
    (step,) = feed(make(), b"GET /healthz HTTP/1.1\r\n\r\n")
    assert _error(step) == (
        b"HTTP/1.1 400 Bad Request",
        b"400 Bad Request: malformed request: Missing mandatory Host: header\n",
    )


def test_oversized_headers_are_431() -> None:
    core = make(HTTPLimits(max_header_bytes=1024))
    steps = feed(core, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2000)
    status, body = _error(steps[-1])
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert body == (
        b"431 Request Header Fields Too Large: request line and headers exceed 1024 bytes\n"
    )
    assert steps[-1].close


def test_default_header_limit_is_16_kib() -> None:
    ok = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 15000 + b"\r\n\r\n"
    assert feed(make(), ok)[0].data.startswith(b"HTTP/1.1 200 OK")
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 17000 + b"\r\n\r\n"
    assert _error(feed(make(), big)[-1])[0] == b"HTTP/1.1 431 Request Header Fields Too Large"


@pytest.mark.parametrize(
    "framing",
    [b"Content-Length: 3\r\n\r\nabc", b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"],
)
@pytest.mark.parametrize("method", [b"GET", b"HEAD"])
def test_get_with_a_body_is_refused(method: bytes, framing: bytes) -> None:
    (step,) = feed(make(), method + b" /metrics HTTP/1.1\r\nHost: x\r\n" + framing)
    status, body = _error(step)
    assert status == b"HTTP/1.1 400 Bad Request"
    if method == b"GET":
        assert body == b"400 Bad Request: GET requests must not have a body\n"
    assert step.close


def test_get_with_empty_content_length_is_fine() -> None:
    step = feed(make(), b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")[0]
    assert step.data.startswith(b"HTTP/1.1 200 OK")


def test_post_body_is_discarded_and_answered_405_keeping_the_connection() -> None:
    core = make()
    steps = feed(
        core,
        b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    assert steps[0].data.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
    assert b"allow: GET, HEAD" in steps[0].data
    assert steps[1].data.startswith(b"HTTP/1.1 200 OK")
    assert not any(step.close for step in steps)


def test_declared_oversized_body_is_413() -> None:
    core = make(HTTPLimits(max_body_bytes=10))
    (step,) = feed(core, b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n")
    assert _error(step) == (
        b"HTTP/1.1 413 Content Too Large",
        b"413 Content Too Large: request body exceeds 10 bytes\n",
    )


def test_chunked_oversized_body_is_413() -> None:
    core = make(HTTPLimits(max_body_bytes=10))
    steps = feed(
        core,
        b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"8\r\n12345678\r\n8\r\n12345678\r\n",
    )
    assert _error(steps[-1])[0] == b"HTTP/1.1 413 Content Too Large"


def test_eof_between_requests_closes_quietly() -> None:
    core = make()
    feed(core, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert feed(core, b"") == [Step(close=True)]


def test_eof_inside_a_request_is_400() -> None:
    core = make()
    feed(core, b"GET /healthz HTTP/1.1\r\nHo")
    steps = feed(core, b"")
    assert _error(steps[-1])[0] == b"HTTP/1.1 400 Bad Request"


def test_timeouts_per_phase() -> None:
    idle = make()
    assert idle.timed_out() == Step(close=True)  # nothing to answer

    head = make()
    feed(head, b"GET /hea")
    status, body = _error(head.timed_out())
    assert status == b"HTTP/1.1 408 Request Timeout"
    assert body == b"408 Request Timeout: timed out reading the request headers\n"

    body_phase = make()
    feed(body_phase, b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nabc")
    assert body_phase.phase == "body"
    assert _error(body_phase.timed_out())[1] == (
        b"408 Request Timeout: timed out reading the request body\n"
    )


def test_closing_adds_connection_close() -> None:
    core = make()
    core.start_closing()
    (step,) = feed(core, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"connection: close" in step.data
    assert step.close


def test_data_after_close_is_ignored() -> None:
    core = make()
    feed(core, b"GET /healthz HTTP/1.0\r\n\r\n")
    core.receive_data(b"more")
    assert core.step() == Step(close=True)


# -- fuzz: whatever arrives, the core answers or closes, and never raises ---------------

_PIECES = st.sampled_from(
    [
        b"GET /healthz HTTP/1.1\r\n",
        b"HEAD /metrics HTTP/1.0\r\n",
        b"POST /readyz HTTP/1.1\r\n",
        b"Host: x\r\n",
        b"Content-Length: 3\r\n",
        b"Content-Length: -1\r\n",
        b"Transfer-Encoding: chunked\r\n",
        b"Connection: close\r\n",
        b"\r\n",
        b"abc",
        b"3\r\nabc\r\n0\r\n\r\n",
        b"\x00\xff",
        b" ",
    ]
)


@settings(max_examples=examples(300), deadline=None)
@given(
    chunks=st.lists(st.one_of(_PIECES, st.binary(max_size=40)), max_size=12),
    eof=st.booleans(),
)
def test_fuzzed_input_never_raises(chunks: list[bytes], eof: bool) -> None:
    core = make(HTTPLimits(max_header_bytes=256, max_body_bytes=16))
    closed = False
    for chunk in [*chunks, *([b""] if eof else [])]:
        core.receive_data(chunk)
        while not closed:
            step = core.step()
            if step.data:
                assert step.data.startswith(b"HTTP/1.1 ")
            if step.close:
                closed = True
            if step.need_data:
                break
    if not closed:
        final = core.timed_out()
        assert final.close
