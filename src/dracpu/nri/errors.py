"""Errors raised by the NRI wire codecs (the multiplexer and ttrpc).

Every failure of the sans-IO codecs is a `ProtocolError`. Once a connection object has raised
one, its byte stream can no longer be trusted: the shell closes the socket and reconnects.
Peer mistakes that ttrpc answers on the wire (a reused stream id, an undecodable request, an
oversized frame; protocols.md 5.2-5.4) are *not* raised: they become events and replies.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """The peer (or our own caller) broke the NRI wire protocol."""


class MuxProtocolError(ProtocolError):
    """A malformed multiplexer frame, or a bad connection id."""


class FrameTooLarge(ProtocolError):
    """A ttrpc frame whose data would exceed the 4 MiB limit."""


class InvalidStreamId(ProtocolError):
    """A stream id that is not valid for this use (unknown, finished, or exhausted)."""


class UnknownMessageType(ProtocolError):
    """A ttrpc message type this side of the connection does not accept."""


class MalformedMessage(ProtocolError):
    """Bytes that do not decode as the ttrpc envelope they claim to be."""


class ConnectionBroken(ProtocolError):
    """The connection object was used after it had already failed or seen EOF."""
