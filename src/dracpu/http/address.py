"""``--bind-address`` / ``--debug-address`` parsing with Go's ``host:port`` rules.

``":8080"`` listens on every interface (host ``""``), ``"127.0.0.1:0"`` on an ephemeral
port, ``"[::1]:8080"`` on an IPv6 address. Messages follow Go's ``net.SplitHostPort``.
"""

from __future__ import annotations

from dracpu.gofmt import go_quote

__all__ = ["BindAddressError", "format_bind_address", "parse_bind_address"]


class BindAddressError(ValueError):
    """A listen address that cannot be used, with the reason."""


def _fail(address: str, why: str) -> BindAddressError:
    return BindAddressError(f"invalid bind address {go_quote(address)}: {why}")


def _split_host_port(address: str) -> tuple[str, str]:
    colon = address.rfind(":")
    if colon < 0:
        raise _fail(address, "missing port in address")
    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise _fail(address, "missing ']' in address")
        if end + 1 == len(address):
            raise _fail(address, "missing port in address")
        if end + 1 != colon:
            # Either "]" is not followed by ":" or there are more colons after it.
            if address[end + 1] == ":":
                raise _fail(address, "too many colons in address")
            raise _fail(address, "missing port in address")
        host = address[1:end]
        if "[" in host:
            raise _fail(address, "unexpected '[' in address")
    else:
        host = address[:colon]
        if ":" in host:
            raise _fail(address, "too many colons in address")
        if "[" in host:
            raise _fail(address, "unexpected '[' in address")
        if "]" in host:
            raise _fail(address, "unexpected ']' in address")
    port = address[colon + 1 :]
    if "[" in port:
        raise _fail(address, "unexpected '[' in address")
    if "]" in port:
        raise _fail(address, "unexpected ']' in address")
    return host, port


def parse_bind_address(address: str) -> tuple[str, int]:
    """``host:port`` → ``(host, port)``; host ``""`` means every interface."""
    host, port_text = _split_host_port(address)
    if not port_text:
        raise _fail(address, "missing port in address")
    if not port_text.isascii() or not port_text.isdigit():
        raise _fail(address, f"port {go_quote(port_text)} is not a number")
    port = int(port_text)
    if port > 65535:
        raise _fail(address, f"port {port} is out of range (0-65535)")
    if any(ch.isspace() for ch in host):
        raise _fail(address, f"host {go_quote(host)} contains white space")
    return host, port


def format_bind_address(host: str, port: int) -> str:
    """The inverse of ``parse_bind_address`` (brackets around IPv6 hosts)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
