"""The official ``kubernetes`` client, called from Trio.

Every call runs in a worker thread (``trio.to_thread.run_sync``) under one bounded
``CapacityLimiter``, and every failure leaves as a ``K8sError``: the kubernetes and
urllib3 exception types stop at this boundary.

The generated API classes (``CoreV1Api``, ``ResourceV1Api``) are built on first use: with
the pydantic-based client, importing ``CoreV1Api`` builds some 300 model classes (about
0.4 s and 20 MB) that a caller reading one object as raw JSON never needs; ``get_raw``
does such a read with the same configuration (auth, TLS, retries), on the event loop
(``k8s.loopget``) where it can, else through the ``ApiClient`` in a worker thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import trio
import urllib3.exceptions
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.util.retry import Retry

from dracpu.k8s.errors import (
    ConfigError,
    Conflict,
    ConnectionFailed,
    Gone,
    Invalid,
    K8sError,
    NotFound,
    ServerError,
    TooManyRequests,
    error_for_status,
    status_fields,
)
from dracpu.k8s.loopget import LoopGetter

__all__ = [
    "Conflict",
    "ConnectionFailed",
    "Gone",
    "Invalid",
    "K8sError",
    "KubeClient",
    "NotFound",
    "ServerError",
    "TooManyRequests",
    "load_api_client",
    "translate_error",
    "transport_retry",
]

T = TypeVar("T")

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _retry_after(exc: ApiException) -> float | None:
    """The ``Retry-After`` header in seconds; None when absent, not a number of seconds
    (an HTTP date is not honoured, as in client-go) or negative."""
    headers = exc.headers or {}
    raw = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        value = float(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def translate_error(exc: BaseException) -> K8sError:
    """Map a kubernetes / urllib3 exception onto the ``K8sError`` hierarchy."""
    if isinstance(exc, K8sError):
        return exc
    if isinstance(exc, ApiException):
        code = int(exc.status or 0)
        message, reason = status_fields(exc.body)
        if not message:
            message = f"({code}) {exc.reason or 'error'}"
        if code == 0:
            return ConnectionFailed(message, status=None, reason=reason)
        return error_for_status(code, message, reason, _retry_after(exc))
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return ConnectionFailed(f"connection to the API server failed: {exc}")
    if isinstance(exc, ConfigException):
        return ConfigError(f"kubernetes client configuration: {exc}")
    return K8sError(f"{type(exc).__name__}: {exc}")


def _bypass_proxy_for_loopback(configuration: k8s_client.Configuration) -> None:
    # A proxy from HTTP(S)_PROXY would swallow loopback traffic (the simulated API
    # server); a proxy the kubeconfig names explicitly is kept.
    host = urlsplit(configuration.host).hostname or ""
    if host in _LOOPBACK:
        configuration.proxy = None


def transport_retry() -> Retry:
    """urllib3's retry policy for our clients: a failed connect, or a dropped connection
    on an idempotent request, is retried at once (a stale pooled connection is routine);
    HTTP answers are never retried and never slept on in the worker thread. 429/5xx and
    their ``Retry-After`` reach the caller, whose backoff runs on Trio's clock."""
    return Retry(
        total=3,
        redirect=0,
        status_forcelist=(),
        respect_retry_after_header=False,
        backoff_factor=0,
        raise_on_status=False,
    )


def load_api_client(
    kubeconfig: str | None, *, context: str | None = None, retries: int | Retry | None = None
) -> k8s_client.ApiClient:
    """An ``ApiClient`` from a kubeconfig file, or in-cluster when ``kubeconfig`` is None.

    ``retries`` is urllib3's policy; None means ``transport_retry()``."""
    configuration = k8s_client.Configuration()
    try:
        if kubeconfig is None:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
    except (ConfigException, OSError, ValueError) as exc:
        where = "in-cluster config" if kubeconfig is None else f"kubeconfig {kubeconfig}"
        raise ConfigError(f"load {where}: {exc}") from exc
    _bypass_proxy_for_loopback(configuration)
    configuration.retries = transport_retry() if retries is None else retries
    return k8s_client.ApiClient(configuration)


class KubeClient:
    """Trio-side access to one ``ApiClient``. Constructing it does no I/O."""

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        *,
        max_concurrent_calls: int = 4,
        request_timeout: float = 30.0,
        loop_get: bool = True,
    ) -> None:
        self.api_client = api_client
        self.limiter = trio.CapacityLimiter(max_concurrent_calls)
        self.request_timeout = request_timeout
        # get_raw on the event loop when the configuration allows (k8s/loopget.py).
        configuration = api_client.configuration
        self.loop_getter: LoopGetter | None = None
        if loop_get and not LoopGetter.unsupported(configuration):
            self.loop_getter = LoopGetter(configuration, user_agent=api_client.user_agent)
        self._core: k8s_client.CoreV1Api | None = None
        self._resource: k8s_client.ResourceV1Api | None = None

    @property
    def core(self) -> k8s_client.CoreV1Api:
        """The generated core/v1 API, imported and built on first use."""
        if self._core is None:
            self._core = k8s_client.CoreV1Api(self.api_client)
        return self._core

    @property
    def resource(self) -> k8s_client.ResourceV1Api:
        """The generated resource.k8s.io/v1 API, imported and built on first use."""
        if self._resource is None:
            self._resource = k8s_client.ResourceV1Api(self.api_client)
        return self._resource

    @classmethod
    def from_kubeconfig(cls, path: str | None, **kwargs: Any) -> KubeClient:
        """``path=None`` means in-cluster configuration."""
        return cls(load_api_client(path), **kwargs)

    @property
    def host(self) -> str:
        return str(self.api_client.configuration.host)

    async def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` (a generated API method) in a worker thread."""
        kwargs.setdefault("_request_timeout", self.request_timeout)
        try:
            # abandon_on_cancel: shutdown must not wait for a slow HTTP call; the thread
            # finishes on its own and its result is dropped.
            return await trio.to_thread.run_sync(
                partial(fn, *args, **kwargs), limiter=self.limiter, abandon_on_cancel=True
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise translate_error(exc) from exc

    async def call_raw(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> bytes:
        """Like ``call`` but returns the response body unparsed (no model objects), for
        callers that decode it into their own typed Structs."""
        kwargs["_preload_content"] = False

        def run() -> bytes:
            response = fn(*args, **kwargs)
            try:
                return bytes(response.data)
            finally:
                response.release_conn()

        kwargs.setdefault("_request_timeout", self.request_timeout)
        try:
            return await trio.to_thread.run_sync(run, limiter=self.limiter, abandon_on_cancel=True)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise translate_error(exc) from exc

    async def get_raw(self, resource_path: str, **path_params: str) -> bytes:
        """GET one object as raw JSON, without the generated API classes:
        ``get_raw("/api/v1/nodes/{name}", name=node)``. Path parameters are
        percent-encoded; a non-2xx answer raises the matching ``K8sError``.

        On the event loop (``LoopGetter``, same configuration, auth, TLS, retries and
        errors) unless the configuration needs the client's own transport (a proxy),
        else through the ``ApiClient`` in a worker thread. Either way at most
        ``max_concurrent_calls`` at once, under the same limiter as every other call."""
        path = resource_path.format(**{k: quote(v, safe="") for k, v in path_params.items()})
        if self.loop_getter is not None:
            async with self.limiter:
                return await self.loop_getter.get(path, timeout=self.request_timeout)
        return await self._get_raw_in_thread(path)

    async def _get_raw_in_thread(self, path: str) -> bytes:
        api = self.api_client
        timeout = self.request_timeout

        def run() -> bytes:
            method, url, headers, body, post_params = api.param_serialize(
                method="GET",
                resource_path=path,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = api.call_api(
                method, url, headers, body, post_params, _request_timeout=timeout
            )
            data = bytes(response.read())  # type: ignore[no-untyped-call]
            if not 200 <= response.status <= 299:
                raise ApiException.from_response(http_resp=response, body=None, data=None)
            return data

        try:
            return await trio.to_thread.run_sync(run, limiter=self.limiter, abandon_on_cancel=True)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise translate_error(exc) from exc

    def close(self) -> None:
        if self.loop_getter is not None:
            self.loop_getter.close()
        self.api_client.close()  # type: ignore[no-untyped-call]
