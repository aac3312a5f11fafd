"""ttrpc call status (protocols.md 5.3, 5.4): gRPC codes, the replies for what is not served."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from dracpu.proto.nri import ttrpc_pb2

__all__ = [
    "Status",
    "StatusCode",
    "status_response",
    "unimplemented_method",
    "unimplemented_service",
]

_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1


class StatusCode(enum.IntEnum):
    """gRPC status codes, which ttrpc reuses."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


@dataclass(frozen=True, slots=True)
class Status:
    """A failed call: a non-zero gRPC code and a message (success is a payload instead)."""

    code: int
    message: str = ""

    def __post_init__(self) -> None:
        if self.code == StatusCode.OK:
            raise ValueError("status code 0 means success; answer with a payload instead")
        if not _INT32_MIN <= self.code <= _INT32_MAX:
            raise ValueError(f"status code {self.code} does not fit in int32")


def unimplemented_service(service: str) -> Status:
    """The reply the Go server gives for a service it does not serve."""
    return Status(StatusCode.UNIMPLEMENTED, f"service {service}")


def unimplemented_method(method: str) -> Status:
    """The reply the Go server gives for a method its service does not have."""
    return Status(StatusCode.UNIMPLEMENTED, f"method {method}")


def status_response(status: Status) -> ttrpc_pb2.Response:
    return ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=status.code, message=status.message))
