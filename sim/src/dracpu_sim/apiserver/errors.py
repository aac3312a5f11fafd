"""API errors as the real API server words them, and their ``Status`` bodies."""

from __future__ import annotations

import json
from typing import Any

from dracpu.gofmt import go_quote

__all__ = [
    "ApiError",
    "FieldError",
    "already_exists",
    "bad_request",
    "bad_value",
    "conflict",
    "go_format",
    "go_quote",
    "gone",
    "internal",
    "invalid",
    "invalid_patch",
    "not_found",
    "status_for_code",
]

# HTTP code -> Status reason, for the codes the simulator produces.
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class FieldError:
    """One field error of a 422 ``Invalid`` answer (Go's ``field.Error``)."""

    __slots__ = ("field", "message", "reason")

    def __init__(self, reason: str, field: str, message: str) -> None:
        self.reason = reason
        self.field = field
        self.message = message

    def render(self) -> str:
        return f"{self.field}: {self.message}"

    def cause(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}

    def __repr__(self) -> str:
        return f"FieldError({self.reason!r}, {self.render()!r})"


class ApiError(Exception):
    """A failed request; ``status()`` is the JSON body the real server would send."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.retry_after = retry_after

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:  # Go omits an empty reason (StatusReasonUnknown)
            body["reason"] = self.reason
        if self.details:
            body["details"] = self.details
        body["code"] = self.code
        return body


def _details(name: str, group: str, kind: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    return details


def _qualified(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{_qualified(plural, group)} "{name}" not found',
        _details(name, group, plural),
    )


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{_qualified(plural, group)} "{name}" already exists',
        _details(name, group, plural),
    )


def conflict(plural: str, group: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": {why}',
        _details(name, group, plural),
    )


STALE_OBJECT = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> ApiError:
    rendered = [e.render() for e in errors]
    summary = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    details = _details(name, group, kind)
    details["causes"] = [e.cause() for e in errors]
    return ApiError(
        422,
        "Invalid",
        f"{kind}.{group or ''}".rstrip(".") + f' "{name}" is invalid: {summary}',
        details,
    )


def invalid_patch(patched: str, detail: str) -> ApiError:
    """A patch whose result the server cannot take: ``errors.NewInvalid`` with an empty
    GroupKind and name and one ``patch`` error holding the patched document (apiserver
    pkg/endpoints/handlers/patch.go), hence the message's leading `` "" is invalid``."""
    cause = FieldError(
        "FieldValueInvalid", "patch", f"Invalid value: {go_quote(patched)}: {detail}"
    )
    return ApiError(
        422, "Invalid", f' "" is invalid: {cause.render()}', {"causes": [cause.cause()]}
    )


def internal(message: str) -> ApiError:
    """An error the real server did not wrap in a Status: 500 with no reason
    (``ErrorToAPIStatus`` in apiserver pkg/endpoints/handlers/responsewriters/status.go)."""
    return ApiError(500, "", message)


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def status_for_code(code: int, message: str) -> ApiError:
    """An error for an injected fault or a generic failure with this HTTP code."""
    retry_after = 1 if code == 429 else None
    details: dict[str, Any] | None = {"retryAfterSeconds": 1} if code == 429 else None
    return ApiError(code, _REASONS.get(code, "Unknown"), message, details, retry_after=retry_after)


def bad_value(value: Any) -> str:
    """A bad value in a field error as a v1.34 server prints it (field.Error.ErrorBody):
    strings quoted, numbers and booleans bare, null as ``null``, anything else as JSON
    (kubernetes/kubernetes#132314)."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return go_quote(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def go_format(value: Any) -> str:
    """Go's ``%+v`` of a decoded JSON value (map[string]interface{} and friends): maps as
    ``map[k:v ...]`` with sorted keys, lists as ``[a b]``, strings bare, null as
    ``<nil>``."""
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_format(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, list):
        return "[" + " ".join(go_format(v) for v in value) + "]"
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
