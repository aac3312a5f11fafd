"""CDI specs for prepared claims (behavior.md §10.1, §10.2; protocols.md §7).

``spec``: names, bytes and the reading of spec content, without I/O. ``files``: writing,
removing and reading back the specs in a CDI directory, and resolving device ids to env
entries as a runtime does. The atomic write itself is ``dracpu.atomicfile``.
"""

from __future__ import annotations

from dracpu.cdi.files import (
    CDIScan,
    device_env,
    on_memory_filesystem,
    read_claim_specs,
    remove_claim_spec,
    write_claim_spec,
)
from dracpu.cdi.spec import (
    CDI_DIR,
    CDI_VERSION,
    MAX_SPEC_BYTES,
    CDIError,
    check_claim_uid,
    claim_spec_bytes,
    claim_spec_path,
)

__all__ = [
    "CDI_DIR",
    "CDI_VERSION",
    "MAX_SPEC_BYTES",
    "CDIError",
    "CDIScan",
    "check_claim_uid",
    "claim_spec_bytes",
    "claim_spec_path",
    "device_env",
    "on_memory_filesystem",
    "read_claim_specs",
    "remove_claim_spec",
    "write_claim_spec",
]
