"""Property tests: no input makes config loading or flag parsing fail with anything but the
boundary's own error type, and valid configs round-trip."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import msgspec
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dracpu.config import (
    ConfigError,
    DriverConfig,
    config_dump_yaml,
    load_config,
    reconstruct_from_cmdline,
)
from dracpu.config.goyaml import GoYamlLoader
from dracpu.flags import ROOT_FLAGS, FlagError, parse_root_flags

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = [
    *DriverConfig.__struct_fields__,
    "apiVersion",
    "ApiVersion",
    "groupby",
    "BINDADDRESS",
    "showMetrics",
    "<<",
    "? [a]",
    "1",
    "y",
]
SCALARS = [
    "",
    "~",
    "null",
    "y",
    "n",
    "on",
    "Off",
    "yes",
    "true",
    "0",
    "-1",
    "0x1F",
    "0o7",
    "08",
    "1_000",
    "1e3",
    ".5",
    ".nan",
    "-.inf",
    "1:30",
    "2001-12-14",
    "=",
    "v1alpha1",
    "grouped",
    "individual",
    "socket",
    "machine",
    "rack",
    "'0-3'",
    '"x"',
    "[1, 2]",
    "{a: 1}",
    "&a [*a]",
    "!!binary aGk=",
    "!!bool maybe",
    "!!int x",
    "!foo bar",
    "|\n  block",
    "/var/lib/kubelet",
    "rel/dir",
]


def check_only_config_errors(path: Path, text: str) -> None:
    path.write_text(text)
    with contextlib.suppress(ConfigError):
        cfg = load_config(str(path), {})
        assert isinstance(cfg, DriverConfig)


@FUZZ
@given(st.text(max_size=120))
def test_arbitrary_text_only_raises_config_error(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    check_only_config_errors(tmp_path_factory.mktemp("cfg") / "c.yaml", text)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(SCALARS)), max_size=6))
def test_yaml_like_documents_only_raise_config_error(
    tmp_path_factory: pytest.TempPathFactory, pairs: list[tuple[str, str]]
) -> None:
    text = "".join(f"{key}: {value}\n" for key, value in pairs)
    check_only_config_errors(tmp_path_factory.mktemp("cfg") / "c.yaml", text)


@FUZZ
@given(st.binary(max_size=80))
def test_arbitrary_bytes_only_raise_config_error(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_bytes(data)
    with contextlib.suppress(ConfigError):
        load_config(str(path), {})


# JSON is YAML with every string quoted, so the test's writer cannot be misread the way a
# PyYAML dump can (`0E0` is a string to PyYAML and a number to go-yaml).
TEXT = st.text(st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",)), max_size=20)
FILE_VALUES = {
    "kubeconfig": TEXT,
    "hostnameOverride": TEXT,
    "reservedCPUs": st.sampled_from(["", "0", "0-3", "1,5-7"]),
    "cpuDeviceMode": st.sampled_from(["grouped", "individual"]),
    "groupBy": st.sampled_from(["socket", "numanode", "machine"]),
    "sysfsOverlay": TEXT,
    "publishNodeAllocatableResourceMapping": st.booleans(),
}


@FUZZ
@given(st.fixed_dictionaries({}, optional=FILE_VALUES))
def test_valid_files_round_trip(
    tmp_path_factory: pytest.TempPathFactory, values: dict[str, object]
) -> None:
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_text(json.dumps({"apiVersion": "v1alpha1", **values}))
    cfg = load_config(str(path), {})
    assert cfg == msgspec.structs.replace(DriverConfig(), **values)


@FUZZ
@given(
    st.builds(
        DriverConfig,
        kubeconfig=TEXT,
        hostnameOverride=TEXT,
        reservedCPUs=st.sampled_from(["y", "0E0", "1_0", "on", "~", "0x1", "1:2", "0-3", ""]),
        sysfsRoot=TEXT,
        exposePCIeRoots=st.booleans(),
    )
)
def test_config_dump_reads_back_as_go_yaml_would(cfg: DriverConfig) -> None:
    dumped = yaml.load(config_dump_yaml(cfg), Loader=GoYamlLoader)
    assert dumped == msgspec.structs.asdict(cfg)


ARG_PIECES = [
    *(f"--{s.name}" for s in ROOT_FLAGS),
    *(f"-{s.name}=" for s in ROOT_FLAGS),
    "-v=x",
    "--expose-pcie-roots=maybe",
    "--group-by=rack",
    "--",
    "-",
    "---x",
    "-=",
    "-h",
    "run",
    "0-3",
    "socket",
    "/etc/c.yaml",
    "true",
    "",
]


@FUZZ
@given(st.lists(st.sampled_from(ARG_PIECES), max_size=8))
def test_flag_parsing_only_raises_flag_error(argv: list[str]) -> None:
    with contextlib.suppress(FlagError):
        parsed = parse_root_flags(argv)
        assert all(isinstance(name, str) for name in parsed.explicit)
        assert all(p in argv for p in parsed.positionals)


@FUZZ
@given(st.lists(st.sampled_from(ARG_PIECES), max_size=8))
def test_reconstruct_only_raises_config_error(argv: list[str]) -> None:
    with contextlib.suppress(ConfigError):
        reconstruct_from_cmdline(["/dracpu", *argv], lambda p: "/nonexistent" + p)
