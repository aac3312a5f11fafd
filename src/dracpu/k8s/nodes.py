"""Node lookup: the node's UID, for the ownerReferences of our ResourceSlices."""

from __future__ import annotations

import msgspec

from dracpu.k8s.client import K8sError, KubeClient

__all__ = ["NodeLookupError", "get_node_uid"]


class NodeLookupError(K8sError):
    """The node could not be read, or its answer has no UID."""


class _Meta(msgspec.Struct):
    uid: str = ""


class _Node(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


_decoder = msgspec.json.Decoder(_Node)


async def get_node_uid(api: KubeClient, name: str) -> str:
    """GET ``/api/v1/nodes/<name>`` and return ``metadata.uid``. A failed GET keeps its
    ``K8sError`` class (``NotFound`` stays ``NotFound``) with ``get node <name>: `` in
    front of the message.

    The GET goes through ``KubeClient.get_raw``: the generated ``CoreV1Api`` would cost the
    daemon ~0.4 s of start-up and ~20 MB for this one call."""
    try:
        raw = await api.get_raw("/api/v1/nodes/{name}", name=name)
    except K8sError as exc:
        raise type(exc)(f"get node {name}: {exc}", status=exc.status, reason=exc.reason) from exc
    try:
        uid = _decoder.decode(raw).metadata.uid
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise NodeLookupError(f"get node {name}: decode: {exc}") from exc
    if not uid:
        raise NodeLookupError(f"get node {name}: the node has no metadata.uid")
    return uid
