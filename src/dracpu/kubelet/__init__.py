"""The kubelet-facing services: registration, DRA v1/v1beta1 prepare and unprepare, and
the device health stream, served on the kubelet's unix sockets by ``KubeletPlugin``.

The names below are imported on first use (PEP 562), so importing one submodule does not
load the others: the device-metadata writer process (``metadata_proc``) imports only the
file steps, not the gRPC server and the kubernetes client (about 30 MB less resident).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOMES = {
    "ApiClaimSource": "claims",
    "ClaimSource": "claims",
    "MemoryClaimSource": "claims",
    "ClaimPrepareResult": "dra",
    "ClaimRef": "dra",
    "ClaimUnprepareResult": "dra",
    "DRAService": "dra",
    "PreparedDeviceReply": "dra",
    "HealthReport": "health",
    "HealthService": "health",
    "KubeletPlugin": "plugin",
    "SUPPORTED_VERSIONS": "registration",
    "RegistrationError": "registration",
    "RegistrationService": "registration",
}

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


if not TYPE_CHECKING:  # type checkers see the imports above, and flag unknown names

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
        globals()[name] = value
        return value
