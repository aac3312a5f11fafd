"""dracpu.k8s.names: the API server's DNS-1123 rules, bounded whatever the input."""

from __future__ import annotations

import pytest

from dracpu.k8s.names import is_dns1123_label, is_dns1123_subdomain, shorten


@pytest.mark.parametrize(
    ("text", "label", "subdomain"),
    [
        ("a", True, True),
        ("web-1", True, True),
        ("a.b-c.d", False, True),
        ("a.-b", False, False),  # each dot-separated part is a label (apimachinery)
        ("a-.b", False, False),
        ("a..b", False, False),
        ("-a", False, False),
        ("A", False, False),
        ("a_b", False, False),
        ("", False, False),
        ("a" * 63, True, True),
        ("a" * 64, False, True),
        ("a" * 253, False, True),
        ("a" * 254, False, False),
        ("a" * (4 << 20), False, False),
    ],
)
def test_dns1123_names(text: str, label: bool, subdomain: bool) -> None:
    assert is_dns1123_label(text) is label
    assert is_dns1123_subdomain(text) is subdomain


def test_shorten() -> None:
    assert shorten("web") == "web"
    assert shorten("x" * 100) == "x" * 64 + "...(100 characters)"
