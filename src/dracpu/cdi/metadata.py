"""The CDI spec that mounts a claim request's device metadata file (behavior.md §10.3).

For each prepared request the kubelet is handed one more CDI id, ``dra.cpu/metadata=
<uid>_<request>``, defined by the spec ``dra.cpu_metadata_<uid>_<request>.json``: it
bind-mounts the request's ``metadata.json`` read-only into the container under
``/var/run/kubernetes.io/dra-device-attributes/``. Names and the spec's content only; the
metadata document and the file work are ``dracpu.kubelet.metadata``'s. Pure.
"""

from __future__ import annotations

from typing import Any

from dracpu import DRIVER_NAME

__all__ = [
    "CONTAINER_ROOT",
    "METADATA_CDI_KIND",
    "METADATA_CDI_VERSION",
    "cdi_metadata_id",
    "metadata_spec",
    "metadata_spec_name",
    "metadata_spec_prefix",
]

# The device name starts with the claim UID, often a digit: CDI 0.5.0 is the first version
# that allows that (the CDI library's requiresV050 says so).
METADATA_CDI_VERSION = "0.5.0"
METADATA_CDI_KIND = f"{DRIVER_NAME}/metadata"
CONTAINER_ROOT = "/var/run/kubernetes.io/dra-device-attributes"


def _device_name(claim_uid: str, request: str) -> str:
    return f"{claim_uid}_{request}"


def cdi_metadata_id(claim_uid: str, request: str) -> str:
    """The fully qualified CDI id of one request's metadata mount."""
    return f"{METADATA_CDI_KIND}={_device_name(claim_uid, request)}"


def metadata_spec_prefix(claim_uid: str) -> str:
    """The start of the file names of every metadata spec of a claim."""
    return f"{DRIVER_NAME}_metadata_{claim_uid}_"


def metadata_spec_name(claim_uid: str, request: str) -> str:
    """The file name of one request's metadata spec in the CDI directory."""
    return f"{metadata_spec_prefix(claim_uid)}{request}.json"


def metadata_spec(claim_uid: str, claim_name: str, request: str, host_path: str) -> dict[str, Any]:
    """The CDI spec that mounts one request's metadata file into the container."""
    container_path = (
        f"{CONTAINER_ROOT}/resourceclaims/{claim_name}/{request}/{DRIVER_NAME}-metadata.json"
    )
    return {
        "cdiVersion": METADATA_CDI_VERSION,
        "kind": METADATA_CDI_KIND,
        "devices": [
            {
                "name": _device_name(claim_uid, request),
                "containerEdits": {
                    "mounts": [
                        {
                            "hostPath": host_path,
                            "containerPath": container_path,
                            "options": ["ro", "bind"],
                        }
                    ]
                },
            }
        ],
    }
