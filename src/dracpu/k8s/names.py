"""What the API server accepts as names (apimachinery ``pkg/util/validation``): a namespace
and a request name are DNS-1123 labels, a ResourceClaim's name a DNS-1123 subdomain.
Anything else did not come from a real object. Pure; lengths are checked before any
pattern, so the work is bounded whatever the input's size."""

from __future__ import annotations

import re

__all__ = [
    "LABEL_MAX",
    "LABEL_SHAPE",
    "SUBDOMAIN_MAX",
    "SUBDOMAIN_SHAPE",
    "is_dns1123_label",
    "is_dns1123_subdomain",
    "shorten",
]

LABEL_MAX = 63
SUBDOMAIN_MAX = 253
_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")
# The API server's own wording (IsDNS1123Label, IsDNS1123Subdomain).
LABEL_SHAPE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
    "'-', and must start and end with an alphanumeric character"
)
SUBDOMAIN_SHAPE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character"
)


def is_dns1123_label(text: str) -> bool:
    return len(text) <= LABEL_MAX and _LABEL.fullmatch(text) is not None


def is_dns1123_subdomain(text: str) -> bool:
    return len(text) <= SUBDOMAIN_MAX and _SUBDOMAIN.fullmatch(text) is not None


_SHOWN = 64


def shorten(text: str) -> str:
    """A name as a message may quote it: a long one (hostile) cut, with its length."""
    if len(text) <= _SHOWN:
        return text
    return f"{text[:_SHOWN]}...({len(text)} characters)"
