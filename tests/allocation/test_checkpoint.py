"""Checkpoint encode/decode: round trips, corruption, versions, arbitrary bytes."""

from __future__ import annotations

import contextlib
import hashlib
import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dracpu.allocation.checkpoint import (
    CHECKPOINT_VERSION,
    Checkpoint,
    CheckpointCorrupt,
    CheckpointError,
    CheckpointVersionError,
    decode_checkpoint,
    encode_checkpoint,
    is_driver_restart,
)
from dracpu.allocation.options import AllocationOptions
from dracpu.allocation.store import ClaimRecord, PreparedDevice
from dracpu.cpuset import CPUSet

RECORD = ClaimRecord(
    uid="3b1d2f3a-1111-4c4c-8d8d-000000000001",
    namespace="default",
    name="pinned",
    cpus=CPUSet.parse("2-3,10-11"),
    devices=(
        PreparedDevice(
            pool_name="node-a",
            device_name="cpudevnuma000",
            request_names=("cpus",),
            allocated_num_cpus=4,
        ),
    ),
    options={"cpus": AllocationOptions(full_pcpus_only=True)},
)
CP = Checkpoint(
    version=CHECKPOINT_VERSION, boot_id="boot-1", config_fingerprint="fp", claims=(RECORD,)
)


def doc() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(encode_checkpoint(CP))
    return loaded


def redo_checksum(d: dict[str, object]) -> bytes:
    """Re-sign an edited document the way the encoder does (fields in order, compact)."""
    body = {k: v for k, v in d.items() if k != "checksum"}
    canonical = json.dumps(body, separators=(",", ":")).encode()
    return json.dumps(
        {**body, "checksum": "sha256:" + hashlib.sha256(canonical).hexdigest()}
    ).encode()


def corrupt(data: bytes) -> str:
    with pytest.raises(CheckpointCorrupt) as info:
        decode_checkpoint(data)
    return str(info.value)


def test_encoding_is_the_documented_json() -> None:
    data = encode_checkpoint(CP)
    body = data[: data.index(b',"checksum"')] + b"}"
    assert json.loads(data) == {
        "version": 1,
        "boot_id": "boot-1",
        "config_fingerprint": "fp",
        "claims": [
            {
                "uid": "3b1d2f3a-1111-4c4c-8d8d-000000000001",
                "cpus": "2-3,10-11",
                "namespace": "default",
                "name": "pinned",
                "devices": [
                    {
                        "pool_name": "node-a",
                        "device_name": "cpudevnuma000",
                        "request_names": ["cpus"],
                        "allocated_num_cpus": 4,
                    }
                ],
                "options": {
                    "cpus": {
                        "strategy": "packed",
                        "prefer_align_by_uncore_cache": True,
                        "full_pcpus_only": True,
                        "distribute_across_numa": False,
                        "shared_pool_access": False,
                    }
                },
            }
        ],
        "checksum": "sha256:" + hashlib.sha256(body).hexdigest(),
    }


def test_round_trip_and_checksum_filled_in() -> None:
    back = decode_checkpoint(encode_checkpoint(CP))
    assert back == msgspec.structs.replace(CP, checksum=back.checksum)
    assert back.checksum.startswith("sha256:")
    # whatever checksum the caller passes is replaced by the real one
    forged = msgspec.structs.replace(CP, checksum="sha256:00")
    assert encode_checkpoint(forged) == encode_checkpoint(CP)


def test_empty_checkpoint() -> None:
    cp = Checkpoint(version=1, boot_id="", config_fingerprint="")
    assert decode_checkpoint(encode_checkpoint(cp)).claims == ()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "checkpoint is corrupt: Input data was truncated"),
        (b"{", "checkpoint is corrupt: Input data was truncated"),
        (b"\xff", "checkpoint is corrupt: JSON is malformed: invalid character (byte 0)"),
        (b"[]", "checkpoint is corrupt: Expected `object`, got `array`"),
        (b"{}", "checkpoint is corrupt: Object missing required field `version`"),
        (b'{"version": "1"}', "checkpoint is corrupt: Expected `int`, got `str` - at `$.version`"),
        (b'{"version": 1}', "checkpoint is corrupt: Object missing required field `boot_id`"),
    ],
)
def test_corrupt_inputs(data: bytes, message: str) -> None:
    assert corrupt(data) == message


def test_schema_errors_name_the_field_path() -> None:
    d = doc()
    d["claims"][0]["cpus"] = "3-1"  # type: ignore[index]
    assert corrupt(redo_checksum(d)) == (
        "checkpoint is corrupt: invalid cpuset '3-1': range end below its start: '3-1' "
        "- at `$.claims[0].cpus`"
    )
    d = doc()
    d["claims"][0]["cpus"] = 7  # type: ignore[index]
    assert corrupt(redo_checksum(d)) == (
        "checkpoint is corrupt: Expected `str`, got `int` - at `$.claims[0].cpus`"
    )
    d = doc()
    d["claims"][0]["devices"][0]["extra"] = 1  # type: ignore[index]
    assert corrupt(redo_checksum(d)) == (
        "checkpoint is corrupt: Object contains unknown field `extra` - at `$.claims[0].devices[0]`"
    )
    d = doc()
    d["claims"][0]["options"]["cpus"]["strategy"] = "spread"  # type: ignore[index]
    assert corrupt(redo_checksum(d)) == (
        'checkpoint is corrupt: fullPCPUsOnly cannot be combined with strategy "spread" '
        "(spread splits physical cores) - at `$.claims[0].options[...]`"
    )


def test_checksum_mismatch() -> None:
    data = encode_checkpoint(CP).replace(b'"2-3,10-11"', b'"2-3,10-12"')
    message = corrupt(data)
    assert message.startswith("checkpoint is corrupt: checksum mismatch (stored 'sha256:")
    assert corrupt(encode_checkpoint(CP).replace(b'"checksum":"', b'"checksum":"x')).startswith(
        "checkpoint is corrupt: checksum mismatch"
    )
    d = doc()
    del d["checksum"]
    assert corrupt(json.dumps(d).encode()) == (
        "checkpoint is corrupt: checksum mismatch (stored '', computed "
        f"{decode_checkpoint(encode_checkpoint(CP)).checksum!r})"
    )


@pytest.mark.parametrize("version", [0, 2, -1, 10**30])
def test_unknown_versions(version: int) -> None:
    d = doc()
    d["version"] = version
    d["claims"] = "a future shape"  # the version is checked before the schema
    with pytest.raises(CheckpointVersionError) as info:
        decode_checkpoint(json.dumps(d).encode())
    assert str(info.value) == f"unsupported checkpoint version {version} (supported: 1)"
    assert info.value.version == version


def test_is_driver_restart() -> None:
    assert is_driver_restart(CP, "boot-1", "fp") is True
    assert is_driver_restart(CP, "boot-2", "fp") is False
    assert is_driver_restart(CP, "boot-1", "other") is False


# -- properties ------------------------------------------------------------------------------

texts = st.text(max_size=12)
options = st.builds(
    AllocationOptions,
    strategy=st.just("packed"),
    prefer_align_by_uncore_cache=st.booleans(),
    full_pcpus_only=st.booleans(),
    distribute_across_numa=st.booleans(),
)
devices = st.builds(
    PreparedDevice,
    pool_name=texts,
    device_name=texts,
    request_names=st.lists(texts, max_size=2).map(tuple),
    allocated_num_cpus=st.none() | st.integers(min_value=0, max_value=1 << 40),
)
records = st.builds(
    ClaimRecord,
    uid=texts,
    cpus=st.integers(min_value=0, max_value=(1 << 300) - 1).map(CPUSet.from_mask),
    namespace=texts,
    name=texts,
    devices=st.lists(devices, max_size=3).map(tuple),
    options=st.dictionaries(texts, options, max_size=2),
)
checkpoints = st.builds(
    Checkpoint,
    version=st.just(CHECKPOINT_VERSION),
    boot_id=texts,
    config_fingerprint=texts,
    claims=st.lists(records, max_size=4).map(tuple),
)


@settings(max_examples=150, deadline=None)
@given(checkpoints)
def test_round_trip_property(cp: Checkpoint) -> None:
    data = encode_checkpoint(cp)
    back = decode_checkpoint(data)
    assert back == msgspec.structs.replace(cp, checksum=back.checksum)
    assert encode_checkpoint(back) == data


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_checkpoint_errors(data: bytes) -> None:
    with contextlib.suppress(CheckpointError):
        decode_checkpoint(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
paths = st.sampled_from(
    [
        (),
        ("claims",),
        ("claims", 0),
        ("claims", 0, "cpus"),
        ("claims", 0, "devices"),
        ("claims", 0, "devices", 0, "allocated_num_cpus"),
        ("claims", 0, "options"),
        ("claims", 0, "options", "cpus"),
        ("claims", 0, "options", "cpus", "strategy"),
        ("boot_id",),
    ]
)


@settings(max_examples=300, deadline=None)
@given(paths, json_values, st.booleans())
def test_json_shaped_damage_raises_only_checkpoint_errors(
    path: tuple[str | int, ...], value: object, resign: bool
) -> None:
    d: object = doc()
    if not path:
        d = value
    else:
        parent = d
        for key in path[:-1]:
            parent = parent[key]  # type: ignore[index]
        parent[path[-1]] = value  # type: ignore[index]
    data = redo_checksum(d) if resign and isinstance(d, dict) else json.dumps(d).encode()
    with contextlib.suppress(CheckpointError):
        back = decode_checkpoint(data)
        assert back.version == CHECKPOINT_VERSION


VALID = encode_checkpoint(CP)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=0, max_value=len(VALID) - 1),
    st.integers(min_value=1, max_value=255),
    st.integers(min_value=0, max_value=len(VALID)),
)
def test_damaged_checkpoints_are_detected(pos: int, xor: int, cut: int) -> None:
    damaged = bytearray(VALID)
    damaged[pos] ^= xor
    for data in (bytes(damaged), VALID[:cut]):
        if data == VALID:
            continue
        try:
            back = decode_checkpoint(data)
        except CheckpointError:
            continue
        # A flip that survives decoding changed nothing the checksum covers
        # (e.g. whitespace-equivalent bytes); the content must be the original.
        assert back == decode_checkpoint(VALID)
