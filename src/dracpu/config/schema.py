"""The driver's configuration schema: `DriverConfig`, which keys a file may set, and how
root flags map onto keys (behavior.md §3.1, §3.3)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from dracpu.flags import ROOT_FLAGS

__all__ = [
    "API_VERSION",
    "CANONICAL_KEYS",
    "DEPRECATED_FLAGS",
    "EXCLUDED_HINTS",
    "FIELD_KIND",
    "FILE_KEYS_BEYOND_UPSTREAM",
    "FLAG_TO_KEY",
    "NOT_CONFIG_FLAGS",
    "UPSTREAM_KEYS",
    "ConfigError",
    "DriverConfig",
    "deprecated_flag_warnings",
    "deprecated_flags_set",
]

API_VERSION = "v1alpha1"


class ConfigError(ValueError):
    """The configuration cannot be used; the message is shown to the user as is."""


class DriverConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The effective configuration. Attribute names are the YAML/JSON keys (§3.1)."""

    kubeconfig: str = ""
    hostnameOverride: str = ""
    bindAddress: str = ":8080"
    reservedCPUs: str = ""
    cpuDeviceMode: str = "grouped"
    groupBy: str = "numanode"
    exposePCIeRoots: bool = False
    sysfsOverlay: str = ""
    kubeletRootDir: str = "/var/lib/kubelet"
    publishNodeAllocatableResourceMapping: bool = False
    # Host paths and daemon settings beyond upstream: flags only, refused in the file, so a
    # ConfigMap can never point the daemon at another node's paths.
    sysfsRoot: str = "/sys"
    nriSocket: str = "/var/run/nri/nri.sock"
    cdiDir: str = "/var/run/cdi"
    cgroupRoot: str = "/sys/fs/cgroup"
    procRoot: str = "/proc"
    stateDir: str = "/var/lib/dracpu"
    debugAddress: str = "127.0.0.1:8081"
    logFormat: str = "text"
    # Beyond upstream, allowed in the file too: not host paths.
    alignMemory: bool = False
    publishIsolatedCPUs: bool = True
    isolateIRQs: bool = False
    claimStatus: bool = True


# The keys of the Go driver's Config, in the order §3.1 lists them.
UPSTREAM_KEYS = (
    "kubeconfig",
    "hostnameOverride",
    "bindAddress",
    "reservedCPUs",
    "cpuDeviceMode",
    "groupBy",
    "exposePCIeRoots",
    "sysfsOverlay",
    "kubeletRootDir",
    "publishNodeAllocatableResourceMapping",
)
_DEFAULTS: dict[str, Any] = msgspec.structs.asdict(DriverConfig())
# The JSON kind each field decodes from ("bool" or "string").
FIELD_KIND = {name: "bool" if type(v) is bool else "string" for name, v in _DEFAULTS.items()}
# Every key a file may spell, for the case-insensitive spelling check.
CANONICAL_KEYS = tuple(sorted((*DriverConfig.__struct_fields__, "apiVersion")))

# Fields a config file may not set, and what to use instead (§3.3 step 6).
EXCLUDED_HINTS: dict[str, str] = {
    # Upstream's hints name its Helm chart's values; dracpu has no chart, so they name
    # the flag (and, for the port, the DaemonSet's probes that must follow it).
    "bindAddress": "use --bind-address instead (and move the DaemonSet's healthz port with it)",
    "exposePCIeRoots": "use --expose-pcie-roots instead",
    "kubeletRootDir": "use --kubelet-root-dir instead",
}
# dracpu's own settings that a config file may set (the other dracpu-only keys are host
# paths and daemon plumbing: flags only).
FILE_KEYS_BEYOND_UPSTREAM = ("alignMemory", "publishIsolatedCPUs", "isolateIRQs", "claimStatus")
for _spec in ROOT_FLAGS:
    if (
        _spec.config_key
        and _spec.config_key not in UPSTREAM_KEYS
        and _spec.config_key not in FILE_KEYS_BEYOND_UPSTREAM
    ):
        EXCLUDED_HINTS[_spec.config_key] = f"use --{_spec.name} instead"

FLAG_TO_KEY = {spec.name: spec.config_key for spec in ROOT_FLAGS if spec.config_key}
NOT_CONFIG_FLAGS = frozenset(spec.name for spec in ROOT_FLAGS if not spec.config_key)
DEPRECATED_FLAGS = {spec.name: spec.config_key for spec in ROOT_FLAGS if spec.deprecated}


def deprecated_flag_warnings(explicit_flag_names: Iterable[str]) -> list[tuple[str, str]]:
    """(flag, driverConfig field) for each deprecated flag that was set, in name order
    (the order Go's FlagSet.Visit reports them)."""
    names = set(explicit_flag_names)
    return [(flag, key) for flag, key in sorted(DEPRECATED_FLAGS.items()) if flag in names and key]


def deprecated_flags_set(explicit_flags: Iterable[str]) -> list[tuple[str, str]]:
    """Older name of `deprecated_flag_warnings`."""
    return deprecated_flag_warnings(explicit_flags)
