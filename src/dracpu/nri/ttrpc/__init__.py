"""ttrpc framing and unary calls (protocols.md 5), sans-IO, in both roles.

A frame is a 10-byte header and L data bytes::

    L (uint32 BE) | stream id (uint32 BE) | message type (uint8) | flags (uint8) | data

Requests and responses carry the protobuf envelopes `ttrpc.Request` / `ttrpc.Response`.
NRI only makes unary calls, so Data frames and streaming flags are never produced and are
refused when received.

What each role does with each kind of inbound frame (anything else raises):

| role   | frame                                  | outcome                                       |
| ------ | -------------------------------------- | --------------------------------------------- |
| server | L > 4 MiB, any type                    | data skipped unbuffered; RESOURCE_EXHAUSTED    |
|        |                                        | reply queued; `RequestRejected`                |
| server | Request, even stream id                | INVALID_ARGUMENT reply; `RequestRejected`      |
| server | Request, id <= previous request id     | INVALID_ARGUMENT reply; `RequestRejected`      |
| server | Request, undecodable envelope          | INVALID_ARGUMENT reply; `RequestRejected`      |
| server | Request, otherwise                     | `RequestReceived`; caller must `send_response` |
| server | Response, Data, unknown type           | `UnknownMessageType`                           |
| client | Response for a call in flight          | `ResponseReceived` (payload or Status)         |
| client | same, L > 4 MiB                        | data skipped; `ResponseReceived` with          |
|        |                                        | RESOURCE_EXHAUSTED                             |
| client | Response for any other stream          | `ResponseDropped` (late reply after a timeout) |
| client | Response in flight, undecodable        | `MalformedMessage`                             |
| client | Request, Data, unknown type            | `UnknownMessageType`                           |

The server rows mirror the Go ttrpc server, which answers these on the offending stream id
and keeps the connection.
"""

from __future__ import annotations

from dracpu.nri.ttrpc.connection import (
    ClientEvent,
    RequestReceived,
    RequestRejected,
    ResponseDropped,
    ResponseReceived,
    ServerEvent,
    TTRPCClientConnection,
    TTRPCServerConnection,
)
from dracpu.nri.ttrpc.frames import HEADER_LENGTH, MAX_DATA_LENGTH, MessageType, encode_frame
from dracpu.nri.ttrpc.status import (
    Status,
    StatusCode,
    unimplemented_method,
    unimplemented_service,
)

# The frame layer's other names (FrameReader, Flag, ...) are in dracpu.nri.ttrpc.frames.
__all__ = [
    "HEADER_LENGTH",
    "MAX_DATA_LENGTH",
    "ClientEvent",
    "MessageType",
    "RequestReceived",
    "RequestRejected",
    "ResponseDropped",
    "ResponseReceived",
    "ServerEvent",
    "Status",
    "StatusCode",
    "TTRPCClientConnection",
    "TTRPCServerConnection",
    "encode_frame",
    "unimplemented_method",
    "unimplemented_service",
]
