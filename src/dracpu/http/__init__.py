"""The daemon's HTTP endpoints (behavior.md §15): a pure app and connection core on h11,
and a thin Trio server around them.

Wiring::

    host, port = parse_bind_address(config.bind_address)
    app = HTTPApp(registry=registry, readiness=sup.readiness.view())
    bound = await nursery.start(serve_http, host, port, app)
    ...
    app.mark_started()                     # /healthz turns 200
    debug = HTTPApp.debug_only(daemon_view)     # anything with .debug_state()
    await nursery.start(serve_http, *parse_bind_address("127.0.0.1:8081"), debug)
"""

from dracpu.http.address import BindAddressError, format_bind_address, parse_bind_address
from dracpu.http.app import DebugView, HTTPApp, ReadinessSource, Request, Response
from dracpu.http.connection import HTTPLimits, ServerConnection, Step
from dracpu.http.server import HTTPServer, serve_http

__all__ = [
    "BindAddressError",
    "DebugView",
    "HTTPApp",
    "HTTPLimits",
    "HTTPServer",
    "ReadinessSource",
    "Request",
    "Response",
    "ServerConnection",
    "Step",
    "format_bind_address",
    "parse_bind_address",
    "serve_http",
]
