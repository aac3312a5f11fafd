"""CDI claim specs: exact bytes, atomic write, removal, reading back, resolving device ids
(behavior.md §10.1, §10.2; protocols.md §7)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from dracpu.cdi import (
    CDI_VERSION,
    CDIError,
    claim_spec_bytes,
    claim_spec_path,
    device_env,
    on_memory_filesystem,
    read_claim_specs,
    remove_claim_spec,
    write_claim_spec,
)
from dracpu.cpuset import CPUSet

UID = "3b1d2f3a-1111-4c4c-8d8d-000000000001"
GOLDEN = (
    b'{"cdiVersion":"0.3.0","kind":"dra.k8s.io/cpu","devices":[{"name":"claim-'
    b'3b1d2f3a-1111-4c4c-8d8d-000000000001","containerEdits":{"env":["DRA_CPUSET_'
    b'3b1d2f3a-1111-4c4c-8d8d-000000000001=0-3"]}}],"containerEdits":{}}'
)


def test_golden_bytes() -> None:
    # behavior.md §10.1's shape; cdiVersion is the lowest the content needs (protocols §7.3).
    assert CDI_VERSION == "0.3.0"
    assert claim_spec_bytes(UID, CPUSet.parse("0-3")) == GOLDEN


def test_write_creates_dir_and_file(tmp_path: Path) -> None:
    cdi_dir = tmp_path / "run" / "cdi"
    path = write_claim_spec(str(cdi_dir), UID, CPUSet.parse("0-3"))
    assert path == str(cdi_dir / f"dra.k8s.io-cpu_claim-{UID}.json")
    assert Path(path).read_bytes() == GOLDEN
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(cdi_dir).st_mode) == 0o755
    assert os.listdir(cdi_dir) == [os.path.basename(path)]


def test_rewrite_is_identical_and_single_file(tmp_path: Path) -> None:
    write_claim_spec(str(tmp_path), UID, CPUSet.parse("2-3,10-11"))
    first = Path(claim_spec_path(str(tmp_path), UID)).read_bytes()
    write_claim_spec(str(tmp_path), UID, CPUSet.parse("2-3,10-11"))
    assert Path(claim_spec_path(str(tmp_path), UID)).read_bytes() == first
    assert len(os.listdir(tmp_path)) == 1
    assert json.loads(first)["devices"][0]["containerEdits"]["env"] == [
        f"DRA_CPUSET_{UID}=2-3,10-11"
    ]


def test_write_failure_message_and_no_temp_left(tmp_path: Path) -> None:
    target = Path(claim_spec_path(str(tmp_path), UID))
    (target / "occupied").mkdir(parents=True)
    with pytest.raises(CDIError) as info:
        write_claim_spec(str(tmp_path), UID, CPUSet.parse("1"))
    assert str(info.value).startswith(f'failed to write CDI spec "{target}": ')
    assert os.listdir(tmp_path) == [target.name]


def test_write_into_unusable_dir(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    cdi_dir = tmp_path / "file" / "cdi"
    with pytest.raises(CDIError) as info:
        write_claim_spec(str(cdi_dir), UID, CPUSet.parse("1"))
    path = cdi_dir / f"dra.k8s.io-cpu_claim-{UID}.json"
    assert str(info.value) == (
        f'failed to write CDI spec "{path}": {tmp_path / "file" / "cdi"}: Not a directory'
    )


@pytest.mark.parametrize(
    ("uid", "problem"),
    [
        ("", "must not be empty"),
        ("a/b", "must not contain '/', '..' or NUL"),
        ("..", "must not contain '/', '..' or NUL"),
        ("a..b", "must not contain '/', '..' or NUL"),
        ("a\x00b", "must not contain '/', '..' or NUL"),
        ("x" * 129, "must be at most 128 characters, got 129"),
        (
            "-abc",
            "must start and end with a letter or digit and contain only letters, digits, "
            "'_', '.', ':' and '-'",
        ),
        (
            "a b",
            "must start and end with a letter or digit and contain only letters, digits, "
            "'_', '.', ':' and '-'",
        ),
    ],
)
def test_invalid_claim_uids(tmp_path: Path, uid: str, problem: str) -> None:
    for call in (
        lambda: write_claim_spec(str(tmp_path), uid, CPUSet.parse("1")),
        lambda: remove_claim_spec(str(tmp_path), uid),
    ):
        with pytest.raises(CDIError) as info:
            call()
        quoted = json.dumps(uid).replace("\\u0000", "\\x00")
        assert str(info.value) == f"invalid claim UID {quoted}: {problem}"
    assert os.listdir(tmp_path) == []


def test_remove(tmp_path: Path) -> None:
    write_claim_spec(str(tmp_path), UID, CPUSet.parse("1"))
    remove_claim_spec(str(tmp_path), UID)
    assert os.listdir(tmp_path) == []
    remove_claim_spec(str(tmp_path), UID)  # already gone: fine
    remove_claim_spec(str(tmp_path / "missing-dir"), UID)


@pytest.mark.parametrize("durable", [True, False])
def test_fsyncs_only_when_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = write_claim_spec(str(tmp_path), UID, CPUSet.parse("0-3"), durable=durable)
    assert Path(path).read_bytes() == GOLDEN
    assert len(synced) == (2 if durable else 0)  # the file, then the directory
    remove_claim_spec(str(tmp_path), UID, durable=durable)
    assert os.listdir(tmp_path) == []
    assert len(synced) == (3 if durable else 0)


def test_remove_failure(tmp_path: Path) -> None:
    target = Path(claim_spec_path(str(tmp_path), UID))
    (target / "x").mkdir(parents=True)
    with pytest.raises(CDIError) as info:
        remove_claim_spec(str(tmp_path), UID)
    assert str(info.value).startswith(f'failed to remove CDI spec "{target}": {target}: ')


def _spec(kind: str, name: str, env: list[str], version: str = "0.8.0") -> str:
    return json.dumps(
        {
            "cdiVersion": version,
            "kind": kind,
            "devices": [{"name": name, "containerEdits": {"env": env}}],
        }
    )


def test_read_claim_specs(tmp_path: Path) -> None:
    write_claim_spec(str(tmp_path), "u1", CPUSet.parse("0-1"))
    write_claim_spec(str(tmp_path), "u2", CPUSet.parse("4,6"))
    # Upstream's 0.8.0 specs are read too.
    (tmp_path / "dra.k8s.io-cpu_claim-u3.json").write_text(
        _spec("dra.k8s.io/cpu", "claim-u3", ["DRA_CPUSET_u3=9"])
    )
    bad = {
        "dra.k8s.io-cpu_claim-j.json": "{not json",
        "dra.k8s.io-cpu_claim-k.json": _spec("other.example.com/cpu", "claim-k", []),
        "dra.k8s.io-cpu_claim-e.json": _spec("dra.k8s.io/cpu", "claim-e", ["X=1"]),
        "dra.k8s.io-cpu_claim-v.json": _spec("dra.k8s.io/cpu", "claim-v", [], "9.9.9"),
        "dra.k8s.io-cpu_claim-m.json": _spec("dra.k8s.io/cpu", "claim-m", ["DRA_CPUSET_m=x"]),
        "dra.k8s.io-cpu_claim-n.json": _spec("dra.k8s.io/cpu", "claim-other", ["A=1"]),
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
    # Not ours or not a spec: ignored.
    (tmp_path / "vendor.example.com-gpu.json").write_text("{garbage")
    (tmp_path / "spec.123.tmp").write_text("{")
    scan = read_claim_specs(str(tmp_path))
    assert scan.claims == {
        "u1": CPUSet.parse("0-1"),
        "u2": CPUSet.parse("4,6"),
        "u3": CPUSet.parse("9"),
    }
    d = str(tmp_path)
    assert sorted(scan.errors) == sorted(
        [
            f"{d}/dra.k8s.io-cpu_claim-j.json: invalid JSON: "
            "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
            f'{d}/dra.k8s.io-cpu_claim-k.json: kind is "other.example.com/cpu", '
            'expected "dra.k8s.io/cpu"',
            f'{d}/dra.k8s.io-cpu_claim-e.json: device "claim-e" has no DRA_CPUSET_e env entry',
            f'{d}/dra.k8s.io-cpu_claim-v.json: unsupported cdiVersion "9.9.9"',
            f"{d}/dra.k8s.io-cpu_claim-m.json: failed to parse cpuset value "
            '"x" from env "DRA_CPUSET_m=x": ' + str(_parse_error("x")),
            f'{d}/dra.k8s.io-cpu_claim-n.json: no device named "claim-n"',
        ]
    )


def _parse_error(text: str) -> Exception:
    try:
        CPUSet.parse(text)
    except ValueError as exc:
        return exc
    raise AssertionError("parsed")


def test_read_missing_dir_is_empty(tmp_path: Path) -> None:
    scan = read_claim_specs(str(tmp_path / "nope"))
    assert (scan.claims, scan.errors) == ({}, [])


def test_device_env_resolves_like_a_runtime(tmp_path: Path) -> None:
    write_claim_spec(str(tmp_path), "u1", CPUSet.parse("0-1"))
    (tmp_path / "vendor.example.com-gpu.json").write_text(
        json.dumps(
            {
                "cdiVersion": "0.6.0",
                "kind": "vendor.example.com/gpu",
                "devices": [{"name": "g0", "containerEdits": {"env": ["GPU=0"]}}],
                "containerEdits": {"env": ["COMMON=1"]},
            }
        )
    )
    (tmp_path / "broken.json").write_text("{")  # skipped, the others still resolve
    ids = ["dra.k8s.io/cpu=claim-u1", "vendor.example.com/gpu=g0"]
    assert device_env(str(tmp_path), ids) == ["DRA_CPUSET_u1=0-1", "GPU=0", "COMMON=1"]
    with pytest.raises(CDIError) as info:
        device_env(str(tmp_path), ["dra.k8s.io/cpu=claim-u9"])
    assert str(info.value) == 'failed to find CDI device "claim-u9"'
    with pytest.raises(CDIError) as info:
        device_env(str(tmp_path), ["claim-u1"])
    assert str(info.value) == 'invalid CDI device id "claim-u1"'


def test_device_env_conflict(tmp_path: Path) -> None:
    write_claim_spec(str(tmp_path), "u1", CPUSet.parse("0-1"))
    (tmp_path / "copy.json").write_text(_spec("dra.k8s.io/cpu", "claim-u1", ["DRA_CPUSET_u1=5"]))
    with pytest.raises(CDIError) as info:
        device_env(str(tmp_path), ["dra.k8s.io/cpu=claim-u1"])
    assert str(info.value) == 'conflicting CDI specs define device "dra.k8s.io/cpu=claim-u1"'


def test_on_memory_filesystem(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda / ext4 rw,relatime 0 0\n"
        "tmpfs /run tmpfs rw,nosuid 0 0\n"
        "/dev/vdb /run/disk\\040dir ext4 rw 0 0\n"
        "tmpfs /var/lib/kubelet tmpfs rw 0 0\n"
    )
    m = str(mounts)
    assert on_memory_filesystem("/run/cdi", m)
    assert on_memory_filesystem("/run", m)
    assert not on_memory_filesystem("/run/disk dir/cdi", m)
    assert not on_memory_filesystem("/runner/cdi", m)  # a prefix of the name is not a parent
    assert not on_memory_filesystem("/etc/cdi", m)
    assert not on_memory_filesystem("/run/cdi", str(tmp_path / "no-such-file"))
