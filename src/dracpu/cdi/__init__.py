"""CDI specs for prepared claims (behavior.md §10.1-§10.3; protocols.md §7).

Without I/O: ``names`` (a claim's CDI device name, id and spec file prefix), ``env`` (the
``DRA_CPUSET_<uid>`` entries a spec injects and NRI reads back), ``spec`` (a claim spec's
bytes, reading spec content), ``metadata`` (the spec that mounts a request's device
metadata). ``files``: writing, removing and reading back the specs in a CDI directory, and
resolving device ids to env entries as a runtime does. The atomic write itself is
``dracpu.atomicfile``. Nothing here imports ``dracpu.allocation``.
"""

from __future__ import annotations

from dracpu.cdi.env import DRAEnvError, cdi_env_entry, parse_dra_env
from dracpu.cdi.files import (
    CDIScan,
    device_env,
    on_memory_filesystem,
    read_claim_specs,
    remove_claim_spec,
    write_claim_spec,
)
from dracpu.cdi.names import CDI_KIND, cdi_device_id, cdi_device_name
from dracpu.cdi.spec import (
    CDI_VERSION,
    MAX_SPEC_BYTES,
    CDIError,
    check_claim_uid,
    claim_spec_bytes,
    claim_spec_path,
)

__all__ = [
    "CDI_KIND",
    "CDI_VERSION",
    "MAX_SPEC_BYTES",
    "CDIError",
    "CDIScan",
    "DRAEnvError",
    "cdi_device_id",
    "cdi_device_name",
    "cdi_env_entry",
    "check_claim_uid",
    "claim_spec_bytes",
    "claim_spec_path",
    "device_env",
    "on_memory_filesystem",
    "parse_dra_env",
    "read_claim_specs",
    "remove_claim_spec",
    "write_claim_spec",
]
