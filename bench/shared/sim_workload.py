"""The objects the simulated-node benches create: claim ``c<i>`` asking for ``count`` dra.cpu
devices, and pod ``p<i>`` whose one container holds it."""

from __future__ import annotations

from typing import Any


def claim(i: int, count: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"c{i}", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "cpus", "exactly": {"deviceClassName": "dra.cpu", "count": count}}
                ]
            }
        },
    }


def pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{i}", "namespace": "default"},
        "spec": {
            "resourceClaims": [{"name": "c", "resourceClaimName": f"c{i}"}],
            "containers": [{"name": "app", "resources": {"claims": [{"name": "c"}]}}],
        },
    }
