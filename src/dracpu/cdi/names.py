"""The CDI names of a prepared claim (behavior.md §8.5, §10.1; protocols.md §7.1).

A claim's CDI device is ``claim-<uid>`` of kind ``dra.k8s.io/cpu``; the kubelet is handed
the fully qualified id ``dra.k8s.io/cpu=claim-<uid>``, and the spec that defines it is
``dra.k8s.io-cpu_claim-<uid>.json``: the vendor and class joined by "-", then "_" and the
device name, as the CDI library names a transient spec (``GenerateTransientSpecName`` in
container-device-interface's pkg/cdi). Pure.
"""

from __future__ import annotations

__all__ = [
    "CDI_CLASS",
    "CDI_KIND",
    "CDI_VENDOR",
    "DEVICE_PREFIX",
    "SPEC_PREFIX",
    "cdi_device_id",
    "cdi_device_name",
]

CDI_VENDOR = "dra.k8s.io"
CDI_CLASS = "cpu"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
DEVICE_PREFIX = "claim-"
SPEC_PREFIX = f"{CDI_VENDOR}-{CDI_CLASS}_"


def cdi_device_name(claim_uid: str) -> str:
    """The claim's device name inside its spec."""
    return f"{DEVICE_PREFIX}{claim_uid}"


def cdi_device_id(claim_uid: str) -> str:
    """The fully qualified CDI device id handed to the kubelet."""
    return f"{CDI_KIND}={cdi_device_name(claim_uid)}"
