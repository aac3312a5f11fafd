"""Start-up recovery decisions (pure): checkpoint from this boot, after a reboot, or none."""

from __future__ import annotations

from dracpu.allocation.checkpoint import CHECKPOINT_VERSION, Checkpoint
from dracpu.allocation.store import ClaimRecord
from dracpu.cpuset import CPUSet
from dracpu.daemon.recovery import RecoverySource, plan_recovery

ALL = CPUSet.parse("0-15")


def cp(*claims: tuple[str, str], boot: str = "boot-a", fp: str = "fp") -> Checkpoint:
    return Checkpoint(
        version=CHECKPOINT_VERSION,
        boot_id=boot,
        config_fingerprint=fp,
        claims=tuple(ClaimRecord(uid=u, cpus=CPUSet.parse(c), name=u) for u, c in claims),
    )


def test_same_boot_trusts_checkpoint_and_mends_specs() -> None:
    plan = plan_recovery(
        checkpoint=cp(("a", "0-1"), ("b", "2-3"), ("c", "4")),
        checkpoint_problem=None,
        boot_id="boot-a",
        config_fingerprint="fp",
        cdi_claims={"a": CPUSet.parse("0-1"), "b": CPUSet.parse("9"), "orphan": CPUSet.parse("8")},
        allocatable=ALL,
    )
    assert plan.source is RecoverySource.CHECKPOINT
    assert [r.uid for r in plan.claims] == ["a", "b", "c"]
    assert plan.claims[0].name == "a"  # the full record is kept, not only the CPUs
    # b's spec disagrees, c's is missing: both written again; a spec no claim holds goes.
    assert plan.write_specs == ("b", "c")
    assert plan.remove_specs == ("orphan",)
    assert plan.notes == ()


def test_reboot_keeps_nothing_and_removes_old_specs() -> None:
    plan = plan_recovery(
        checkpoint=cp(("a", "0-1"), boot="boot-old"),
        checkpoint_problem=None,
        boot_id="boot-new",
        config_fingerprint="fp",
        cdi_claims={"a": CPUSet.parse("0-1")},
        allocatable=ALL,
    )
    assert plan.source is RecoverySource.REBOOT
    assert plan.claims == ()
    assert plan.remove_specs == ("a",)
    assert plan.notes == (
        "node rebooted since the checkpoint (boot boot-old -> boot-new): 1 claim(s) wait for "
        "the kubelet to prepare them again",
    )


def test_no_checkpoint_falls_back_to_cdi_specs_with_overlap_checks() -> None:
    plan = plan_recovery(
        checkpoint=None,
        checkpoint_problem="checkpoint is corrupt: checksum mismatch (moved to x)",
        boot_id="boot-a",
        config_fingerprint="fp",
        cdi_claims={
            "a": CPUSet.parse("0-1"),
            "b": CPUSet.parse("1-2"),
            "c": CPUSet.parse("20"),
            "d": CPUSet.parse("5"),
        },
        allocatable=ALL,
    )
    assert plan.source is RecoverySource.CDI
    assert [(r.uid, r.cpus.format()) for r in plan.claims] == [("a", "0-1"), ("d", "5")]
    assert plan.write_specs == () and plan.remove_specs == ()
    assert plan.notes == (
        "checkpoint not used: checkpoint is corrupt: checksum mismatch (moved to x)",
        'dropped claim "b": CPUs 1 are already held by another recovered claim',
        'dropped claim "c": CPUs 20 are not allocatable on this node any more',
    )


def test_config_change_keeps_claims_that_still_fit() -> None:
    plan = plan_recovery(
        checkpoint=cp(("a", "0-1"), ("b", "14-15"), fp="old"),
        checkpoint_problem=None,
        boot_id="boot-a",
        config_fingerprint="new",
        cdi_claims={"a": CPUSet.parse("0-1"), "b": CPUSet.parse("14-15")},
        allocatable=CPUSet.parse("0-13"),  # 14-15 became reserved
    )
    assert [r.uid for r in plan.claims] == ["a"]
    assert plan.remove_specs == ("b",)
    assert plan.notes == (
        "configuration changed since the checkpoint: keeping the claims that still fit",
        'dropped claim "b": CPUs 14-15 are not allocatable on this node any more',
    )


def test_fresh_node() -> None:
    plan = plan_recovery(
        checkpoint=None,
        checkpoint_problem=None,
        boot_id="b",
        config_fingerprint="fp",
        cdi_claims={},
        allocatable=ALL,
    )
    assert plan.source is RecoverySource.CDI
    assert plan.claims == () and plan.notes == ()
