"""The kubelet's DRA calls (protocols.md §3) with the official ``grpcio`` client.

``prepare`` and ``unprepare`` block (run them in a worker thread); ``read_prepare`` and
``read_unprepare`` check an answer the way the kubelet does — every requested claim
answered, nothing else — and split it into per-claim devices and errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc

from dracpu.proto.dra.v1 import api_pb2 as dra_v1
from dracpu.proto.dra.v1beta1 import api_pb2 as dra_v1beta1

__all__ = [
    "PREPARE_TIMEOUT",
    "ClaimRef",
    "DRACallError",
    "PreparedDevice",
    "prepare",
    "read_prepare",
    "read_unprepare",
    "unprepare",
]

PREPARE_TIMEOUT = 45.0

_PACKAGES: dict[str, tuple[str, ModuleType]] = {
    "v1.DRAPlugin": ("k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", dra_v1),
    "v1beta1.DRAPlugin": ("k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin", dra_v1beta1),
}


class DRACallError(Exception):
    """A whole NodePrepareResources / NodeUnprepareResources call failed."""


@dataclass(frozen=True, order=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]  # empty: every request of the claim
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


def _call(
    channel: grpc.Channel, service: str, method: str, request: Any, response_type: Any
) -> Any:
    path, _ = _PACKAGES[service]
    try:
        stub = channel.unary_unary(
            f"/{path}/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        return stub(request, timeout=PREPARE_TIMEOUT)
    except ValueError as exc:
        # grpcio raises ValueError on a channel closed meanwhile: the plugin registered
        # again (closing its previous channel) while this call waited for its thread.
        raise DRACallError(f"{method} failed: {exc}") from None
    except grpc.RpcError as exc:
        code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
        details = exc.details() if hasattr(exc, "details") else str(exc)
        raise DRACallError(f"{method} failed: rpc error: code = {code} desc = {details}") from None


def _claims(pb: ModuleType, claims: Sequence[ClaimRef]) -> list[Any]:
    return [pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


def prepare(channel: grpc.Channel, service: str, claims: Sequence[ClaimRef]) -> Any:
    """NodePrepareResources for ``claims`` (blocking); the raw response."""
    _, pb = _PACKAGES[service]
    request = pb.NodePrepareResourcesRequest(claims=_claims(pb, claims))
    return _call(channel, service, "NodePrepareResources", request, pb.NodePrepareResourcesResponse)


def unprepare(channel: grpc.Channel, service: str, claims: Sequence[ClaimRef]) -> Any:
    """NodeUnprepareResources for ``claims`` (blocking); the raw response."""
    _, pb = _PACKAGES[service]
    request = pb.NodeUnprepareResourcesRequest(claims=_claims(pb, claims))
    return _call(
        channel, service, "NodeUnprepareResources", request, pb.NodeUnprepareResourcesResponse
    )


def _check_keys(method: str, claims: Sequence[ClaimRef], answered: Sequence[str]) -> None:
    wanted = {c.uid for c in claims}
    extra = sorted(set(answered) - wanted)
    if extra:
        raise DRACallError(f"{method}: result for unknown claim UID {extra[0]}")
    missing = wanted - set(answered)
    if missing:
        raise DRACallError(f"{method}: left out {len(missing)} claims")


def read_prepare(
    claims: Sequence[ClaimRef], response: Any
) -> tuple[dict[str, list[PreparedDevice]], dict[str, str]]:
    """(devices by claim uid, error by claim uid) of a NodePrepareResources answer."""
    _check_keys("NodePrepareResources", claims, list(response.claims))
    devices: dict[str, list[PreparedDevice]] = {}
    errors: dict[str, str] = {}
    for uid, result in response.claims.items():
        if result.error:
            errors[uid] = result.error
            continue
        devices[uid] = [
            PreparedDevice(
                request_names=tuple(d.request_names),
                pool=d.pool_name,
                device=d.device_name,
                cdi_device_ids=tuple(d.cdi_device_ids),
                share_id=d.share_id if d.HasField("share_id") else None,
            )
            if hasattr(d, "share_id")
            else PreparedDevice(
                tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids)
            )
            for d in result.devices
        ]
    return devices, errors


def read_unprepare(claims: Sequence[ClaimRef], response: Any) -> dict[str, str]:
    """Error by claim uid (empty string: unprepared) of a NodeUnprepareResources answer."""
    _check_keys("NodeUnprepareResources", claims, list(response.claims))
    return {uid: result.error for uid, result in response.claims.items()}
