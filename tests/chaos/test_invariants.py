"""The invariant checker catches each kind of violation, on doctored observations."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dracpu.cpuset import CPUSet
from dracpu_sim.chaos import (
    ContainerView,
    Observation,
    PodView,
    SandboxView,
    Violation,
    check_invariants,
    slice_devices,
)

A, B = "11111111-aaaa-4000-8000-000000000001", "22222222-bbbb-4000-8000-000000000002"


def env_of(uid: str, cpus: str) -> tuple[str, ...]:
    return ("PATH=/bin", f"DRA_CPUSET_{uid}={cpus}")


def a_slice(name: str, devices: list[str], *, count: int = 2, generation: int = 1) -> Any:
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": "dra.cpu",
            "nodeName": "demo-node",
            "pool": {"name": "demo-node", "generation": generation, "resourceSliceCount": count},
            "devices": [{"name": d, "capacity": {"dra.cpu/cpu": {"value": "8"}}} for d in devices],
        },
    }


def consistent() -> Observation:
    """A 16-CPU node, CPUs 0 and 8 reserved, two claims, three running containers."""
    claims = {A: CPUSet.parse("1-2"), B: CPUSet.parse("9-11")}
    desired = [a_slice("00000-x", ["d0", "d1"]), a_slice("00001-x", ["d2"])]
    return Observation(
        online=CPUSet.parse("0-15"),
        reserved=CPUSet.parse("0,8"),
        daemon_reserved=CPUSet.parse("0,8"),
        daemon_claims=dict(claims),
        shared_pool=CPUSet.parse("0,3-8,12-15"),
        checkpoint_claims=dict(claims),
        cdi_claims=dict(claims),
        kubelet_prepared={A, B},
        containers=[
            ContainerView("default/pa", "app", "c1" * 16, env_of(A, "1-2"), "1-2"),
            ContainerView("default/pa", "sidecar", "c2" * 16, ("PATH=/bin",), "0,3-8,12-15"),
            ContainerView("default/pb", "app", "c3" * 16, env_of(B, "9-11"), "9-11"),
        ],
        pods=[
            PodView("default/pa", bound=True, deleting=False, phase="Running"),
            PodView("default/pb", bound=True, deleting=False, phase="Running"),
            PodView("default/big", bound=False, deleting=False, phase="", unschedulable="no"),
        ],
        published_slices=copy.deepcopy(list(reversed(desired))),
        desired_slices=desired,
        sandboxes=[
            SandboxView("default/pa", "s1" * 16, "0,3-8,12-15"),
            SandboxView("default/pb", "s2" * 16, "0,3-8,12-15"),  # reserved CPUs are fine
        ],
    )


def kinds(obs: Observation) -> list[str]:
    return [v.kind for v in check_invariants(obs)]


def test_a_consistent_node_has_no_violation() -> None:
    assert check_invariants(consistent()) == []


def test_cpu_in_two_claims() -> None:
    obs = consistent()
    obs.daemon_claims[B] = CPUSet.parse("2,9-11")
    obs.checkpoint_claims = dict(obs.daemon_claims)
    obs.cdi_claims = dict(obs.daemon_claims)
    violations = check_invariants(obs)
    assert (
        Violation("cpu-in-two-claims", f"claim {B} shares CPUs 2 with another claim") in violations
    )
    # The container's env still says 9-11, so the env check notices the change as well.
    assert "env-claim-mismatch" in [v.kind for v in violations]


def test_reserved_cpu_in_a_claim_and_a_wrong_reserved_set() -> None:
    obs = consistent()
    obs.daemon_claims[A] = obs.checkpoint_claims[A] = obs.cdi_claims[A] = CPUSet.parse("0-2")  # type: ignore[index]
    obs.containers[0] = ContainerView("default/pa", "app", "c1" * 16, env_of(A, "0-2"), "0-2")
    violations = check_invariants(obs)
    assert Violation("reserved-cpu-in-claim", f"claim {A} holds reserved CPUs 0") in violations
    obs = consistent()
    obs.daemon_reserved = CPUSet.parse("0")
    assert kinds(obs) == ["reserved-mismatch"]


def test_offline_cpu_and_empty_claim() -> None:
    obs = consistent()
    obs.daemon_claims["u3"] = CPUSet()
    obs.daemon_claims["u4"] = CPUSet.parse("40")
    assert {"empty-claim", "offline-cpu-in-claim"} <= set(kinds(obs))


def test_shared_pool_must_be_everything_else() -> None:
    obs = consistent()
    obs.shared_pool = CPUSet.parse("3-7,12-14")  # without the reserved floor 0,8 and CPU 15
    obs.containers[1] = ContainerView("default/pa", "sidecar", "c2" * 16, (), "3-7,12-14")
    assert check_invariants(obs) == [
        Violation(
            "shared-pool-mismatch",
            "shared pool 3-7,12-14, want 0,3-8,12-15 (online minus claims)",
        )
    ]


def test_checkpoint_and_cdi_must_say_what_the_daemon_holds() -> None:
    obs = consistent()
    assert obs.checkpoint_claims is not None
    del obs.checkpoint_claims[B]
    assert check_invariants(obs) == [
        Violation("checkpoint-mismatch", f"checkpoint vs daemon: {B}: absent vs 9-11")
    ]
    obs = consistent()
    obs.checkpoint_claims = None
    obs.checkpoint_error = "checkpoint.json: bad checksum"
    assert check_invariants(obs) == [
        Violation("checkpoint-unreadable", "checkpoint.json: bad checksum")
    ]
    obs = consistent()
    obs.cdi_claims["orphan"] = CPUSet.parse("4")  # a spec left behind: the vice versa
    obs.cdi_errors.append("/cdi/dra.cpu-claim_x.json: not JSON")
    assert check_invariants(obs) == [
        Violation("cdi-spec-unreadable", "/cdi/dra.cpu-claim_x.json: not JSON"),
        Violation("cdi-mismatch", "CDI specs vs daemon: orphan: 4 vs absent"),
    ]


def test_claims_leaked_or_lost_against_the_kubelet() -> None:
    obs = consistent()
    obs.kubelet_prepared = {A, "gone"}
    assert check_invariants(obs) == [
        Violation(
            "claim-leaked",
            f"the daemon holds claim {B} (9-11), which the kubelet has not prepared",
        ),
        Violation("claim-lost", "the kubelet has claim gone prepared; the daemon does not"),
    ]


@pytest.mark.parametrize(
    ("index", "cgroup", "message", "extra"),
    [
        (
            0,
            "1-3",
            "container default/pa/app (c1c1c1c1c1c1): cgroup cpuset 1-3, its claims is 1-2",
            [],
        ),
        (
            1,
            "0-15",
            "container default/pa/sidecar (c2c2c2c2c2c2): cgroup cpuset 0-15, "
            "the shared pool is 0,3-8,12-15",
            [
                Violation(
                    "shared-on-claimed-cpu",
                    "container default/pa/sidecar (c2c2c2c2c2c2) holds no claim but its "
                    "cgroup allows claimed CPUs 1-2,9-11",
                )
            ],
        ),
    ],
)
def test_cgroup_cpuset_must_be_the_intended_one(
    index: int, cgroup: str, message: str, extra: list[Violation]
) -> None:
    obs = consistent()
    old = obs.containers[index]
    obs.containers[index] = ContainerView(old.pod, old.name, old.container_id, old.env, cgroup)
    assert check_invariants(obs) == [Violation("cpuset-mismatch", message), *extra]


def test_no_sandbox_on_a_claimed_cpu() -> None:
    obs = consistent()
    obs.sandboxes.append(SandboxView("default/pc", "s3" * 16, "0-15"))  # all CPUs: v1 copy
    obs.sandboxes.append(SandboxView("default/pd", "s4" * 16, "2,3"))
    assert check_invariants(obs) == [
        Violation(
            "sandbox-on-claimed-cpu",
            "pod sandbox of default/pc (s3s3s3s3s3s3): its cgroup allows claimed CPUs 1-2,9-11",
        ),
        Violation(
            "sandbox-on-claimed-cpu",
            "pod sandbox of default/pd (s4s4s4s4s4s4): its cgroup allows claimed CPUs 2",
        ),
    ]


def test_sandboxes_and_shared_containers_may_use_every_cpu_when_nothing_is_claimed() -> None:
    obs = consistent()
    obs.daemon_claims = {}
    obs.sandboxes.append(SandboxView("default/pc", "s3" * 16, "0-15"))
    assert "sandbox-on-claimed-cpu" not in kinds(obs)
    assert "shared-on-claimed-cpu" not in kinds(obs)


def test_a_sandbox_without_a_cgroup_or_a_garbled_one_is_not_on_claimed_cpus() -> None:
    obs = consistent()
    obs.sandboxes = [
        SandboxView("default/pa", "s1" * 16, None),
        SandboxView("default/pb", "s2" * 16, "x-y"),
    ]
    assert check_invariants(obs) == []


def test_container_env_naming_a_claim_the_daemon_lost_or_changed() -> None:
    obs = consistent()
    obs.containers.append(
        ContainerView("default/pc", "app", "c4" * 16, env_of("lost-claim", "4"), "4")
    )
    assert check_invariants(obs) == [
        Violation(
            "env-claim-mismatch",
            "container default/pc/app (c4c4c4c4c4c4): env says claim lost-claim is 4, "
            "the daemon: not prepared",
        )
    ]


def test_missing_or_unreadable_cgroup_and_bad_env() -> None:
    obs = consistent()
    old = obs.containers[2]
    obs.containers[2] = ContainerView(old.pod, old.name, old.container_id, old.env, None)
    obs.containers[1] = ContainerView("default/pa", "sidecar", "c2" * 16, (), "x-y")
    obs.containers.append(ContainerView("default/pd", "app", "c5" * 16, ("DRA_CPUSET_U",), "3"))
    assert kinds(obs) == ["cgroup-unreadable", "cgroup-missing", "bad-env"]


def test_pods_bound_must_run_deleted_must_go_unbound_must_say_why() -> None:
    obs = consistent()
    obs.pods = [
        PodView("default/pa", True, False, "Pending", last_error="prepare failed: boom"),
        PodView("default/pb", True, True, "Terminating"),
        PodView("default/pc", False, False, ""),
    ]
    assert check_invariants(obs) == [
        Violation(
            "pod-not-running",
            "pod default/pa is bound (its claims allocated) but Pending: prepare failed: boom",
        ),
        Violation(
            "pod-not-deleted",
            "pod default/pb was deleted but is still there (kubelet: Terminating)",
        ),
        Violation("pod-not-scheduled", "pod default/pc is neither bound nor unschedulable"),
    ]


def test_slices_must_equal_the_desired_ones() -> None:
    obs = consistent()
    obs.published_slices.pop()  # an externally deleted slice not re-created
    assert check_invariants(obs) == [
        Violation("slices-mismatch", "1 ResourceSlices published, want 2"),
        Violation("slices-mismatch", "devices ['d2']... (1), want ['d0', 'd1', 'd2']... (3)"),
    ]
    obs = consistent()
    obs.published_slices[0]["spec"]["devices"][0]["capacity"]["dra.cpu/cpu"]["value"] = "7"
    assert check_invariants(obs) == [
        Violation("slices-mismatch", "device d2 differs from the one built from the topology")
    ]
    obs = consistent()
    obs.published_slices[0]["spec"]["pool"]["generation"] = 2
    assert kinds(obs) == ["slices-mismatch"]
    obs = consistent()
    obs.published_slices[1]["spec"]["pool"]["resourceSliceCount"] = 3
    assert check_invariants(obs) == [
        Violation("slices-mismatch", "slice 00000-x says resourceSliceCount 3, want 2")
    ]


def test_slice_devices_follow_the_index_prefix() -> None:
    slices = [a_slice("00001-b", ["z"]), a_slice("00000-a", ["y", "x"])]
    assert [d["name"] for d in slice_devices(slices)] == ["y", "x", "z"]


def with_tables(obs: Observation) -> Observation:
    obs.daemon_intents = {"c1" * 16: "1-2", "c2" * 16: "0,3-8,12-15", "c3" * 16: "9-11"}
    obs.runtime_containers = {"c1" * 16, "c2" * 16, "c3" * 16}
    return obs


def test_the_daemon_container_table_matches_the_runtime() -> None:
    assert check_invariants(with_tables(consistent())) == []
    obs = with_tables(consistent())
    assert obs.daemon_intents is not None and obs.runtime_containers is not None
    del obs.daemon_intents["c3" * 16]
    obs.daemon_intents["c2" * 16] = "3-7"
    obs.daemon_intents["gone" * 8] = "0,3-8,12-15"
    assert check_invariants(obs) == [
        Violation(
            "intent-mismatch",
            "container default/pa/sidecar (c2c2c2c2c2c2): the daemon intends 3-7, want 0,3-8,12-15",
        ),
        Violation(
            "intent-missing", "container default/pb/app (c3c3c3c3c3c3): the daemon does not know it"
        ),
        Violation("intent-stale", "the daemon still tracks removed container gonegonegone"),
    ]
