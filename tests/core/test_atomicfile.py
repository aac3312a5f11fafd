"""atomic_write: the parent directory is made only when missing, with exactly its mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dracpu import atomicfile
from dracpu.atomicfile import atomic_write


def test_a_missing_parent_is_made_with_its_mode_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "x.json"
    old = os.umask(0o077)
    try:
        atomic_write(str(target), b"one", dir_mode=0o750)
    finally:
        os.umask(old)
    assert target.read_bytes() == b"one"
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o750
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_an_existing_parent_keeps_its_mode_and_no_temp_file_stays(tmp_path: Path) -> None:
    parent = tmp_path / "cdi"
    parent.mkdir(mode=0o700)
    os.chmod(parent, 0o700)
    for data in (b"one", b"two"):
        atomic_write(str(parent / "x.json"), data, mode=0o644, durable=False)
    assert (parent / "x.json").read_bytes() == b"two"
    assert stat.S_IMODE(parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((parent / "x.json").stat().st_mode) == 0o644
    assert os.listdir(parent) == ["x.json"]


def test_a_file_in_the_way_of_the_parent_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError) as info:
        atomic_write(str(tmp_path / "file" / "cdi" / "x.json"), b"one")
    assert info.value.filename == str(tmp_path / "file" / "cdi")
    assert os.listdir(tmp_path) == ["file"]


def test_a_temp_name_in_use_is_passed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Temp names are spec.<random>.tmp: one left by a crash (or drawn twice) is neither
    # reused nor touched, even when it is a link.
    draws = iter([5, 5, 6])
    monkeypatch.setattr(atomicfile.random, "getrandbits", lambda bits: next(draws))
    stale = tmp_path / f"spec.{5:016x}.tmp"
    stale.symlink_to(tmp_path / "elsewhere")
    atomic_write(str(tmp_path / "x.json"), b"new", durable=False)
    assert (tmp_path / "x.json").read_bytes() == b"new"
    assert stale.is_symlink() and not (tmp_path / "elsewhere").exists()
    assert sorted(os.listdir(tmp_path)) == [stale.name, "x.json"]
