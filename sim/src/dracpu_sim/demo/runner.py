"""`dracpu demo`: the real daemon on a simulated node, a scenario applied, and what happened.

Steps, each reported on a progress line: start the simulated node (API server, NRI
runtime with a cgroup v1 or v2 tree laid out for the cgroupfs or systemd driver, kubelet,
scheduler) in a temp directory; start `dracpu run` as a
child process against it; wait for its slices; apply the scenario (claim templates and
claims, then one pod at a time, each waited for until it runs or is stuck with a reason, so
the same inputs give the same CPUs every run); delete the pods marked for deletion and wait
for their claims to be unprepared; then read back the published devices, each claim's CPUs
(from the daemon's ``/debug/state``) and each container's cpuset (from the cgroup tree) and
print them with the CPU map.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import trio

from dracpu.cpumap import render_cpu_map, rows_from_topology
from dracpu.cpuset import CPUSet
from dracpu.k8s.client import K8sError
from dracpu.topology.model import Topology
from dracpu_sim.apiserver import SimAPIServer
from dracpu_sim.apiserver.errors import ApiError
from dracpu_sim.demo.claim_status import read_statuses, status_line
from dracpu_sim.demo.offline import (
    OFFLINE_AFTER_START,
    OfflineError,
    offline_round_trip,
    pods_to_offline,
    writable_sysfs,
)
from dracpu_sim.demo.scenario import DRIVER, Scenario, node_slice
from dracpu_sim.demo.stand_in import StandInDriver, stand_in_drivers
from dracpu_sim.demo.uids import UIDNames
from dracpu_sim.node import DaemonProcess, SimNode, SimNodeError
from dracpu_sim.scheduler.templates import generated_claim_names, template_entries

__all__ = ["DemoError", "DemoOptions", "DemoResult", "run_demo"]

SETTLE_TIMEOUT = 30.0
CONVERGE_TIMEOUT = 3.0  # for the containers' cpusets to follow the last pool change


class DemoError(Exception):
    """The demo could not run; the message says which step failed."""


@dataclass
class DemoOptions:
    sysfs_root: str
    topology: Topology
    scenario: Scenario
    mode: str = "grouped"
    group_by: str = "numanode"
    reserved: str = ""
    output: str = "text"
    keep_running: bool = False
    workdir: str | None = None
    cgroup_version: int = 2
    cgroup_driver: str = "systemd"
    expose_pcie_roots: bool = False


@dataclass
class DemoResult:
    slices: list[dict[str, Any]] = field(default_factory=list)
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)
    containers: dict[str, str] = field(default_factory=dict)
    # container -> "shared pool", "exclusive", "exclusive + shared pool" or "unexpected"
    container_kinds: dict[str, str] = field(default_factory=dict)
    shared_pool: str = ""
    reserved: str = ""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        return {
            "slices": self.slices,
            "claims": self.claims,
            "containers": self.containers,
            "notes": self.notes,
        }


@dataclass
class _Applied:
    """What applying the scenario left behind: each pod's problem (if it does not run) and
    the claims generated for it from templates (pod claim name -> claim name)."""

    problems: dict[str, str] = field(default_factory=dict)
    generated: dict[str, dict[str, str]] = field(default_factory=dict)
    names: UIDNames = field(default_factory=UIDNames)


def _without_prefix(text: str, prefix: str) -> str:
    """A message minus the subject the caller already names ("claim ns/x: ...")."""
    return text[len(prefix) :] if text.startswith(prefix) else text


class _Progress:
    def __init__(self, out: TextIO, enabled: bool) -> None:
        self.out = out
        self.enabled = enabled
        self.start = time.monotonic()

    def __call__(self, text: str) -> None:
        if self.enabled:
            elapsed = time.monotonic() - self.start
            self.out.write(f"[{elapsed:5.1f}s] {text}\n")
            self.out.flush()


def _claim_key(obj: dict[str, Any]) -> str:
    return f"{obj['metadata'].get('namespace', 'default')}/{obj['metadata']['name']}"


def _pod_problem(node: SimNode, pod_ref: str) -> str | None:
    """Why a pod is not running, once the kubelet or the scheduler has said so: the
    kubelet's last start error, or the scheduler's ``PodScheduled=False`` (Unschedulable)
    condition on a pod it has not bound."""
    state = node.pod_states().get(pod_ref)
    if state is not None and state["errors"]:
        return str(state["errors"][-1])
    ns, name = pod_ref.split("/", 1)
    try:
        pod = node.api.get("pods", name, ns)
    except ApiError:
        return None
    if (pod.get("spec") or {}).get("nodeName"):
        return None  # bound: the kubelet has the next word
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (condition.get("type"), condition.get("status"), condition.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            return str(condition.get("message", "unschedulable"))
    return None


async def _wait_settled(
    node: SimNode, pods: list[str], progress: Callable[[str], None], names: UIDNames
) -> dict[str, str]:
    """Wait until each pod runs or the kubelet or scheduler has said why it does not (no
    second look: in the demo nothing changes that would let a refused pod start);
    returns pod -> problem."""
    reported: set[str] = set()
    problems: dict[str, str] = {}
    with trio.move_on_after(SETTLE_TIMEOUT):
        while True:
            states = node.pod_states()
            pending = False
            for ref in pods:
                st = states.get(ref)
                if st is not None and st["phase"] == "Running":
                    if ref not in reported:
                        reported.add(ref)
                        ctrs = ", ".join(
                            f"{name}={node.cpuset_of(c['id'])}"
                            for name, c in st["containers"].items()
                        )
                        progress(f"pod {ref} running: {ctrs}")
                    problems.pop(ref, None)
                    continue
                problem = _pod_problem(node, ref)
                if problem is not None:
                    problem = names.refresh(node).name(problem)
                    if problems.get(ref) != problem:
                        progress(f"pod {ref} not running: {problem}")
                    problems[ref] = problem
                else:
                    pending = True
            if not pending and len(reported) + len(problems) == len(pods):
                return problems
            await trio.sleep(0.05)
    for ref in pods:
        if ref not in reported and ref not in problems:
            problems[ref] = f"not running after {SETTLE_TIMEOUT:.0f} s"
    return problems


async def _wait_gone(node: SimNode, ref: str, claim_uids: set[str]) -> bool:
    with trio.move_on_after(SETTLE_TIMEOUT):
        while True:
            st = node.pod_states().get(ref)
            state = await node.debug_state()
            held = {c["uid"] for c in state.get("claims") or []}
            if (st is None or st["phase"] == "Terminated") and not (held & claim_uids):
                return True
            await trio.sleep(0.1)
    return False


def _attribute_text(value: dict[str, Any]) -> str:
    """An attribute's value as text: a list-type one (``strings``, ...) comma-separated."""
    raw = next(iter(value.values()), "")
    return ",".join(str(v) for v in raw) if isinstance(raw, list) else str(raw)


def _devices_line(slices: list[dict[str, Any]]) -> list[str]:
    """Our devices first, then other drivers' (named ``driver/device``)."""
    rows: list[tuple[str, str]] = []
    ordered = sorted(slices, key=lambda s: s["spec"].get("driver") != DRIVER)
    for s in ordered:
        driver = s["spec"].get("driver")
        for dev in s["spec"].get("devices") or []:
            attrs = dev.get("attributes") or {}
            cap = (dev.get("capacity") or {}).get("dra.cpu/cpu", {}).get("value")
            bits = []
            if cap is not None:
                bits.append(f"capacity {cap} CPUs")
            for key, label in (
                ("dra.cpu/cpuID", "cpu"),
                ("resource.kubernetes.io/numaNode", "NUMA"),
                ("dra.cpu/socketID", "socket"),
                ("dra.cpu/coreID", "core"),
                ("resource.kubernetes.io/pcieRoot", "PCIe root"),
            ):
                if key in attrs:
                    bits.append(f"{label} {_attribute_text(attrs[key])}")
            name = dev["name"] if driver == DRIVER else f"{driver}/{dev['name']}"
            rows.append((name, ", ".join(bits)))
    width = max((len(name) for name, _ in rows), default=0)
    return [f"  {name:<{max(width, 16)}} {text}" for name, text in rows]


def _claim_device_lines(claim: dict[str, Any]) -> list[str]:
    """One line per device of a claim that holds devices of other drivers too."""
    devices = claim.get("devices") or []
    if all(d["driver"] == DRIVER for d in devices):
        return []  # the CPUs say it all
    return [
        f"      {d['request']}: {d['driver']} pool {d['pool']} device {d['device']}\n"
        for d in devices
    ]


def _claim_rows(
    scenario: Scenario, applied: _Applied
) -> list[tuple[str, list[str], dict[str, Any]]]:
    """(claim key, pods using it, extra report fields) for every claim: the scenario's own,
    then those generated from templates, in pod order."""
    rows: list[tuple[str, list[str], dict[str, Any]]] = []
    for claim in scenario.claims:
        ns, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        users = [
            _claim_key(p)
            for p in scenario.pods
            if p["metadata"]["namespace"] == ns
            and any(
                r.get("resourceClaimName") == name for r in p["spec"].get("resourceClaims") or []
            )
        ]
        rows.append((f"{ns}/{name}", users, {}))
    for pod in scenario.pods:
        ref = _claim_key(pod)
        generated = applied.generated.get(ref, {})
        for pod_claim, template in template_entries(pod):
            claim_name = generated.get(pod_claim)
            key = f"{pod['metadata']['namespace']}/{claim_name or f'{pod_claim} of {ref}'}"
            rows.append((key, [ref], {"pod": ref, "template": template}))
    return rows


def _container_claims(scenario: Scenario, applied: _Applied) -> dict[str, list[str]]:
    """``ns/pod/container`` -> the claim keys (``ns/name``) the container uses, from its
    ``resources.claims`` and the pod's ``spec.resourceClaims`` (generated names included)."""
    out: dict[str, list[str]] = {}
    for pod in scenario.pods:
        ns, ref = pod["metadata"]["namespace"], _claim_key(pod)
        generated = applied.generated.get(ref, {})
        claim_of = {
            entry.get("name"): entry.get("resourceClaimName") or generated.get(entry.get("name"))
            for entry in pod["spec"].get("resourceClaims") or []
        }
        for ctr in pod["spec"]["containers"]:
            uses = [
                claim_of.get(u.get("name"))
                for u in (ctr.get("resources") or {}).get("claims") or []
            ]
            out[f"{ref}/{ctr['name']}"] = [f"{ns}/{name}" for name in uses if name]
    return out


def claim_devices(claim: dict[str, Any]) -> list[dict[str, str]]:
    """Every device allocated to a claim, ours and other drivers': request, driver, pool,
    device, in the allocation's order (empty while the claim is not allocated)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [
        {key: str(result.get(key, "")) for key in ("request", "driver", "pool", "device")}
        for result in (allocation.get("devices") or {}).get("results") or []
    ]


def container_kind(cpus: CPUSet, claimed: CPUSet, shared_pool: CPUSet) -> str:
    """What a container's cpuset read back is: ``shared pool``; ``exclusive`` (exactly its
    claims' CPUs); ``exclusive + shared pool`` (its claims' CPUs and the shared pool: a
    claim with ``sharedPoolAccess``); anything else is ``unexpected``."""
    if not claimed:
        return "shared pool" if cpus == shared_pool else "unexpected"
    if cpus == claimed:
        return "exclusive"
    if shared_pool and cpus == claimed | shared_pool:
        return "exclusive + shared pool"
    return "unexpected"


async def _collect(node: SimNode, scenario: Scenario, applied: _Applied) -> DemoResult:
    result = DemoResult(notes=list(scenario.notes))
    result.slices = node.api.list("resourceslices")
    state = await node.debug_state()
    result.shared_pool = state.get("sharedPool", "")
    result.reserved = state.get("reserved", "")
    held = {c["uid"]: c["cpus"] for c in state.get("claims") or []}
    claims = node.api.list("resourceclaims")
    live = {_claim_key(c): c["metadata"]["uid"] for c in claims}
    devices = {_claim_key(c): claim_devices(c) for c in claims}
    # Each claim's status.devices as the API server holds it (dracpu writes its entries
    # beside the prepare: wait a little for those of the claims it holds).
    statuses = await read_statuses(
        lambda: node.api.list("resourceclaims"),
        {key: held.get(uid, "") for key, uid in live.items()},
    )
    names = applied.names.refresh(node)
    problems = {ref: names.name(problem) for ref, problem in applied.problems.items()}
    explained: set[str] = set()
    for key, users, extra in _claim_rows(scenario, applied):
        error = None
        for ref in users:
            problem = problems.get(ref)
            if problem is not None:
                error = _without_prefix(_without_prefix(problem, f"pod {ref}: "), f"claim {key}: ")
                explained.add(ref)
        result.claims[key] = {
            "cpus": held.get(live.get(key, ""), ""),
            "devices": devices.get(key, []),
            "status": statuses.get(key, {}),
            "error": error,
            **extra,
        }
        if error:
            result.problems.append(f"claim {key}: {error}")
    for ref, problem in problems.items():
        if ref not in explained:
            result.problems.append(f"pod {ref}: {_without_prefix(problem, f'pod {ref}: ')}")
    uses = _container_claims(scenario, applied)
    # The pool's last change may still be on its way to a container: look again briefly.
    with trio.move_on_after(CONVERGE_TIMEOUT):
        while True:
            _read_containers(node, result, uses)
            if "unexpected" not in result.container_kinds.values():
                break
            await trio.sleep(0.1)
            result.shared_pool = (await node.debug_state()).get("sharedPool", "")
    return result


def _read_containers(node: SimNode, result: DemoResult, uses: dict[str, list[str]]) -> None:
    """Each running container's cpuset read back, and what it is (``container_kind``)."""
    result.containers.clear()
    result.container_kinds.clear()
    pool = CPUSet.parse(result.shared_pool)
    for ref, st in sorted(node.pod_states().items()):
        if st["phase"] != "Running":
            continue
        for ctr_name, ctr in st["containers"].items():
            key = f"{ref}/{ctr_name}"
            cpus = node.cpuset_of(ctr["id"])
            result.containers[key] = cpus
            claimed = CPUSet()
            for claim in uses.get(key, []):
                claimed |= CPUSet.parse(result.claims.get(claim, {}).get("cpus") or "")
            result.container_kinds[key] = container_kind(CPUSet.parse(cpus), claimed, pool)


def _container_line(key: str, width: int, cpus: str, kind: str, shared_pool: str) -> str:
    if kind == "exclusive + shared pool":
        own = (CPUSet.parse(cpus) - CPUSet.parse(shared_pool)).format()
        return f"  {key:<{width}} {kind:<23} {cpus} (claimed {own} + shared pool {shared_pool})\n"
    return f"  {key:<{width}} {kind:<23} {cpus}\n"


def _text_report(opts: DemoOptions, result: DemoResult, out: TextIO) -> None:
    topo = opts.topology
    w = out.write
    w("\nPublished devices:\n")
    for line in _devices_line(result.slices):
        w(line + "\n")
    width = max((len(k) for k in (*result.claims, *result.containers)), default=0)
    width = max(width, 28)
    w("\nClaims:\n")
    for key, claim in result.claims.items():
        origin = (
            f" [from template {claim['template']} for pod {claim['pod']}]"
            if claim.get("template")
            else ""
        )
        if claim["error"] and not claim["cpus"]:
            w(f"  {key:<{width}} not allocated: {claim['error']}{origin}\n")
        elif claim["cpus"]:
            cpus = CPUSet.parse(claim["cpus"])
            numa = CPUSet(topo.cpus[c].numa for c in cpus if c in topo.cpus).format()
            plural = "s" if len(cpus) != 1 else ""
            # Held, yet a pod using it did not start (a claim shared by two containers).
            failed = f"; a pod using it did not start: {claim['error']}" if claim["error"] else ""
            w(
                f"  {key:<{width}} {claim['cpus']} ({len(cpus)} CPU{plural}, NUMA {numa})"
                f"{origin}{failed}\n"
            )
        elif claim.get("devices") and all(d["driver"] != DRIVER for d in claim["devices"]):
            w(f"  {key:<{width}} no CPUs: only other drivers' devices{origin}\n")
        else:
            w(f"  {key:<{width}} (no CPUs held: unprepared){origin}\n")
        for line in _claim_device_lines(claim):
            w(line)
        status = status_line(claim.get("status"))
        if status:
            w(f"      {status}\n")
    w("\nContainers (cpuset read back from the cgroup tree):\n")
    for key, ctr_cpus in result.containers.items():
        kind = result.container_kinds.get(key, "unexpected")
        w(_container_line(key, width, ctr_cpus, kind, result.shared_pool))
    w("\nCPU map:\n")
    claims = {k: CPUSet.parse(v["cpus"]) for k, v in result.claims.items() if v["cpus"]}
    w(
        render_cpu_map(
            rows_from_topology(topo),
            claims=claims,
            shared=CPUSet.parse(result.shared_pool),
            reserved=CPUSet.parse(result.reserved),
            isolated=topo.isolated,
        )
    )
    if result.notes:
        w("\n")
        for note in result.notes:
            w(f"note: {note}\n")


def _sim_node(opts: DemoOptions, workdir: str) -> SimNode:
    topo = opts.topology
    mems = CPUSet(sorted(topo.by_numa)).format() or "0"
    # A fixed seed: generated names and UIDs come out the same on every run.
    api = SimAPIServer(graceful_pod_deletion=True, seed=0)
    return SimNode(
        workdir=workdir,
        node_cpus=topo.online.format(),
        node_mems=mems,
        api=api,
        cgroup_version=opts.cgroup_version,
        cgroup_driver=opts.cgroup_driver,
    )


def _daemon_args(opts: DemoOptions) -> list[str]:
    extra = [f"--cpu-device-mode={opts.mode}", f"--group-by={opts.group_by}"]
    if opts.reserved:
        extra.append(f"--reserved-cpus={opts.reserved}")
    if opts.expose_pcie_roots:
        extra.append("--expose-pcie-roots")
    return extra


async def _start_daemon(
    node: SimNode, opts: DemoOptions, progress: _Progress, sysfs_root: str
) -> DaemonProcess:
    """``dracpu run`` against the simulated node, ready and with its slices published."""
    started = time.monotonic()
    keep_log = opts.workdir is not None
    try:
        daemon = await node.start_daemon(sysfs_root=sysfs_root, extra_args=_daemon_args(opts))
    except SimNodeError as exc:
        # One line, as for a daemon that exits later; the log says the rest.
        started_one = node.daemon
        if started_one is None:
            raise DemoError(str(exc)) from None
        if not started_one.running():
            raise DemoError(_daemon_death(started_one, keep_log, "before it was ready")) from None
        first = str(exc).splitlines()[0] if str(exc) else "not ready"
        raise DemoError(f"{first}; its log: {_kept_log(started_one, keep_log)}") from None
    progress(
        f"dracpu run (pid {daemon.process.pid}) ready in "
        f"{(time.monotonic() - started) * 1000:.0f} ms: registered with the kubelet, "
        f"synchronized with the runtime, slices published"
    )
    devices = sum(len(s["spec"].get("devices") or []) for s in node.api.list("resourceslices"))
    progress(f"{devices} device(s) published in {opts.mode} mode")
    return daemon


async def _create(node: SimNode, scenario: Scenario, obj: dict[str, Any]) -> None:
    """Create one scenario object; a refusal names the document it came from."""
    try:
        await node.create(obj)
    except K8sError as exc:
        raise DemoError(f"{scenario.origin(obj)}: the API server refused it: {exc}") from None


async def _other_drivers(
    node: SimNode, scenario: Scenario, progress: _Progress, stack: contextlib.ExitStack
) -> None:
    """Other drivers' device classes and slices, in the API server before any claim (so
    the scheduler sees them), and a stand-in kubelet plugin per driver (stand_in.py),
    registered before any pod needs it."""
    if not scenario.slices and not scenario.device_classes:
        return
    for device_class in scenario.device_classes:
        await _create_cluster_object(node, scenario, device_class)
    for raw in scenario.slices:
        await _create_cluster_object(node, scenario, node_slice(raw, node.node_name))
        elsewhere = raw["spec"].get("nodeName")
        if elsewhere and elsewhere != node.node_name:
            scenario.notes.append(
                f"{scenario.origin(raw)} is for node {elsewhere}, not the simulated node "
                f"{node.node_name}: no claim here gets its devices (leave spec.nodeName out "
                "to put them on this node)"
            )
    drivers = stand_in_drivers(scenario.slices, DRIVER)
    token = trio.lowlevel.current_trio_token()
    for driver in drivers:
        plugin = StandInDriver(driver, node.kubelet_root, _claim_reader(node), token)
        plugin.start()
        stack.callback(plugin.stop)
    kubelet = node.kubelet
    assert kubelet is not None  # the node runs
    with trio.move_on_after(SETTLE_TIMEOUT):
        while not all(d in kubelet.plugins for d in drivers):
            await trio.sleep(0.05)
    missing = [d for d in drivers if d not in kubelet.plugins]
    if missing:
        raise DemoError(f"the kubelet did not register the stand-in plugin of {', '.join(missing)}")
    devices = sum(len(s["spec"].get("devices") or []) for s in scenario.slices)
    progress(
        f"other drivers: {len(scenario.device_classes)} device class(es), "
        f"{len(scenario.slices)} slice(s) with {devices} device(s)"
        + (f"; stand-in kubelet plugins registered for {', '.join(drivers)}" if drivers else "")
    )


async def _create_cluster_object(node: SimNode, scenario: Scenario, obj: dict[str, Any]) -> None:
    """Create a DeviceClass or ResourceSlice as kubectl would (``fieldValidation=Strict``);
    a refusal names the document it came from."""
    kube = node.kube
    assert kube is not None  # the node runs
    create = (
        kube.resource.create_device_class
        if obj["kind"] == "DeviceClass"
        else kube.resource.create_resource_slice
    )
    try:
        await kube.call_raw(create, obj, field_validation="Strict")
    except K8sError as exc:
        raise DemoError(f"{scenario.origin(obj)}: the API server refused it: {exc}") from None
    node.poke()


def _claim_reader(node: SimNode) -> Callable[[str, str], dict[str, Any]]:
    def read(namespace: str, name: str) -> dict[str, Any]:
        return node.api.get("resourceclaims", name, namespace)

    return read


async def _apply(
    node: SimNode, scenario: Scenario, progress: _Progress, stack: contextlib.ExitStack
) -> _Applied:
    """Other drivers' classes and slices, templates and claims first, then each pod, waited
    for before the next one: the daemon then prepares claims in scenario order, so a run is
    repeatable."""
    await _other_drivers(node, scenario, progress, stack)
    for template in scenario.templates:
        await _create(node, scenario, template)
    for claim in scenario.claims:
        await _create(node, scenario, claim)
    progress(
        f"applied scenario: {len(scenario.templates)} claim template(s), "
        f"{len(scenario.claims)} claim(s), {len(scenario.pods)} pod(s)"
    )
    applied = _Applied()
    for pod in scenario.pods:
        ref = _claim_key(pod)
        await _create(node, scenario, pod)
        applied.problems.update(await _wait_settled(node, [ref], progress, applied.names))
        if template_entries(pod):
            live = node.api.get("pods", pod["metadata"]["name"], pod["metadata"]["namespace"])
            applied.generated[ref] = generated_claim_names(live)
            for pod_claim, claim_name in applied.generated[ref].items():
                progress(f"pod {ref}: claim {pod_claim} generated from its template: {claim_name}")
    applied.names.refresh(node)
    return applied


def _claim_uids_of(node: SimNode, pod: dict[str, Any], applied: _Applied) -> set[str]:
    ns, ref = pod["metadata"]["namespace"], _claim_key(pod)
    names = [
        r["resourceClaimName"]
        for r in pod["spec"].get("resourceClaims") or []
        if r.get("resourceClaimName")
    ]
    names += list(applied.generated.get(ref, {}).values())
    return {node.api.get("resourceclaims", name, ns)["metadata"]["uid"] for name in names}


async def _delete_marked(
    node: SimNode, scenario: Scenario, applied: _Applied, progress: _Progress
) -> None:
    """Delete the pods the scenario marks (the running ones); wait for their unprepare."""
    pods = {_claim_key(p): p for p in scenario.pods}
    for ns, name in scenario.pods_to_delete():
        ref = f"{ns}/{name}"
        if ref in applied.problems:
            continue
        uids = _claim_uids_of(node, pods[ref], applied)
        await node.delete_pod(ns, name)
        if await _wait_gone(node, ref, uids):
            progress(f"pod {ref} deleted: its claim was unprepared, CPUs back in the pool")
        else:
            applied.problems[ref] = "deletion did not finish"


async def _offline_marked(
    node: SimNode, scenario: Scenario, applied: _Applied, sysfs: str, progress: _Progress
) -> None:
    """Take a CPU of each marked running pod's claims offline and back (demo/offline.py)."""
    pods = {_claim_key(p): p for p in scenario.pods}
    for ref in pods_to_offline(scenario):
        if ref in applied.problems:
            continue
        uids = _claim_uids_of(node, pods[ref], applied)
        held = {c["uid"]: c["cpus"] for c in (await node.debug_state()).get("claims") or []}
        cpus = CPUSet()
        for uid in uids:
            cpus |= CPUSet.parse(held.get(uid, ""))
        if not cpus:
            applied.problems[ref] = f"{OFFLINE_AFTER_START}: the pod holds no claimed CPU"
            continue
        try:
            await offline_round_trip(node, sysfs, ref, cpus, progress)
        except OfflineError as exc:
            applied.problems[ref] = str(exc)


def _report(opts: DemoOptions, result: DemoResult, out: TextIO) -> None:
    if opts.output == "json":
        out.write(json.dumps(result.document(), indent=2) + "\n")
    else:
        _text_report(opts, result, out)


async def _serve_until_signal(
    node: SimNode, daemon: DaemonProcess, workdir: str, out: TextIO
) -> None:
    """``--keep-running``: say how to look at the node, then wait for Ctrl-C."""
    out.write(
        f"\nRunning until Ctrl-C. Work directory {workdir}\n"
        f"  kubectl --kubeconfig {node.kubeconfig} get "
        "resourceslices,resourceclaims,pods\n"
        f"  metrics/readyz: {daemon.url}/metrics  {daemon.url}/readyz\n"
        f"  debug state:    {daemon.debug_url}/debug/state  "
        f"(dracpu map --url {daemon.debug_url})\n"
        f"  sockets:        {node.kubelet_root}/plugins_registry/dra.cpu-reg.sock, "
        f"{node.nri_socket}\n"
    )
    out.flush()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            break
    out.write("Stopping the daemon and the simulated node.\n")


async def _steps(
    node: SimNode,
    opts: DemoOptions,
    daemon: DaemonProcess,
    sysfs_root: str,
    workdir: str,
    out: TextIO,
    progress: _Progress,
) -> DemoResult:
    with contextlib.ExitStack() as stack:
        result = await _steps_with_drivers(
            node, opts, daemon, sysfs_root, workdir, out, progress, stack
        )
    return result


async def _steps_with_drivers(
    node: SimNode,
    opts: DemoOptions,
    daemon: DaemonProcess,
    sysfs_root: str,
    workdir: str,
    out: TextIO,
    progress: _Progress,
    stack: contextlib.ExitStack,
) -> DemoResult:
    applied = await _apply(node, opts.scenario, progress, stack)
    await _offline_marked(node, opts.scenario, applied, sysfs_root, progress)
    await _delete_marked(node, opts.scenario, applied, progress)
    result = await _collect(node, opts.scenario, applied)
    _report(opts, result, out)
    if opts.keep_running:
        await _serve_until_signal(node, daemon, workdir, out)
    return result


async def _watch_daemon(daemon: DaemonProcess, scope: trio.CancelScope) -> None:
    """Stop the demo's steps when the daemon exits under them."""
    await daemon.process.wait()
    scope.cancel()


async def _has_exited(daemon: DaemonProcess, grace: float = 2.0) -> bool:
    """Whether the daemon has exited (or does within ``grace``: an error may reach the demo
    before the daemon's exit does)."""
    with trio.move_on_after(grace):
        await daemon.process.wait()
    return not daemon.running()


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _kept_log(daemon: DaemonProcess, keep_log: bool) -> str:
    """Where the daemon's log can be read after the demo: in place, or copied out of the
    work directory when that is about to be removed."""
    if keep_log:
        return daemon.log_path
    fd, kept = tempfile.mkstemp(prefix="dracpu-demo-daemon-", suffix=".log", dir="/tmp")
    os.close(fd)
    try:
        shutil.copyfile(daemon.log_path, kept)
    except OSError:
        os.unlink(kept)
        return "(lost with the work directory)"
    return kept


def _daemon_death(
    daemon: DaemonProcess, keep_log: bool, when: str = "while the demo was running"
) -> str:
    """One line: how the daemon ended, its log's last line, and where the whole log is."""
    last = next((ln for ln in reversed(daemon.log_tail(5).splitlines()) if ln.strip()), "")
    tail = f"; its last log line: {last.strip()}" if last else ""
    return (
        f"dracpu run (pid {daemon.process.pid}) {_exit_text(daemon.process.returncode)} "
        f"{when}{tail}; its log: {_kept_log(daemon, keep_log)}"
    )


async def _run_on(
    node: SimNode, opts: DemoOptions, workdir: str, out: TextIO, progress: _Progress
) -> DemoResult:
    """Every step of the demo on a running simulated node; a daemon that exits midway ends
    the demo with one line saying so."""
    progress(
        f"simulated node {node.node_name}: API server {node.api.url}, NRI runtime "
        f"{node.nri_socket} (cgroup v{node.cgroup_version}, {node.cgroup_driver} driver), "
        f"kubelet root {node.kubelet_root}"
    )
    marked = pods_to_offline(opts.scenario)
    try:
        sysfs_root = writable_sysfs(opts.sysfs_root, workdir) if marked else opts.sysfs_root
    except OfflineError as exc:
        raise DemoError(str(exc)) from exc
    daemon = await _start_daemon(node, opts, progress, sysfs_root)
    result: DemoResult | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_daemon, daemon, nursery.cancel_scope)
        try:
            result = await _steps(node, opts, daemon, sysfs_root, workdir, out, progress)
        except DemoError:
            raise  # the demo's own one-line errors (a misspelt field, ...) say it all
        except Exception:
            if not await _has_exited(daemon):
                raise
        nursery.cancel_scope.cancel()
    if result is None:
        raise DemoError(_daemon_death(daemon, keep_log=opts.workdir is not None))
    return result


def _quiet_simulator_logs() -> None:
    """The simulated node's warnings (a pod that cannot start, ...) are what the demo
    reports itself, once and with names; unconfigured, Python's last-resort handler would
    print each one to stderr as well, raw."""
    sim = logging.getLogger("dracpu_sim")
    if not logging.getLogger().handlers and not sim.handlers:
        sim.addHandler(logging.NullHandler())


def _first_demo_error(group: BaseExceptionGroup[DemoError]) -> DemoError:
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    assert isinstance(leaf, DemoError)
    return leaf


async def run_demo(opts: DemoOptions, out: TextIO) -> DemoResult:
    """Run the demo; writes progress and the report (text) or the JSON document to ``out``.
    Raises DemoError (never inside an exception group) when a step fails."""
    progress = _Progress(out, opts.output == "text")
    _quiet_simulator_logs()
    workdir = opts.workdir or tempfile.mkdtemp(prefix="dracpu-demo-", dir="/tmp")
    node = _sim_node(opts, workdir)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            result = await _run_on(node, opts, workdir, out, progress)
            nursery.cancel_scope.cancel()
        return result
    except* DemoError as group:
        raise _first_demo_error(group) from None
    finally:
        # Everything that used the directory has stopped by now (Ctrl-C included).
        if opts.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
