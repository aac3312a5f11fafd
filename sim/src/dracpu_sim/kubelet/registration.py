"""The kubelet side of plugin registration (protocols.md §2.5): dial the registration
socket with the official ``grpcio`` client, ``GetInfo``, validate, then
``NotifyRegistrationStatus``.

``validate_plugin`` is the pure check; ``fetch_info`` and ``notify`` are blocking grpcio
calls meant for a worker thread. ``scan_registry`` and ``diff_sockets`` find socket files
the way the kubelet's plugin watcher does (dot files and non-sockets ignored, a socket
re-created in place counts as changed).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import grpc

from dracpu.proto.pluginregistration import api_pb2 as reg_pb

__all__ = [
    "DIAL_TIMEOUT",
    "DRA_PLUGIN_TYPE",
    "GET_INFO_TIMEOUT",
    "KUBELET_DRA_SERVICES",
    "NOTIFY_TIMEOUT",
    "PluginRejected",
    "RegistrationCallError",
    "SocketId",
    "diff_sockets",
    "fetch_info",
    "notify",
    "scan_registry",
    "validate_plugin",
]

DRA_PLUGIN_TYPE = "DRAPlugin"
# The DRA services this kubelet speaks (protocols.md §2.4).
KUBELET_DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
DIAL_TIMEOUT = 10.0
GET_INFO_TIMEOUT = 1.0
NOTIFY_TIMEOUT = 5.0
MAX_SOCKET_PATH = 107
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

_GET_INFO = "/pluginregistration.Registration/GetInfo"
_NOTIFY = "/pluginregistration.Registration/NotifyRegistrationStatus"


class PluginRejected(Exception):
    """The kubelet refuses the plugin; ``str()`` is sent back in ``RegistrationStatus.error``."""


class RegistrationCallError(Exception):
    """The registration socket could not be dialled or did not answer ``GetInfo``."""


@dataclass(frozen=True)
class SocketId:
    """A socket file's identity: re-creating the file changes it."""

    inode: int
    mtime_ns: int


def scan_registry(registry_dir: str) -> dict[str, SocketId]:
    """Socket files under ``registry_dir`` (recursively), ignoring names starting with '.'."""
    found: dict[str, SocketId] = {}
    stack = [registry_dir]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue  # removed while scanning, or not there yet
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
            elif stat.S_ISSOCK(st.st_mode):
                found[entry.path] = SocketId(st.st_ino, st.st_mtime_ns)
    return found


def diff_sockets(
    before: Mapping[str, SocketId], after: Mapping[str, SocketId]
) -> tuple[list[str], list[str]]:
    """(sockets to deregister, sockets to register): a changed socket is in both."""
    gone = sorted(p for p in before if p not in after or after[p] != before[p])
    new = sorted(p for p in after if p not in before or after[p] != before[p])
    return gone, new


def validate_plugin(
    info: reg_pb.PluginInfo,
    *,
    socket_path: str,
    kubelet_root: str,
    endpoints_in_use: Collection[str] = (),
) -> tuple[str, str]:
    """(DRA endpoint, chosen service) for an acceptable plugin, else PluginRejected.

    The checks of the kubelet's plugin watcher and DRA handler: the type must be
    ``DRAPlugin``; the name a DNS subdomain of at most 63 characters; the endpoint (the
    registration socket itself when empty) absolute, inside the kubelet root, short enough
    for a socket, an existing socket, and not registered by another plugin; and one of the
    plugin's ``supported_versions``, in the plugin's order, a DRA service this kubelet speaks.
    """
    if info.type != DRA_PLUGIN_TYPE:
        raise PluginRejected(
            f"no handler registered for plugin type: {info.type} at socket {socket_path}"
        )
    name = info.name
    if not name or len(name) > 63 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise PluginRejected(
            f"invalid DRA driver name {name!r}: must be a lower case DNS subdomain "
            "of at most 63 characters"
        )
    endpoint = info.endpoint or socket_path
    root = os.path.abspath(kubelet_root)
    if not os.path.isabs(endpoint):
        raise PluginRejected(f"invalid endpoint {endpoint!r} of plugin {name}: not absolute")
    if os.path.commonpath([root, os.path.abspath(endpoint)]) != root:
        raise PluginRejected(
            f"invalid endpoint {endpoint!r} of plugin {name}: not inside the kubelet "
            f"root directory {root}"
        )
    if len(endpoint.encode()) > MAX_SOCKET_PATH:
        raise PluginRejected(
            f"invalid endpoint {endpoint!r} of plugin {name}: longer than {MAX_SOCKET_PATH} bytes"
        )
    try:
        is_socket = stat.S_ISSOCK(os.stat(endpoint).st_mode)
    except OSError as exc:
        raise PluginRejected(
            f"invalid endpoint {endpoint!r} of plugin {name}: {exc.strerror or exc}"
        ) from None
    if not is_socket:
        raise PluginRejected(f"invalid endpoint {endpoint!r} of plugin {name}: not a socket")
    if endpoint in endpoints_in_use:
        raise PluginRejected(f"endpoint {endpoint} of plugin {name} is already registered")
    versions = list(info.supported_versions)
    if not versions:
        raise PluginRejected(
            f"invalid versions of plugin {name}: empty list of supported gRPC services "
            "(aka supported versions)"
        )
    for service in versions:
        if service in KUBELET_DRA_SERVICES:
            return endpoint, service
    raise PluginRejected(
        f"invalid versions of plugin {name}: none of the supported gRPC services "
        f"{versions} is supported by the kubelet ({list(KUBELET_DRA_SERVICES)})"
    )


def _describe(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'UNKNOWN'}: {details}"


def fetch_info(
    socket_path: str, dial_timeout: float = DIAL_TIMEOUT
) -> tuple[grpc.Channel, reg_pb.PluginInfo]:
    """Dial (10 s) and call ``GetInfo`` (1 s). Blocking; the caller closes the channel."""
    channel = grpc.insecure_channel("unix:" + socket_path)
    try:
        grpc.channel_ready_future(channel).result(timeout=dial_timeout)
    except grpc.FutureTimeoutError:
        channel.close()
        raise RegistrationCallError(
            f"failed to dial socket {socket_path}: no connection within {dial_timeout:g}s"
        ) from None
    get_info = channel.unary_unary(
        _GET_INFO,
        request_serializer=reg_pb.InfoRequest.SerializeToString,
        response_deserializer=reg_pb.PluginInfo.FromString,
    )
    try:
        info: reg_pb.PluginInfo = get_info(reg_pb.InfoRequest(), timeout=GET_INFO_TIMEOUT)
    except grpc.RpcError as exc:
        channel.close()
        raise RegistrationCallError(
            f"failed to get plugin info using RPC GetInfo at socket {socket_path}: {_describe(exc)}"
        ) from None
    return channel, info


def notify(channel: grpc.Channel, registered: bool, error: str = "") -> str | None:
    """``NotifyRegistrationStatus`` (5 s); returns the plugin's error answer, if any.

    A plugin may answer a rejection with an error status (the Go helper does); that is
    expected and only reported back.
    """
    call = channel.unary_unary(
        _NOTIFY,
        request_serializer=reg_pb.RegistrationStatus.SerializeToString,
        response_deserializer=reg_pb.RegistrationStatusResponse.FromString,
    )
    try:
        call(
            reg_pb.RegistrationStatus(plugin_registered=registered, error=error),
            timeout=NOTIFY_TIMEOUT,
        )
    except grpc.RpcError as exc:
        return _describe(exc)
    return None
