"""The chaos invariant on interrupts (pure): no interrupt on the CPUs of prepared claims
that asked for isolateIRQs, and every mask its original minus those CPUs."""

from __future__ import annotations

from pathlib import Path

from dracpu.cpuset import CPUSet
from dracpu.irq.procfs import ProcIrq
from dracpu_sim.chaos.invariants import Observation, check_invariants
from dracpu_sim.procfs import make_fake_procfs

C = CPUSet.parse
ORIGINALS = {0: C("0"), 8: C("0-7"), 16: C("0-3")}


def observation(masks: dict[int, str], default: str, banned: str) -> Observation:
    return Observation(
        online=C("0-7"),
        reserved=CPUSet(),
        daemon_reserved=CPUSet(),
        daemon_claims={"u1": C("4-5")} if banned else {},
        shared_pool=C("0-3,6-7") if banned else C("0-7"),
        checkpoint_claims={"u1": C("4-5")} if banned else {},
        cdi_claims={"u1": C("4-5")} if banned else {},
        kubelet_prepared={"u1"} if banned else set(),
        irq_originals=ORIGINALS,
        irq_affinities={k: C(v) for k, v in masks.items()},
        irq_default_original=C("0-7"),
        irq_default=C(default),
        irq_banned=C(banned),
    )


def kinds(obs: Observation) -> list[str]:
    return [v.kind for v in check_invariants(obs)]


def test_masks_without_the_banned_cpus_hold() -> None:
    assert kinds(observation({0: "0", 8: "0-3,6-7", 16: "0-3"}, "0-3,6-7", "4-5")) == []


def test_an_interrupt_on_a_banned_cpu_is_named() -> None:
    violations = check_invariants(observation({0: "0", 8: "0-7", 16: "0-3"}, "0-3,6-7", "4-5"))
    assert [str(v) for v in violations] == [
        "violation: irq-on-isolated-cpu: interrupt 8 may run on 4-5, CPUs of prepared claims "
        "that asked for isolateIRQs"
    ]


def test_a_ban_left_after_the_claims_went_is_named() -> None:
    violations = check_invariants(observation({0: "0", 8: "0-3,6-7", 16: "0-3"}, "0-7", ""))
    assert [str(v) for v in violations] == [
        "violation: irq-mask-wrong: interrupt 8 has 0-3,6-7, want 0-7 (its original 0-7 minus "
        "the banned nothing)"
    ]


def test_the_default_affinity_is_checked_too() -> None:
    assert kinds(observation({0: "0", 8: "0-3,6-7", 16: "0-3"}, "0-7", "4-5")) == [
        "irq-on-isolated-cpu"
    ]


def test_an_unreadable_mask_is_a_violation() -> None:
    assert kinds(observation({0: "0", 16: "0-3"}, "0-3,6-7", "4-5")) == ["irq-unreadable"]


def test_without_a_fake_procfs_nothing_is_checked() -> None:
    obs = observation({}, "0", "4-5")
    obs.irq_originals = None
    assert kinds(obs) == []


def test_the_fake_procfs_reads_as_the_kernel_would_print_it(tmp_path: Path) -> None:
    irqs = make_fake_procfs(str(tmp_path), C("0-79"))
    proc = ProcIrq(irqs.proc_root)
    assert proc.default_path.endswith("/proc/irq/default_smp_affinity")
    assert Path(proc.default_path).read_text() == "ffff,ffffffff,ffffffff\n"
    assert proc.read_default().cpus == C("0-79")
    assert {i: proc.read_affinity(i) for i in proc.irqs()} == irqs.originals
    # Every original holds the first CPU, which the chaos run reserves: none can be emptied.
    assert all(0 in cpus for cpus in irqs.originals.values())
