"""CDI spec reading, ``DRA_CPUSET_*`` parsing and cpuset strings under hypothesis.

The CDI directory is shared with other vendors and any root process; env entries are
written by pod authors. Reading never raises anything but the module's own error
(``CDIError``, ``DRAEnvError``, ``CPUSetParseError``), a bad spec becomes one line in
``CDIScan.errors`` while the good ones are still read, and nothing a string says can make a
set larger than ``MAX_CPU_ID`` bits.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest
from fuzzing import bounded, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from dracpu.cdi import (
    MAX_SPEC_BYTES,
    CDIError,
    claim_spec_bytes,
    device_env,
    read_claim_specs,
    write_claim_spec,
)
from dracpu.cdi.env import DRAEnvError, parse_dra_env
from dracpu.cpuset import MAX_CPU_ID, CPUSet, CPUSetParseError

PREFIX = "dra.k8s.io-cpu_claim-"
GOOD_UID = "1b2c3d4e-0000-4000-8000-000000000001"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
env_lists = st.lists(
    st.one_of(
        st.builds(lambda cpus: f"DRA_CPUSET_{GOOD_UID}={cpus}", st.text(max_size=10)),
        st.sampled_from([f"DRA_CPUSET_{GOOD_UID}=0-3", "DRA_CPUSET", "PATH=/bin"]),
        st.text(max_size=20),
    ),
    max_size=4,
)


def spec_like() -> st.SearchStrategy[object]:
    """Documents shaped like our spec with any part replaced by junk."""
    device = st.fixed_dictionaries(
        {"name": st.one_of(st.just(f"claim-{GOOD_UID}"), json_values)},
        optional={
            "containerEdits": st.one_of(
                st.fixed_dictionaries({"env": st.one_of(env_lists, json_values)}), json_values
            )
        },
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "cdiVersion": st.sampled_from(["0.3.0", "v0.8.0", "9.9.9", ""]) | json_values,
            "kind": st.sampled_from(["dra.k8s.io/cpu", "other.io/x"]) | json_values,
            "devices": st.lists(device, max_size=3) | json_values,
            "containerEdits": st.fixed_dictionaries({"env": env_lists}) | json_values,
        },
    )


file_bodies = st.one_of(
    spec_like().map(lambda doc: json.dumps(doc).encode()),
    st.binary(max_size=200),
    st.builds(lambda depth: b"[" * depth + b"]" * depth, st.integers(1, 100_000)),
    st.just(claim_spec_bytes(GOOD_UID, CPUSet.parse("0-3"))),
)
file_names = st.one_of(
    st.just(f"{PREFIX}{GOOD_UID}.json"),
    st.builds(
        lambda uid: f"{PREFIX}{uid}.json",
        st.text(alphabet="abc019-_.:/\x00", min_size=0, max_size=12).filter(
            lambda u: "/" not in u and "\x00" not in u
        ),
    ),
    st.sampled_from(["other.json", "x.yaml", f"{PREFIX}.json", f"{PREFIX}...json"]),
)


@fuzz_settings(200)
@given(st.dictionaries(file_names, file_bodies, max_size=4))
def test_read_claim_specs_reports_every_bad_file(files: dict[str, bytes]) -> None:
    with tempfile.TemporaryDirectory() as cdi_dir, bounded():
        for name, body in files.items():
            with open(os.path.join(cdi_dir, name), "wb") as f:
                f.write(body)
        scan = read_claim_specs(cdi_dir)
        ours = [n for n in files if n.startswith(PREFIX) and n.endswith(".json")]
        # Every file named like ours is either a claim or an error; nothing else is looked at.
        assert len(scan.claims) + len(scan.errors) == len(ours)
        for error in scan.errors:
            assert error.startswith(cdi_dir + "/")
        good = f"{PREFIX}{GOOD_UID}.json"
        if files.get(good) == claim_spec_bytes(GOOD_UID, CPUSet.parse("0-3")):
            assert scan.claims[GOOD_UID] == CPUSet.parse("0-3")


@fuzz_settings(200)
@given(
    st.dictionaries(file_names, file_bodies, max_size=3),
    st.lists(
        st.one_of(st.text(max_size=30), st.just(f"dra.k8s.io/cpu=claim-{GOOD_UID}")), max_size=3
    ),
)
def test_device_env_raises_only_cdi_errors(files: dict[str, bytes], ids: list[str]) -> None:
    with tempfile.TemporaryDirectory() as cdi_dir, bounded():
        write_claim_spec(cdi_dir, GOOD_UID, CPUSet.parse("4-5"))
        for name, body in files.items():
            with open(os.path.join(cdi_dir, name), "wb") as f:
                f.write(body)
        try:
            env = device_env(cdi_dir, ids)
        except CDIError as exc:
            assert str(exc)
        else:
            assert all(isinstance(entry, str) for entry in env)


def test_deeply_nested_spec_is_an_error_line_not_a_crash(tmp_path: object) -> None:
    cdi_dir = str(tmp_path)
    path = os.path.join(cdi_dir, f"{PREFIX}{GOOD_UID}.json")
    with open(path, "wb") as f:
        f.write(b"[" * 200_000 + b"]" * 200_000)
    scan = read_claim_specs(cdi_dir)
    assert scan.claims == {}
    assert scan.errors == [f"{path}: invalid JSON: nested too deeply"]


def test_oversized_spec_is_refused_before_parsing(tmp_path: object) -> None:
    cdi_dir = str(tmp_path)
    path = os.path.join(cdi_dir, f"{PREFIX}{GOOD_UID}.json")
    with open(path, "wb") as f:
        f.write(b" " * (MAX_SPEC_BYTES + 1))
    assert read_claim_specs(cdi_dir).errors == [f"{path}: larger than {MAX_SPEC_BYTES} bytes"]


# -- DRA_CPUSET_* and cpuset strings -------------------------------------------------------------

cpuset_texts = st.one_of(
    st.text(max_size=30),  # any unicode: non-ASCII digits, whitespace, signs
    st.lists(
        st.one_of(
            st.integers(0, 2**70).map(str),
            st.tuples(st.integers(0, 2**20), st.integers(0, 2**20)).map(lambda t: f"{t[0]}-{t[1]}"),
            st.sampled_from(["", "-", "1-", "-1", "+1", "0x1", "1_0", "٣", " 1", "1\n"]),
        ),
        max_size=6,
    ).map(",".join),
)


@fuzz_settings(300)
@given(cpuset_texts)
def test_cpuset_parse_raises_only_its_error_and_stays_bounded(text: str) -> None:
    with bounded():
        try:
            cpus = CPUSet.parse(text)
        except CPUSetParseError as exc:
            assert exc.text == text and exc.reason
            return
    assert cpus.mask.bit_length() <= MAX_CPU_ID + 1
    assert CPUSet.parse(cpus.format()) == cpus


@fuzz_settings(300)
@given(
    st.lists(
        st.one_of(
            st.builds(
                lambda key, value: f"DRA_CPUSET{key}={value}",
                st.sampled_from(["_", "_a", "_" + GOOD_UID, "", "X", "_=_"]),
                cpuset_texts,
            ),
            st.builds(lambda key: f"DRA_CPUSET{key}", st.text(max_size=10)),
            st.text(max_size=30),
        ),
        max_size=6,
    )
)
def test_dra_env_raises_only_its_error(env: list[str]) -> None:
    with bounded():
        try:
            claims = parse_dra_env(env)
        except DRAEnvError as exc:
            assert "DRA env entry" in str(exc) or "failed to parse cpuset value" in str(exc)
            return
    for uid, cpus in claims.items():
        assert f"DRA_CPUSET_{uid}={cpus.format()}" in env or any(
            e.startswith(f"DRA_CPUSET_{uid}=") for e in env
        )


@pytest.mark.parametrize("value", ["0-65536", ",".join(["0-65536"] * 2000)])
def test_largest_cpuset_strings_stay_small(value: str) -> None:
    cpus = parse_dra_env([f"DRA_CPUSET_{GOOD_UID}={value}"])[GOOD_UID]
    assert len(cpus) == MAX_CPU_ID + 1
    with pytest.raises(DRAEnvError, match="cpu id above 65536"):
        parse_dra_env([f"DRA_CPUSET_{GOOD_UID}=0-65537"])
