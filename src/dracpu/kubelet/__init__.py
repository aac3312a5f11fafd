"""The kubelet-facing services: registration, DRA v1/v1beta1 prepare and unprepare, and
the device health stream, served on the kubelet's unix sockets by ``KubeletPlugin``."""

from __future__ import annotations

from dracpu.kubelet.claims import ApiClaimSource, ClaimSource, MemoryClaimSource
from dracpu.kubelet.dra import (
    ClaimPrepareResult,
    ClaimRef,
    ClaimUnprepareResult,
    DRAService,
    PreparedDeviceReply,
)
from dracpu.kubelet.health import HealthReport, HealthService
from dracpu.kubelet.plugin import KubeletPlugin
from dracpu.kubelet.registration import (
    SUPPORTED_VERSIONS,
    RegistrationError,
    RegistrationService,
)

__all__ = [
    "SUPPORTED_VERSIONS",
    "ApiClaimSource",
    "ClaimPrepareResult",
    "ClaimRef",
    "ClaimSource",
    "ClaimUnprepareResult",
    "DRAService",
    "HealthReport",
    "HealthService",
    "KubeletPlugin",
    "MemoryClaimSource",
    "PreparedDeviceReply",
    "RegistrationError",
    "RegistrationService",
]
