"""gRPC server on Trio over h2.

Sans-IO (bytes and events in, bytes out): ``connection`` (one connection's calls) and
what it is built from: ``frame_guard`` (frame headers read ahead of h2), ``h2_server`` (h2
set up for this server), ``hpack_out`` (the stateless HPACK encoder), ``framing``
(length-prefixed messages), ``status``, ``timeout``, ``limits``, ``events`` and
``stream``. ``server`` is the Trio shell that moves bytes between a unix socket and them
and runs the handlers from a grpclib-generated ``__mapping__()``.
"""

from __future__ import annotations

from dracpu.grpc.errors import RPCError, ServerError
from dracpu.grpc.server import Deadline, ServerStream, serve_unix

__all__ = ["Deadline", "RPCError", "ServerError", "ServerStream", "serve_unix"]
