"""The h2 connection as a gRPC server on a unix socket wants it (sans-IO).

``server_h2`` builds one: h2's header validation off (the few checks gRPC needs are
``GRPCServerConnection``'s), a bounded table of closed streams, late frames of streams we
reset ignored, ``StatelessEncoder`` for what it sends, and the limits advertised in its
SETTINGS enforced from the first byte.
"""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.stream import StreamClosedBy
from hyperframe.frame import RstStreamFrame

from dracpu.grpc.hpack_out import StatelessEncoder

__all__ = ["STREAM_GONE", "ServerH2Connection", "server_h2"]

# What h2 raises when asked to send on a stream it has already closed and forgotten (closed
# streams leave its table; sending on one then looks like opening a new, too-low id).
STREAM_GONE = (h2.exceptions.StreamClosedError, h2.exceptions.StreamIDTooLowError)


def _h2_config() -> h2.config.H2Configuration:
    # Header validation and normalisation cost about a quarter of the CPU of a call
    # (protocols.md 1.13); the few checks gRPC needs are
    # GRPCServerConnection's.
    return h2.config.H2Configuration(
        client_side=False,
        header_encoding=None,
        validate_inbound_headers=False,
        validate_outbound_headers=False,
        normalize_inbound_headers=False,
        normalize_outbound_headers=False,
    )


class ServerH2Connection(h2.connection.H2Connection):
    # h2 remembers how every closed stream was closed, up to 65,536 per connection; the
    # kubelet keeps one connection for all its calls, so that table grew with every call
    # (~2 MB per 10,000 in the soak). Frames for a stream this far in the past are rare.
    MAX_CLOSED_STREAMS = 1024

    def _handle_data_on_closed_stream(
        self,
        events: list[h2.events.Event],
        exc: h2.exceptions.StreamClosedError,
        frame: Any,
    ) -> tuple[list[Any], list[h2.events.Event]]:
        # The rest of a request we refused (a message over the limit, answered early) is
        # still on its way when the client reads our RST_STREAM. RFC 9113 5.1: after
        # sending RST_STREAM an endpoint MUST ignore frames it receives on the stream; h2
        # answers each with another RST_STREAM. Keep the connection's WINDOW_UPDATE (the
        # bytes count against the connection window either way), drop the second reset.
        frames, events = super()._handle_data_on_closed_stream(events, exc, frame)
        if self._stream_closed_by(frame.stream_id) is StreamClosedBy.SEND_RST_STREAM:
            frames = [f for f in frames if not isinstance(f, RstStreamFrame)]
        return frames, events


def server_h2(*, max_concurrent_streams: int, max_header_list_size: int) -> ServerH2Connection:
    """A server-side h2 connection advertising these limits, nothing sent yet."""
    conn = ServerH2Connection(config=_h2_config())
    conn.encoder = StatelessEncoder()
    conn.local_settings = h2.settings.Settings(
        client=False,
        initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max_concurrent_streams,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: max_header_list_size,
        },
    )
    # The decoder enforces the limit from the first byte: a client may send headers
    # before it has seen our SETTINGS.
    conn.decoder.max_header_list_size = max_header_list_size
    return conn
