"""--bind-address parsing with Go's host:port rules."""

from __future__ import annotations

import pytest

from dracpu.http import BindAddressError, format_bind_address, parse_bind_address


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":8080", ("", 8080)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:8080", ("::1", 8080)),
        ("[::]:9", ("::", 9)),
        ("localhost:65535", ("localhost", 65535)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
        ("[fe80::1%eth0]:8080", ("fe80::1%eth0", 8080)),
    ],
)
def test_good_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_bind_address(text) == expected
    assert parse_bind_address(format_bind_address(*expected)) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "missing port in address"),
        ("8080", "missing port in address"),
        ("localhost", "missing port in address"),
        ("127.0.0.1:", "missing port in address"),
        ("::1:8080", "too many colons in address"),
        ("[::1]", "missing port in address"),
        ("[::1]8080", "missing port in address"),
        ("[::1]:80:80", "too many colons in address"),
        ("[::1:8080", "missing ']' in address"),
        ("a[b:80", "unexpected '[' in address"),
        ("a]b:80", "unexpected ']' in address"),
        (":http", 'port "http" is not a number'),
        (":-1", 'port "-1" is not a number'),
        (":8o80", 'port "8o80" is not a number'),
        (":\uff18\uff10", 'port "\uff18\uff10" is not a number'),  # full-width digits
        (":65536", "port 65536 is out of range (0-65535)"),
        ("my host:80", 'host "my host" contains white space'),
    ],
)
def test_bad_addresses(text: str, why: str) -> None:
    with pytest.raises(BindAddressError) as info:
        parse_bind_address(text)
    assert str(info.value) == f'invalid bind address "{text}": {why}'
