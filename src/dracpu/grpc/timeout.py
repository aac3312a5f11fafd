"""``grpc-timeout`` header parsing (protocols.md 1.6)."""

from __future__ import annotations

import re

from grpclib.const import Status

from dracpu.grpc.errors import TimeoutHeaderError

_FORMAT = re.compile(rb"([0-9]{1,8})([HMSmun])")
_UNIT_SECONDS = {
    b"H": 3600.0,
    b"M": 60.0,
    b"S": 1.0,
    b"m": 1e-3,
    b"u": 1e-6,
    b"n": 1e-9,
}


def parse_grpc_timeout(value: bytes) -> float:
    """``b"44999987u"`` -> 44.999987 (seconds); anything malformed -> TimeoutHeaderError."""
    match = _FORMAT.fullmatch(value)
    if match is None:
        shown = value.decode("ascii", errors="backslashreplace")
        raise TimeoutHeaderError(Status.INVALID_ARGUMENT, f"invalid grpc-timeout: {shown!r}")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
