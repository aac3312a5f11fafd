"""One HTTP request in, one decision out: a complete response, the start of a watch, or
"drop the connection" (an injected fault). Pure: the Trio shell in ``http.py`` does the
I/O. Paths follow the real API server's REST layout (protocols.md §4)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec

from dracpu_sim.apiserver import discovery, errors, openapi, tables
from dracpu_sim.apiserver.apply import APPLY_PATCH, decode_apply_body
from dracpu_sim.apiserver.errors import ApiError, FieldError
from dracpu_sim.apiserver.faults import CallCounter, FaultInjector, RequestLog
from dracpu_sim.apiserver.resources import ResourceType, resource_by_path
from dracpu_sim.apiserver.selectors import (
    FieldSelector,
    LabelSelector,
    parse_field_selector,
    parse_label_selector,
)
from dracpu_sim.apiserver.store import ObjectStore

__all__ = [
    "DropConnection",
    "Handler",
    "Request",
    "Response",
    "Route",
    "WatchStart",
    "parse_route",
]


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    target: str  # path and query, as received
    headers: dict[str, str]  # lower-case names
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class WatchStart:
    """Start a watch stream; the shell registers it with the store."""

    resource: ResourceType
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    resource_version: str | None
    allow_bookmarks: bool
    timeout_seconds: float | None
    send_initial_events: bool
    user_agent: str = ""


@dataclass(frozen=True, slots=True)
class DropConnection:
    """Close the connection without answering (fault injection)."""


@dataclass(frozen=True, slots=True)
class Route:
    verb: str
    resource: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None

    @property
    def counted_resource(self) -> str:
        plural = self.resource.plural
        return f"{plural}/{self.subresource}" if self.subresource else plural


# Fresh instances on every raise: re-raising one module-level exception object grows its
# __traceback__ chain with every request, keeping each request's frames alive.
def _not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def _not_allowed() -> ApiError:
    return ApiError(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        {},
    )


_COLLECTION_VERBS = {"GET": "list", "POST": "create", "DELETE": "deletecollection"}
_ITEM_VERBS = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def parse_route(method: str, path: str, watch: bool) -> Route:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise _not_found()
    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise _not_found()
    resource = resource_by_path(group, version, rest[0])
    if resource is None or (namespace is not None and not resource.namespaced):
        raise _not_found()
    name = rest[1] if len(rest) >= 2 else None
    subresource = rest[2] if len(rest) == 3 else None
    if subresource == "binding" and resource.plural == "pods":
        # The scheduler's path: POST a Binding, nothing else.
        if method != "POST":
            raise _not_allowed()
        return Route("create", resource, namespace, name, subresource)
    if subresource is not None and (subresource != "status" or not resource.has_status):
        raise _not_found()
    if name is None:
        verb = _COLLECTION_VERBS.get(method)
        if verb == "list" and watch:
            verb = "watch"
        if verb in ("create", "deletecollection") and resource.namespaced and namespace is None:
            raise _not_allowed()
    else:
        verb = _ITEM_VERBS.get(method)
        if subresource is not None and verb == "delete":
            raise _not_allowed()
    if verb is None:
        raise _not_allowed()
    return Route(verb, resource, namespace, name, subresource)


def _json(status: int, value: Any, extra: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(
        status, msgspec.json.encode(value), (("content-type", "application/json"), *extra)
    )


def error_response(err: ApiError) -> Response:
    extra = (("retry-after", str(err.retry_after)),) if err.retry_after is not None else ()
    return _json(err.code, err.status(), extra)


def _truthy(value: str | None) -> bool:
    return value in ("true", "1", "True")


class Handler:
    """``clock`` (seconds, monotonic) times the rate limit and the request log;
    ``requests``, when set, logs every request that names a resource; ``wall_clock``
    (seconds since the epoch) gives the ages in a Table."""

    def __init__(
        self,
        store: ObjectStore,
        faults: FaultInjector,
        counter: CallCounter,
        server_address: str = "127.0.0.1:0",
        *,
        clock: Callable[[], float] = time.monotonic,
        requests: RequestLog | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.faults = faults
        self.counter = counter
        self.server_address = server_address
        self.clock = clock
        self.requests = requests
        self.wall_clock = wall_clock  # pods' ages in a Table

    def handle(self, request: Request) -> Response | WatchStart | DropConnection:
        try:
            split = urlsplit(request.target)
            query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        except ValueError as exc:  # e.g. an unbalanced "[" read as an IPv6 host
            return error_response(errors.bad_request(f"invalid request target: {exc}"))
        try:
            found = self._discovery(request.method, split.path)
            if found is not None:
                return _json(200, found)
            route = parse_route(request.method, split.path, _truthy(query.get("watch")))
        except ApiError as err:
            return error_response(err)
        self.counter.record(route.verb, route.counted_resource)
        agent = request.headers.get("user-agent", "")
        result = self._answer(route, request, query, agent)
        if self.requests is not None:
            if isinstance(result, Response):
                status, size = result.status, len(result.body)
            else:
                status, size = (200 if isinstance(result, WatchStart) else 0), 0
            self.requests.record(
                self.clock(), route.verb, route.counted_resource, agent, status, size
            )
        return result

    def _answer(
        self, route: Route, request: Request, query: dict[str, str], agent: str
    ) -> Response | WatchStart | DropConnection:
        retry_after = self.faults.throttle(self.clock())
        if retry_after is not None:
            return error_response(
                ApiError(
                    429,
                    "TooManyRequests",
                    _fault_message(429),
                    {"retryAfterSeconds": retry_after},
                    retry_after=retry_after,
                )
            )
        fault = self.faults.take(route.verb, route.counted_resource)
        if fault is not None:
            if fault.drop_connection:
                return DropConnection()
            return error_response(
                errors.status_for_code(fault.status, fault.message or _fault_message(fault.status))
            )
        try:
            result = self._dispatch(route, request, query)
        except ApiError as err:
            return error_response(err)
        if isinstance(result, WatchStart) and agent:
            result = dataclasses.replace(result, user_agent=agent)
        return result

    def _discovery(self, method: str, path: str) -> dict[str, Any] | None:
        path = path.rstrip("/") or "/"
        parts = [p for p in path.split("/") if p]
        if method != "GET":
            return None
        doc: dict[str, Any] | None = None
        if path == "/version":
            doc = discovery.version_info()
        elif path == "/api":
            doc = discovery.api_versions(self.server_address)
        elif path == "/apis":
            doc = discovery.api_group_list()
        elif len(parts) == 2 and parts[0] == "api":
            doc = discovery.api_resource_list("", parts[1])
        elif len(parts) == 2 and parts[0] == "apis":
            doc = discovery.api_group(parts[1])
        elif len(parts) == 3 and parts[0] == "apis":
            doc = discovery.api_resource_list(parts[1], parts[2])
        elif openapi.is_openapi_path(path):
            doc = openapi.document(path)
        else:
            return None
        if doc is None:
            raise _not_found()
        return doc

    def _dispatch(
        self, route: Route, request: Request, query: dict[str, str]
    ) -> Response | WatchStart:
        store, r, ns = self.store, route.resource, route.namespace
        if route.verb in ("list", "watch", "deletecollection"):
            labels = parse_label_selector(query.get("labelSelector", ""))
            fields = parse_field_selector(query.get("fieldSelector", ""), r.field_labels)
            if route.verb == "watch":
                return self._watch(route, query, labels, fields)
            if route.verb == "deletecollection":
                return _json(200, store.delete_collection(r, ns, labels, fields))
            listed = store.list(
                r,
                ns,
                labels,
                fields,
                resource_version=query.get("resourceVersion"),
                resource_version_match=query.get("resourceVersionMatch"),
                limit=_int_param(query, "limit"),
                continue_token=query.get("continue") or None,
            )
            table = self._table(route, request, query, listed["items"], listed["metadata"])
            return table or _json(200, listed)
        content_type = request.headers.get("content-type", "").split(";")[0].strip()
        _check_write_options(route.verb, content_type, query)
        if route.verb == "create" and route.subresource == "binding":
            assert route.name is not None
            return _json(201, store.bind(ns, route.name, _decode(request.body)))
        validation = query.get("fieldValidation", "")
        if route.verb in ("create", "update") and validation == "Strict":
            openapi.check_strict(r, _decode(request.body))
        if route.verb == "create":
            return _json(201, store.create(r, ns, _decode(request.body)))
        assert route.name is not None
        if route.verb == "get":
            got = store.get(r, ns, route.name)
            return self._table(route, request, query, [got], {}) or _json(200, got)
        if route.verb == "update":
            return _json(
                200,
                store.update(
                    r, ns, route.name, _decode(request.body), subresource=route.subresource
                ),
            )
        if route.verb == "patch" and content_type == APPLY_PATCH:
            applied, status = store.apply(
                r,
                ns,
                route.name,
                decode_apply_body(request.body),
                manager=query["fieldManager"],
                subresource=route.subresource,
            )
            return _json(status, applied)
        if route.verb == "patch":
            return _json(
                200,
                store.patch(
                    r,
                    ns,
                    route.name,
                    content_type,
                    _decode(request.body),
                    subresource=route.subresource,
                    field_validation=validation,
                ),
            )
        options = _decode(request.body) if request.body.strip() else {}
        if not isinstance(options, dict):
            raise errors.bad_request("the body of the request was in an unknown format")
        grace = _int_param(query, "gracePeriodSeconds")
        if grace is not None:
            options["gracePeriodSeconds"] = grace
        body, status = store.delete(r, ns, route.name, options)
        return _json(status, body)

    def _table(
        self,
        route: Route,
        request: Request,
        query: dict[str, str],
        items: list[Any],
        list_metadata: dict[str, Any],
    ) -> Response | None:
        """The pods as a ``meta.k8s.io`` Table when the client asks for one (kubectl get);
        None for plain JSON (other kinds too: kubectl then prints NAME and AGE itself)."""
        version = tables.table_version(request.headers.get("accept", ""))
        if version is None or route.resource.plural != "pods":
            return None
        include = query.get("includeObject") or "Metadata"
        if include not in ("None", "Metadata", "Object"):
            raise errors.bad_request(
                f'includeObject: Unsupported value: "{include}": supported values: '
                '"None", "Metadata", "Object"'
            )
        doc = tables.pod_table(
            items,
            now=self.wall_clock(),
            version=version,
            include_object=include,
            list_metadata=list_metadata,
        )
        content_type = f"application/json;as=Table;v={version};g=meta.k8s.io"
        return Response(200, msgspec.json.encode(doc), (("content-type", content_type),))

    def _watch(
        self, route: Route, query: dict[str, str], labels: LabelSelector, fields: FieldSelector
    ) -> WatchStart:
        timeout = _int_param(query, "timeoutSeconds")
        return WatchStart(
            resource=route.resource,
            namespace=route.namespace,
            labels=labels,
            fields=fields,
            resource_version=query.get("resourceVersion"),
            allow_bookmarks=_truthy(query.get("allowWatchBookmarks")),
            timeout_seconds=float(timeout) if timeout else None,
            send_initial_events=_truthy(query.get("sendInitialEvents")),
        )


_OPTIONS_KINDS = {"create": "CreateOptions", "update": "UpdateOptions", "patch": "PatchOptions"}
# allowedFieldValidationValues, sorted as sets.String.List() gives them
# (apimachinery pkg/apis/meta/v1/validation/validation.go ValidateFieldValidation).
_FIELD_VALIDATION_VALUES = ("", "Ignore", "Strict", "Warn")


def _check_write_options(verb: str, content_type: str, query: dict[str, str]) -> None:
    """The query options of a write, as ValidateCreateOptions / ValidateUpdateOptions /
    ValidatePatchOptions check them: 422 ``<Kind>Options.meta.k8s.io "" is invalid``."""
    kind = _OPTIONS_KINDS.get(verb)
    if kind is None:
        return
    problems: list[FieldError] = []
    if verb == "patch" and content_type == APPLY_PATCH:
        if not query.get("fieldManager"):
            problems.append(
                FieldError(
                    "FieldValueRequired",
                    "fieldManager",
                    "Required value: is required for apply patch",
                )
            )
    elif verb == "patch" and "force" in query:
        problems.append(
            FieldError(
                "FieldValueForbidden",
                "force",
                "Forbidden: may not be specified for non-apply patch",
            )
        )
    validation = query.get("fieldValidation", "")
    if validation not in _FIELD_VALIDATION_VALUES:
        supported = ", ".join(f'"{v}"' for v in _FIELD_VALIDATION_VALUES)
        problems.append(
            FieldError(
                "FieldValueNotSupported",
                "fieldValidation",
                f"Unsupported value: {errors.go_quote(validation)}: supported values: {supported}",
            )
        )
    if problems:
        raise errors.invalid(kind, "meta.k8s.io", "", problems)


def _fault_message(status: int) -> str:
    if status == 429:
        return "Too many requests, please try again later."
    if status == 503:
        return "the server is currently unable to handle the request"
    return "Internal error occurred: injected fault"


def _int_param(query: dict[str, str], name: str) -> int | None:
    raw = query.get(name)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise errors.bad_request(f"invalid value for {name}: {raw!r}") from None


def _decode(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise errors.bad_request(
            f"the body of the request was in an unknown format: {exc}"
        ) from None
    except RecursionError:
        raise errors.bad_request(
            "the body of the request was in an unknown format: JSON nested too deeply"
        ) from None
