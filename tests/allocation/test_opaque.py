"""Opaque configs (behavior.md §8.3): override selection, parsing, validation, options."""

from __future__ import annotations

import json

import pytest

from dracpu.allocation.opaque import (
    DeviceConfig,
    OpaqueConfigError,
    applies_to,
    check_override,
    is_options_config,
    parse_cpuset_override,
    select_allocation_options,
    select_cpuset_override,
)
from dracpu.allocation.options import AllocationOptions
from dracpu.cpuset import CPUSet

FROM_CLASS_MSG = (
    "opaque config: configuration from DeviceClass is not supported by this driver, "
    "custom cpusets must be defined per ResourceClaim request"
)
OPTIONS = {"apiVersion": "dra.cpu/v1alpha1", "kind": "AllocationOptions", "fullPCPUsOnly": True}


def override(cpuset: str = "4-7", **extra: object) -> bytes:
    return json.dumps({"apiVersion": "v1alpha1", "cpuConfig": {"cpuset": cpuset}, **extra}).encode()


def cfg(
    params: bytes | dict[str, object] = b"",
    *,
    requests: tuple[str, ...] = (),
    source: str = "FromClaim",
    driver: str | None = "dra.cpu",
) -> DeviceConfig:
    raw = json.dumps(params).encode() if isinstance(params, dict) else params
    return DeviceConfig(source=source, requests=requests, driver=driver, parameters=raw)


@pytest.mark.parametrize(
    ("requests", "request_name", "applies"),
    [
        ((), "cpus", True),
        (("cpus",), "cpus", True),
        (("other", "cpus"), "cpus", True),
        (("other",), "cpus", False),
        (("main",), "main/sub", True),
        (("main/sub",), "main/sub", True),
        (("main/other",), "main/sub", False),
        (("main/sub",), "main", False),
        (("cpu",), "cpus", False),
    ],
)
def test_applies_to(requests: tuple[str, ...], request_name: str, applies: bool) -> None:
    assert applies_to(cfg(requests=requests), request_name) is applies


def test_config_without_opaque_section_never_applies() -> None:
    assert applies_to(cfg(driver=None), "cpus") is False


def test_select_override_ignores_other_drivers_and_requests() -> None:
    mine = cfg(override(), requests=("cpus",))
    configs = [
        cfg(override("0"), driver="gpu.example.com"),
        cfg(override("1"), requests=("other",)),
        cfg(override("2"), driver=None),
        mine,
    ]
    assert select_cpuset_override(configs, "cpus") is mine


def test_select_override_from_class_is_refused_even_with_a_claim_config() -> None:
    configs = [cfg(override(), source="FromClass"), cfg(override())]
    with pytest.raises(OpaqueConfigError) as info:
        select_cpuset_override(configs, "cpus")
    assert str(info.value) == FROM_CLASS_MSG


def test_select_override_from_class_of_another_driver_is_fine() -> None:
    mine = cfg(override())
    assert select_cpuset_override([cfg(source="FromClass", driver="x"), mine], "cpus") is mine


@pytest.mark.parametrize("n", [0, 2, 3])
def test_select_override_count(n: int) -> None:
    configs = [cfg(override()) for _ in range(n)]
    with pytest.raises(OpaqueConfigError) as info:
        select_cpuset_override(configs, "main/sub")
    assert str(info.value) == (
        f'opaque config: request "main/sub" is targeted by {n} configurations, '
        "must be targeted by exactly 1"
    )


def test_options_configs_do_not_count_as_overrides() -> None:
    mine = cfg(override())
    configs = [cfg(OPTIONS), cfg(OPTIONS, source="FromClass"), mine]
    assert select_cpuset_override(configs, "cpus") is mine
    with pytest.raises(OpaqueConfigError, match="targeted by 0 configurations"):
        select_cpuset_override([cfg(OPTIONS)], "cpus")


@pytest.mark.parametrize(
    ("params", "is_options"),
    [
        (OPTIONS, True),
        ({"kind": "AllocationOptions"}, True),
        ({"kind": "allocationoptions"}, False),
        ({"Kind": "AllocationOptions"}, False),
        ({"apiVersion": "v1alpha1", "cpuConfig": {"cpuset": "1"}}, False),
        ({"kind": "CPUConfig"}, False),
        (b"", False),
        (b"{not json", False),
        (b"[1]", False),
    ],
)
def test_is_options_config(params: bytes | dict[str, object], is_options: bool) -> None:
    assert is_options_config(cfg(params)) is is_options


@pytest.mark.parametrize(
    ("params", "cpus"),
    [
        (override("4-7"), "4-7"),
        (override("0,2,4-5"), "0,2,4-5"),
        # unknown fields are ignored, kind included (the override has none of its own)
        (override("1", kind="Whatever", extra={"x": 1}), "1"),
        # keys match case-insensitively, like Go's encoding/json
        (b'{"APIVERSION": "v1alpha1", "CpuConfig": {"CPUSET": "3"}}', "3"),
        (b'{"apiversion": "v1alpha1", "cpuconfig": {"cpuset": "3"}}', "3"),
        # the last key that folds onto a field wins
        (b'{"apiVersion": "v1", "ApiVersion": "v1alpha1", "cpuConfig": {"cpuset": "5"}}', "5"),
        (
            b'{"apiVersion":"v1alpha1","cpuConfig":{"cpuset":"1"},"cpuconfig":{"cpuset":"2"}}',
            "2",
        ),
        # Go's simple case folding maps the Kelvin sign and the long s onto k and s
        ('{"apiVersion":"v1alpha1","cpuConfig":{"cpu\u017fet":"6"}}'.encode(), "6"),
    ],
)
def test_parse_override(params: bytes, cpus: str) -> None:
    assert parse_cpuset_override(cfg(params), "cpus") == CPUSet.parse(cpus)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (b"", 'no opaque cpuset configuration found for allocation request "r/s"'),
        (
            b"{",
            "failed to unmarshal opaque config: "
            "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        (
            b"[]",
            "failed to unmarshal opaque config: cannot unmarshal array into a value of type object",
        ),
        (
            b'"x"',
            "failed to unmarshal opaque config: cannot unmarshal string into a value of type "
            "object",
        ),
        (b'{"apiVersion": NaN}', "failed to unmarshal opaque config: invalid JSON value NaN"),
        (
            b'{"apiVersion": 1, "cpuConfig": {"cpuset": "1"}}',
            "failed to unmarshal opaque config: cannot unmarshal number into field apiVersion "
            "of type string",
        ),
        (
            b'{"apiVersion": "v1alpha1", "cpuConfig": "1"}',
            "failed to unmarshal opaque config: cannot unmarshal string into field cpuConfig "
            "of type object",
        ),
        (
            b'{"apiVersion": "v1alpha1", "cpuConfig": {"cpuset": [1]}}',
            "failed to unmarshal opaque config: cannot unmarshal array into field "
            "cpuConfig.cpuset of type string",
        ),
        (b"null", 'unsupported opaque config apiVersion: ""'),
        (b'{"cpuConfig": {"cpuset": "1"}}', 'unsupported opaque config apiVersion: ""'),
        (override("1").replace(b"v1alpha1", b"v1"), 'unsupported opaque config apiVersion: "v1"'),
        (
            override("1").replace(b"v1alpha1", b"dra.cpu/v1alpha1"),
            'unsupported opaque config apiVersion: "dra.cpu/v1alpha1"',
        ),
        (b'{"apiVersion": "v1alpha1"}', "opaque config: cpuConfig.cpuset is empty or missing"),
        (
            b'{"apiVersion": "v1alpha1", "cpuConfig": null}',
            "opaque config: cpuConfig.cpuset is empty or missing",
        ),
        (override(""), "opaque config: cpuConfig.cpuset is empty or missing"),
        (
            override("1-"),
            'opaque config: failed to parse cpuset "1-": '
            "invalid cpuset '1-': not a cpu id or range: '1-'",
        ),
        (
            override("4-7\n"),
            'opaque config: failed to parse cpuset "4-7\\n": '
            "invalid cpuset '4-7\\n': not a cpu id or range: '4-7\\n'",
        ),
    ],
)
def test_parse_override_errors(params: bytes, message: str) -> None:
    with pytest.raises(OpaqueConfigError) as info:
        parse_cpuset_override(cfg(params), "r/s")
    assert str(info.value) == message


def test_parse_override_deep_nesting_is_an_unmarshal_error() -> None:
    deep = b'{"apiVersion": "v1alpha1", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(OpaqueConfigError) as info:
        parse_cpuset_override(cfg(deep), "r")
    assert str(info.value) == "failed to unmarshal opaque config: exceeded max depth"


def check(cpus: str, **kw: str | int) -> None:
    args: dict[str, object] = {
        "count": 4,
        "online": CPUSet.range(0, 7),
        "reserved": CPUSet.parse("0"),
        "assigned": CPUSet(),
        "prepared": CPUSet(),
    }
    args.update({k: CPUSet.parse(v) if isinstance(v, str) else v for k, v in kw.items()})
    check_override(CPUSet.parse(cpus), **args)  # type: ignore[arg-type]


def test_check_override_accepts() -> None:
    check("4-7", assigned="1", prepared="2-3")


@pytest.mark.parametrize(
    ("cpus", "kw", "message"),
    [
        ("4-6", {}, "opaque config cpuset size 3 does not match requested capacity 4"),
        ("4-8", {"count": 4}, "opaque config cpuset size 5 does not match requested capacity 4"),
        (
            "6-9",
            {},
            "requested CPUs 6-9 from opaque config contain offline cores: 8-9",
        ),
        ("0-3", {}, "requested CPUs 0-3 from opaque config contain reserved cores: 0"),
        (
            "1-4",
            {"assigned": "4-5", "prepared": "1"},
            "requested CPUs 1-4 from opaque config are already assigned to another device in "
            "this claim",
        ),
        (
            "1-4",
            {"prepared": "3,7"},
            "requested CPUs 1-4 from opaque config conflict with already allocated claims",
        ),
        # the order of the checks: offline before reserved before assigned before prepared
        (
            "0,5,8,9",
            {"assigned": "5", "prepared": "9"},
            "requested CPUs 0,5,8-9 from opaque config contain offline cores: 8-9",
        ),
        (
            "0,5-7",
            {"assigned": "5", "prepared": "6"},
            "requested CPUs 0,5-7 from opaque config contain reserved cores: 0",
        ),
    ],
)
def test_check_override_errors(cpus: str, kw: dict[str, str | int], message: str) -> None:
    with pytest.raises(OpaqueConfigError) as info:
        check(cpus, **kw)
    assert str(info.value) == message


def test_select_options_none_without_options_config() -> None:
    assert select_allocation_options([cfg(override()), cfg(OPTIONS, driver="x")], "cpus") is None


def test_select_options_last_claim_config_wins_over_class() -> None:
    claim_first = cfg({**OPTIONS, "fullPCPUsOnly": False, "strategy": "spread"})
    claim_last = cfg({**OPTIONS, "distributeAcrossNUMA": True}, requests=("cpus",))
    preset = cfg(OPTIONS, source="FromClass")
    got = select_allocation_options([claim_first, claim_last, preset], "cpus/sub")
    assert got == AllocationOptions(full_pcpus_only=True, distribute_across_numa=True)
    assert select_allocation_options([preset], "cpus") == AllocationOptions(full_pcpus_only=True)


def test_select_options_validates_every_applicable_config() -> None:
    broken = cfg({**OPTIONS, "fullPCPUsOnly": "yes"}, source="FromClass")
    with pytest.raises(OpaqueConfigError) as info:
        select_allocation_options([broken, cfg(OPTIONS)], "cpus")
    assert str(info.value) == (
        "invalid allocation options: Expected `bool`, got `str` - at `$.fullPCPUsOnly`"
    )
    # a broken options config of another request is not looked at
    assert select_allocation_options([cfg({**OPTIONS, "x": 1}, requests=("b",))], "a") is None
