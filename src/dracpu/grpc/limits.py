"""The bounds one gRPC server connection keeps, with the reasons for each (sans-IO).

A request message's own bound is ``framing.MAX_MESSAGE_SIZE``; a status message's is
``status.MAX_STATUS_MESSAGE``.
"""

from __future__ import annotations

from dracpu.grpc.framing import MAX_MESSAGE_SIZE

__all__ = [
    "DEFAULT_MAX_CONCURRENT_STREAMS",
    "HEADERS_FRAME_UNITS",
    "HEADER_BYTES_PER_UNIT",
    "MAX_CONNECTION_BUFFER",
    "MAX_HEADER_BLOCK_SIZE",
    "MAX_HEADER_LIST_SIZE",
    "STEP_BUDGET",
]

DEFAULT_MAX_CONCURRENT_STREAMS = 1000
# Advertised in SETTINGS and enforced by the HPACK decoder (a block that decodes to more
# ends the connection with ENHANCE_YOUR_CALM). 8 KiB is the server default gRPC's
# PROTOCOL-HTTP2.md suggests for Request-Headers; the kubelet's take a few hundred bytes.
# (grpc-go advertises 16 MiB, defaultServerMaxHeaderListSize in internal/transport/
# defaults.go, and so would decode megabytes of headers; we do not.)
MAX_HEADER_LIST_SIZE = 8 * 1024
# The encoded header block (HEADERS plus CONTINUATION payloads) is refused from the frame
# headers, before any of it is HPACK-decoded, once it passes this. An encoder that follows
# RFC 7541 never needs more bytes for a list than the list's size (each field counts 32
# bytes over its name and value), so a client under MAX_HEADER_LIST_SIZE is not refused
# here unless it pads its HEADERS frames. golang.org/x/net/http2 (readMetaFrame) likewise
# stops decoding a block whose fragments outgrow twice the list budget, and closes the
# connection.
MAX_HEADER_BLOCK_SIZE = MAX_HEADER_LIST_SIZE
# Work done per receive_data(budget=...) call, in units: 1 per frame, 4 per HEADERS frame
# (a stream opened, decoded and often answered: ~100-200 µs of h2 work, where most frames
# cost 10-30 µs), and 1 per HEADER_BYTES_PER_UNIT of header block (HPACK-decoding costs
# up to ~1-2 µs a byte). A step is then at most 16 light frames, 4 requests or one full
# header block: a few ms, up to ~15 ms for a block of the costliest bytes, after which the
# shell lets other connections run.
STEP_BUDGET = 16
HEADERS_FRAME_UNITS = 4
HEADER_BYTES_PER_UNIT = 256
# Request bytes one connection may hold in unfinished messages across all its streams.
# The client's DATA is acknowledged as it arrives (so windows never stall), which means
# flow control alone does not bound this: without a cap, every concurrent stream could
# buffer a message of MAX_MESSAGE_SIZE.
MAX_CONNECTION_BUFFER = 4 * MAX_MESSAGE_SIZE
