"""Exceptions at the gRPC boundary."""

from __future__ import annotations

from grpclib.const import Status


class RPCError(Exception):
    """One RPC fails with this gRPC status; the connection keeps serving the others."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status.name}, {self.message!r})"


class FramingError(RPCError):
    """A length-prefixed request message is malformed, compressed or too large."""


class TimeoutHeaderError(RPCError):
    """The ``grpc-timeout`` header does not match ``^[0-9]{1,8}[HMSmun]$``."""


class ServerError(Exception):
    """The server cannot listen (bad socket path, bind failure)."""
