"""gRPC server on Trio over h2.

``framing``, ``status``, ``timeout`` and ``connection`` are sans-IO (bytes and events in,
bytes out); ``server`` is the Trio shell that moves bytes between a unix socket and them
and runs the handlers from a grpclib-generated ``__mapping__()``.
"""

from __future__ import annotations

from dracpu.grpc.errors import RPCError, ServerError
from dracpu.grpc.server import Deadline, ServerStream, serve_unix

__all__ = ["Deadline", "RPCError", "ServerError", "ServerStream", "serve_unix"]
