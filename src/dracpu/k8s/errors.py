"""The ``K8sError`` hierarchy: every failed API call, whichever transport made it
(``k8s.client``'s kubernetes client in a worker thread, ``k8s.loopget`` on the event loop).
"""

from __future__ import annotations

import json

__all__ = [
    "ConfigError",
    "Conflict",
    "ConnectionFailed",
    "Gone",
    "Invalid",
    "K8sError",
    "NotFound",
    "ServerError",
    "TooManyRequests",
    "error_for_status",
    "status_fields",
]


class K8sError(Exception):
    """A failed API call. ``str()`` is the server's Status message when it sent one.

    ``retry_after`` is the server's ``Retry-After`` in seconds when it sent one with a 429
    or a 5xx answer (the codes client-go's ``checkWait`` honours it for), else None."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str = "",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.retry_after = retry_after


class NotFound(K8sError):
    pass


class Conflict(K8sError):
    """409: a stale resourceVersion (reason Conflict) or an existing name (AlreadyExists)."""


class Gone(K8sError):
    """410: the requested resourceVersion is older than the server keeps."""


class Invalid(K8sError):
    """422: the object failed validation."""


class TooManyRequests(K8sError):
    def __init__(
        self,
        message: str,
        *,
        status: int | None = 429,
        reason: str = "",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status=status, reason=reason, retry_after=retry_after)


class ServerError(K8sError):
    """5xx."""


class ConnectionFailed(K8sError):
    """No HTTP answer at all: refused, reset, timed out, dropped."""


class ConfigError(K8sError):
    """The kubeconfig or in-cluster environment cannot be used."""


def status_fields(body: str | bytes | None) -> tuple[str, str]:
    """(message, reason) of a Status body, or ("", "") when it is not one."""
    if not body:
        return "", ""
    try:
        data = json.loads(body)
    except (ValueError, TypeError):
        return "", ""
    if not isinstance(data, dict) or data.get("kind") != "Status":
        return "", ""
    return str(data.get("message", "")), str(data.get("reason", ""))


def error_for_status(code: int, message: str, reason: str, retry_after: float | None) -> K8sError:
    """The ``K8sError`` subclass for an HTTP answer ``code`` (not 2xx). ``retry_after``
    is kept for 429 and 5xx only, the codes client-go's ``checkWait`` honours it for."""
    if code == 404:
        return NotFound(message, status=code, reason=reason)
    if code == 409:
        return Conflict(message, status=code, reason=reason)
    if code == 410:
        return Gone(message, status=code, reason=reason)
    if code == 422:
        return Invalid(message, status=code, reason=reason)
    if code == 429:
        return TooManyRequests(message, status=code, reason=reason, retry_after=retry_after)
    if code >= 500:
        return ServerError(message, status=code, reason=reason, retry_after=retry_after)
    return K8sError(message, status=code, reason=reason)
