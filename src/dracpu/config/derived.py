"""Values derived from a loaded `DriverConfig` at start (behavior.md §3.4): the reserved
cpuset, the node name, the kubelet plugin paths, the start-up dump and the fingerprint."""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import msgspec
import yaml

from dracpu import DRIVER_NAME
from dracpu.config.goyaml import GoYamlDumper
from dracpu.config.layers import go_clean_path
from dracpu.config.schema import ConfigError, DriverConfig
from dracpu.cpuset import CPUSet, CPUSetParseError
from dracpu.gofmt import go_quote

__all__ = [
    "SOCKET_PATH_LIMIT",
    "KubeletPaths",
    "config_dump_yaml",
    "config_fingerprint",
    "kubelet_paths",
    "kubelet_paths_under",
    "parse_reserved_cpus",
    "resolve_node_name",
]

SOCKET_PATH_LIMIT = 107  # sun_path is 108 bytes including the terminating NUL


def parse_reserved_cpus(cfg: DriverConfig) -> CPUSet:
    """`reservedCPUs` as a cpuset; not checked against the online CPUs."""
    try:
        return CPUSet.parse(cfg.reservedCPUs)
    except CPUSetParseError as err:
        raise ConfigError(f"failed to parse reserved CPUs: {err}") from err


def _node_name(cfg: DriverConfig, hostname_fn: Callable[[], str], env: Mapping[str, str]) -> str:
    name = cfg.hostnameOverride or env.get("NODE_NAME", "")
    if not name:
        try:
            name = hostname_fn()
        except OSError as err:
            raise ConfigError(f"couldn't determine hostname: {err}") from err
    name = name.strip()
    if not name:
        raise ConfigError("empty hostname is invalid")
    return name.lower()


def resolve_node_name(
    cfg: DriverConfig,
    hostname_fn: Callable[[], str] = socket.gethostname,
    env: Mapping[str, str] = os.environ,
    *,
    hostname: Callable[[], str] | None = None,
) -> str:
    """hostnameOverride, else $NODE_NAME, else the OS hostname; trimmed and lower-cased.
    (`hostname` is an older spelling of `hostname_fn`.)"""
    try:
        return _node_name(cfg, hostname or hostname_fn, env)
    except ConfigError as err:
        raise ConfigError(
            "can not obtain the node name, use the hostname-override flag if you want to set "
            f"it to a specific value: {err}"
        ) from err


@dataclass(frozen=True, slots=True)
class KubeletPaths:
    """Where the plugin's sockets live under the kubelet root (§3.4, §7)."""

    registrar_dir: str
    plugin_dir: str
    registrar_socket: str
    dra_socket: str


def _byte_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def kubelet_paths_under(kubelet_root: str, driver_name: str = DRIVER_NAME) -> KubeletPaths:
    """The plugin paths of `driver_name` under `kubelet_root`; a registrar socket path over
    107 bytes is an error."""
    registrar_dir = go_clean_path(f"{kubelet_root}/plugins_registry")
    plugin_dir = go_clean_path(f"{kubelet_root}/plugins/{driver_name}")
    registrar_socket = f"{registrar_dir}/{driver_name}-reg.sock"
    size = _byte_len(registrar_socket)
    if size > SOCKET_PATH_LIMIT:
        budget = SOCKET_PATH_LIMIT - (size - _byte_len(kubelet_root))
        raise ConfigError(
            f"kubelet registrar socket path {go_quote(registrar_socket)} is {size} bytes, over "
            f"the {SOCKET_PATH_LIMIT}-byte limit for a Unix socket path: kubeletRootDir has "
            f"{budget} bytes to spend and is using {_byte_len(kubelet_root)}"
        )
    return KubeletPaths(
        registrar_dir=registrar_dir,
        plugin_dir=plugin_dir,
        registrar_socket=registrar_socket,
        dra_socket=f"{plugin_dir}/dra.sock",
    )


def kubelet_paths(cfg: DriverConfig) -> KubeletPaths:
    """The kubelet plugin paths of this driver under `kubeletRootDir`."""
    return kubelet_paths_under(cfg.kubeletRootDir)


def config_dump_yaml(cfg: DriverConfig) -> str:
    """The `configuration successfully loaded` dump: every key, zero values too, sorted."""
    return yaml.dump(
        msgspec.structs.asdict(cfg),
        Dumper=GoYamlDumper,
        sort_keys=True,
        default_flow_style=False,
        # Escaped: PyYAML writes U+0085 and friends raw, and they then read back as breaks.
        allow_unicode=False,
    )


def config_fingerprint(cfg: DriverConfig) -> str:
    """A stable sha256 of what changes allocation and the published devices.

    reservedCPUs is compared as a set (`0,1` and `0-1` are the same configuration) and
    groupBy only counts in grouped mode, where it has a meaning.
    """
    try:
        reserved = CPUSet.parse(cfg.reservedCPUs).format()
    except CPUSetParseError:
        reserved = cfg.reservedCPUs
    payload = {
        "v": 1,
        "cpuDeviceMode": cfg.cpuDeviceMode,
        "groupBy": cfg.groupBy if cfg.cpuDeviceMode == "grouped" else "",
        "reservedCPUs": reserved,
        "exposePCIeRoots": cfg.exposePCIeRoots,
        "publishNodeAllocatableResourceMapping": cfg.publishNodeAllocatableResourceMapping,
    }
    if not cfg.publishIsolatedCPUs:
        # Only when set: configurations from before the option keep their fingerprint.
        payload["publishIsolatedCPUs"] = False
    return hashlib.sha256(msgspec.json.encode(payload, order="sorted")).hexdigest()
