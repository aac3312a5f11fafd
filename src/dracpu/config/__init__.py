"""Driver configuration: defaults ← YAML file ← explicitly set flags (behavior.md §3).

Pure apart from reading the one config file. Every failure is a `ConfigError` whose message
is what the user sees; the wording follows the Go driver, with Go's `%q` quoting.

- `goyaml`: the file's YAML, read as the Go driver's go-yaml v2 reads it, strictly;
- `schema`: `DriverConfig`, which keys a file may set, how flags map onto keys;
- `layers`: the layering, validation, and a running driver's config from its command line;
- `derived`: values computed from a config at start (reserved CPUs, node name, kubelet
  plugin paths, the start-up dump, the fingerprint).
"""

from __future__ import annotations

from dracpu.config.derived import (
    SOCKET_PATH_LIMIT,
    KubeletPaths,
    config_dump_yaml,
    config_fingerprint,
    kubelet_paths,
    kubelet_paths_under,
    parse_reserved_cpus,
    resolve_node_name,
)
from dracpu.config.goyaml import MAX_YAML_DEPTH
from dracpu.config.layers import driver_argv, go_clean_path, load_config, reconstruct_from_cmdline
from dracpu.config.schema import (
    API_VERSION,
    FILE_KEYS_BEYOND_UPSTREAM,
    UPSTREAM_KEYS,
    ConfigError,
    DriverConfig,
    deprecated_flag_warnings,
    deprecated_flags_set,
)

__all__ = [
    "API_VERSION",
    "FILE_KEYS_BEYOND_UPSTREAM",
    "MAX_YAML_DEPTH",
    "SOCKET_PATH_LIMIT",
    "UPSTREAM_KEYS",
    "ConfigError",
    "DriverConfig",
    "KubeletPaths",
    "config_dump_yaml",
    "config_fingerprint",
    "deprecated_flag_warnings",
    "deprecated_flags_set",
    "driver_argv",
    "go_clean_path",
    "kubelet_paths",
    "kubelet_paths_under",
    "load_config",
    "parse_reserved_cpus",
    "reconstruct_from_cmdline",
    "resolve_node_name",
]
