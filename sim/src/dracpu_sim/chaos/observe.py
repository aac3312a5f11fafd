"""Reading a simulated node into an :class:`~dracpu_sim.chaos.invariants.Observation`.

What the daemon says (``/debug/state``), what it wrote (checkpoint, CDI specs), what the
kubelet prepared and runs, what the cgroup files hold and what the API server publishes:
each from its own source, so that the invariants compare them.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from dracpu import DRIVER_NAME, cdi
from dracpu.allocation.checkpoint import CheckpointError, decode_checkpoint
from dracpu.allocation.floor import unpublished_cpus
from dracpu.config import DriverConfig
from dracpu.cpuset import CPUSet
from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.irq.procfs import IrqFileError, ProcIrq
from dracpu.topology.discover import discover_from_root
from dracpu_sim.chaos.invariants import ContainerView, Observation, PodView, SandboxView
from dracpu_sim.chaos.plan import NAMESPACE
from dracpu_sim.node import SimNode
from dracpu_sim.procfs import FakeIrqs

__all__ = ["desired_slices", "observe_node", "pod_views"]


def desired_slices(
    sysfs_root: str, *, mode: str, reserved_cpus: str, node_name: str, node_uid: str
) -> list[dict[str, Any]]:
    """The ResourceSlices the daemon should publish (``--group-by=numanode``), built from
    the same topology by the same code."""
    topo = discover_from_root(sysfs_root)
    # What the daemon leaves out (its default config: isolated CPUs unpublished too).
    unpublished = unpublished_cpus(
        topo, CPUSet.parse(reserved_cpus), publish_isolated=DriverConfig().publishIsolatedCPUs
    )
    settings = DeviceSettings(
        mode=mode,  # type: ignore[arg-type]
        group_by="numanode",
        reserved=unpublished,
        expose_pcie_roots=False,
        publish_node_allocatable=False,
    )
    return build_slices(
        build_inventory(topo, settings),
        node_name=node_name,
        node_uid=node_uid,
        expose_pcie_roots=False,
    )


def _unschedulable(pod: dict[str, Any]) -> str:
    """The scheduler's PodScheduled=False message ("" when it did not say so)."""
    message = ""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            message = str(cond.get("message") or "unschedulable")
    return message


def pod_views(node: SimNode) -> list[PodView]:
    """The workload namespace's pods, as the API server and the kubelet see them."""
    states = node.pod_states()
    by_uid = {st["uid"]: st for st in states.values()}
    views = []
    for pod in node.api.list("pods", NAMESPACE):
        meta = pod["metadata"]
        st = by_uid.get(meta["uid"])
        views.append(
            PodView(
                ref=f"{meta['namespace']}/{meta['name']}",
                bound=bool((pod.get("spec") or {}).get("nodeName")),
                deleting=bool(meta.get("deletionTimestamp")),
                phase=str(st["phase"]) if st else "",
                unschedulable=_unschedulable(pod),
                last_error=str(st["errors"][-1]) if st and st["errors"] else "",
            )
        )
    return views


def _checkpoint_claims(node: SimNode) -> tuple[dict[str, CPUSet] | None, str]:
    """The claims of the daemon's checkpoint file, or None and why it could not be read."""
    try:
        data = Path(node.state_dir, "checkpoint.json").read_bytes()
        return {r.uid: r.cpus for r in decode_checkpoint(data).claims}, ""
    except (OSError, CheckpointError) as exc:
        return None, str(exc)


def _kubelet_prepared(node: SimNode) -> set[str]:
    snapshot = node.kubelet.snapshot() if node.kubelet is not None else {}
    return {str(c["uid"]) for c in (snapshot.get("prepared_claims") or {}).values()}


def _running_containers(node: SimNode) -> list[ContainerView]:
    """Every container of a running pod, with the CPUs its cgroup allows (effective set)."""
    containers = []
    for ref, st in sorted(node.pod_states().items()):
        if st["phase"] != "Running":
            continue
        for name, ctr in sorted(st["containers"].items()):
            try:
                cpus: str | None = node.cpuset_of(ctr["id"])
            except (KeyError, OSError):
                cpus = None
            containers.append(ContainerView(ref, name, ctr["id"], tuple(ctr["env"]), cpus))
    return containers


def _sandboxes(node: SimNode) -> list[SandboxView]:
    """Every pod sandbox the runtime has, with the CPUs its cgroup allows."""
    if node.runtime is None:
        return []
    views = []
    for pod in sorted(node.runtime.pods, key=lambda p: (p.namespace, p.name)):
        try:
            cpus: str | None = node.runtime.sandbox_cpuset_of(pod.uid)
        except (KeyError, OSError):
            cpus = None
        views.append(SandboxView(f"{pod.namespace}/{pod.name}", pod.id, cpus))
    return views


def _published_slices(node: SimNode) -> list[dict[str, Any]]:
    return [
        s
        for s in node.api.list("resourceslices")
        if (s.get("spec") or {}).get("driver") == DRIVER_NAME
        and (s.get("spec") or {}).get("nodeName") == node.node_name
    ]


def _asks_for_isolation(claim: dict[str, Any]) -> bool:
    """Whether a claim's own opaque config sets isolateIRQs (the chaos run's DeviceClass
    has no config)."""
    for entry in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") == DRIVER_NAME and (opaque.get("parameters") or {}).get(
            "isolateIRQs"
        ):
            return True
    return False


def _read_irqs(irqs: FakeIrqs) -> tuple[dict[int, CPUSet], CPUSet | None]:
    proc = ProcIrq(irqs.proc_root)
    masks: dict[int, CPUSet] = {}
    for irq in irqs.originals:
        with contextlib.suppress(IrqFileError):  # left out: reported as unreadable
            masks[irq] = proc.read_affinity(irq)
    try:
        default: CPUSet | None = proc.read_default().cpus
    except IrqFileError:
        default = None
    return masks, default


async def observe_node(
    node: SimNode,
    *,
    online: CPUSet,
    reserved: CPUSet,
    desired: list[dict[str, Any]],
    irqs: FakeIrqs | None = None,
) -> Observation:
    """Everything the invariants look at, read from the node and its running daemon.

    ``online`` and ``reserved`` are the node's CPUs and the daemon's ``--reserved-cpus``;
    ``desired`` the slices it should publish (:func:`desired_slices`); ``irqs`` the fake
    procfs the daemon was given, if any.
    """
    state = await node.debug_state()
    checkpoint_claims, checkpoint_error = _checkpoint_claims(node)
    scan = cdi.read_claim_specs(node.cdi_dir)
    daemon_claims = {c["uid"]: CPUSet.parse(c["cpus"]) for c in state.get("claims") or []}
    irq_fields: dict[str, Any] = {}
    if irqs is not None:
        banned = CPUSet()
        for claim in node.api.list("resourceclaims", NAMESPACE):
            if _asks_for_isolation(claim):
                banned |= daemon_claims.get(claim["metadata"]["uid"], CPUSet())
        masks, default = _read_irqs(irqs)
        irq_fields = {
            "irq_originals": dict(irqs.originals),
            "irq_affinities": masks,
            "irq_default_original": irqs.default_original,
            "irq_default": default,
            "irq_banned": banned,
        }
    return Observation(
        online=online,
        reserved=reserved,
        daemon_reserved=CPUSet.parse(state.get("reserved") or ""),
        daemon_claims=daemon_claims,
        shared_pool=CPUSet.parse(state.get("sharedPool") or ""),
        checkpoint_claims=checkpoint_claims,
        checkpoint_error=checkpoint_error,
        cdi_claims=dict(scan.claims),
        cdi_errors=list(scan.errors),
        kubelet_prepared=_kubelet_prepared(node),
        containers=_running_containers(node),
        pods=pod_views(node),
        published_slices=_published_slices(node),
        desired_slices=desired,
        daemon_intents={str(c["id"]): str(c["cpus"]) for c in state.get("containers") or []},
        # Sandboxes are containers too (the pause container): the daemon tracks both.
        runtime_containers=(
            {c.id for c in node.runtime.containers} | {p.id for p in node.runtime.pods}
            if node.runtime
            else None
        ),
        sandboxes=_sandboxes(node),
        **irq_fields,
    )
