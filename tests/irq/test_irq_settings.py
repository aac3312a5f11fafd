"""Asking for interrupt isolation: the allocation option, the node setting and --proc-root,
with their bad inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from dracpu.allocation.options import (
    AllocationOptions,
    AllocationOptionsError,
    decode_allocation_options,
    options_from_kv,
)
from dracpu.config import ConfigError, load_config
from dracpu.flags import FlagError, parse_root_flags

HEAD = '{"apiVersion": "dra.cpu/v1alpha1", "kind": "AllocationOptions"'


def test_the_option_is_read_from_opaque_parameters_and_the_command_line() -> None:
    assert decode_allocation_options(HEAD + ', "isolateIRQs": true}').isolate_irqs
    assert not decode_allocation_options(HEAD + "}").isolate_irqs
    assert options_from_kv(["isolateIRQs=true"]) == AllocationOptions(isolate_irqs=True)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            HEAD + ', "isolateIRQs": "yes"}',
            "invalid allocation options: Expected `bool`, got `str` - at `$.isolateIRQs`",
        ),
        (
            HEAD + ', "isolateIrqs": true}',
            "invalid allocation options: Object contains unknown field `isolateIrqs`",
        ),
    ],
)
def test_bad_option_values_are_named(text: str, message: str) -> None:
    with pytest.raises(AllocationOptionsError) as info:
        decode_allocation_options(text)
    assert str(info.value) == message


def test_a_bad_command_line_value_is_named() -> None:
    with pytest.raises(AllocationOptionsError) as info:
        options_from_kv(["isolateIRQs=maybe"])
    assert str(info.value) == "invalid --option 'isolateIRQs=maybe': expected true or false"


def test_the_node_setting_from_the_file_and_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("isolateIRQs: true\n")
    assert load_config(str(path), {}).isolateIRQs
    flags = parse_root_flags(["--isolate-irqs", "--proc-root=/host/proc"])
    cfg = load_config("", flags.explicit)
    assert cfg.isolateIRQs and cfg.procRoot == "/host/proc"


def test_bad_node_settings_are_named(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("isolateIRQs: yes please\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {})
    assert str(info.value) == (
        f"cannot apply {path}: applying config map: json: cannot unmarshal string into field "
        "isolateIRQs of type bool"
    )
    with pytest.raises(FlagError) as flag_info:
        parse_root_flags(["--isolate-irqs=sometimes"])
    assert str(flag_info.value) == (
        'invalid boolean value "sometimes" for -isolate-irqs: parse error'
    )


@pytest.mark.parametrize("root", ["", "proc", "host/proc"])
def test_proc_root_must_be_absolute(root: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("", {"proc-root": root})
    assert str(info.value) == (
        f'cannot validate config: invalid procRoot "{root}": must be an absolute path'
    )


def test_proc_root_is_a_flag_only(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("procRoot: /elsewhere\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {})
    assert str(info.value) == (
        f'cannot apply {path}: field "procRoot" is not configurable via the config file; '
        "use --proc-root instead"
    )
