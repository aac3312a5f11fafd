"""The checkpoint file: the checkpoint written atomically, restored at start with the CDI
specs, a corrupt checkpoint kept aside, a reboot, and a state dir that cannot be written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dracpu import cdi
from dracpu.allocation.store import AllocationStore, ClaimRecord
from dracpu.cpuset import CPUSet
from dracpu.daemon.recovery import RecoverySource
from dracpu.state import CheckpointFile, NodeState, StateFileError, read_boot_id

ALL = CPUSet.parse("0-15")


def state(tmp_path: Path, boot: str = "boot-a") -> CheckpointFile:
    return CheckpointFile(
        NodeState(AllocationStore(ALL, CPUSet())),
        str(tmp_path / "state"),
        boot_id=boot,
        config_fingerprint="fp",
    )


def test_checkpoint_round_trip_restores_claims_and_mends_specs(tmp_path: Path) -> None:
    cdi_dir = str(tmp_path / "cdi")
    first = state(tmp_path)
    first.state.restore(
        [
            ClaimRecord(uid="a", cpus=CPUSet.parse("0-3"), namespace="ns", name="x"),
            ClaimRecord(uid="b", cpus=CPUSet.parse("8")),
        ]
    )
    first.write()
    cdi.write_claim_spec(cdi_dir, "a", CPUSet.parse("0-3"))
    cdi.write_claim_spec(cdi_dir, "orphan", CPUSet.parse("9"))
    # No temp file is left next to the checkpoint.
    assert sorted(os.listdir(tmp_path / "state")) == ["checkpoint.json"]

    second = state(tmp_path)
    plan = second.restore(cdi_dir)
    assert plan.source is RecoverySource.CHECKPOINT
    assert {r.uid: (r.cpus.format(), r.name) for r in second.state.view.claims()} == {
        "a": ("0-3", "x"),
        "b": ("8", ""),
    }
    # b's spec was missing and is written again; the orphan is gone.
    assert cdi.read_claim_specs(cdi_dir).claims == {
        "a": CPUSet.parse("0-3"),
        "b": CPUSet.parse("8"),
    }
    assert second.state.view.shared_pool == CPUSet.parse("4-7,9-15")


def test_reboot_starts_empty(tmp_path: Path) -> None:
    cdi_dir = str(tmp_path / "cdi")
    old = state(tmp_path, boot="old")
    old.state.restore([ClaimRecord(uid="a", cpus=CPUSet.parse("0-3"))])
    old.write()
    cdi.write_claim_spec(cdi_dir, "a", CPUSet.parse("0-3"))
    new = state(tmp_path, boot="new")
    plan = new.restore(cdi_dir)
    assert plan.source is RecoverySource.REBOOT
    assert len(new.state.view.claims()) == 0
    assert cdi.read_claim_specs(cdi_dir).claims == {}
    # The checkpoint now says so too.
    saved = json.loads((tmp_path / "state" / "checkpoint.json").read_text())
    assert saved["boot_id"] == "new" and saved["claims"] == []


def test_corrupt_checkpoint_is_kept_aside_and_cdi_specs_are_trusted(tmp_path: Path) -> None:
    cdi_dir = str(tmp_path / "cdi")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "checkpoint.json").write_text('{"version": 1, "boot_id": ')
    cdi.write_claim_spec(cdi_dir, "a", CPUSet.parse("2-3"))
    st = state(tmp_path)
    plan = st.restore(cdi_dir)
    assert plan.source is RecoverySource.CDI
    assert plan.notes[0].startswith("checkpoint not used: checkpoint is corrupt: ")
    assert plan.notes[0].endswith(f"(moved to {tmp_path}/state/checkpoint.json.corrupt)")
    assert (tmp_path / "state" / "checkpoint.json.corrupt").read_text().startswith('{"version"')
    assert {r.uid: r.cpus for r in st.state.view.claims()} == {"a": CPUSet.parse("2-3")}


def test_unwritable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the directory should be")
    st = state(tmp_path)
    with pytest.raises(StateFileError) as info:
        st.write()
    assert str(info.value).startswith(f'failed to write checkpoint "{blocker}/checkpoint.json": ')
    assert st.last_error == str(info.value)


def test_boot_id(tmp_path: Path) -> None:
    path = tmp_path / "sys" / "kernel" / "random"
    path.mkdir(parents=True)
    (path / "boot_id").write_text("abc-123\n")
    assert read_boot_id(str(tmp_path)) == "abc-123"
    assert read_boot_id(str(tmp_path / "missing")) == ""
