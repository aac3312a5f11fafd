"""`dracpu demo`: the real daemon on a simulated node, a scenario applied, and what happened.

Steps, each reported on a progress line: start the simulated node (API server, NRI
runtime with a cgroup tree, kubelet, scheduler) in a temp directory; start `dracpu run` as a
child process against it; wait for its slices; apply the scenario (claims, then pods); wait
until every pod runs or is stuck with a reason; delete the pods marked for deletion and wait
for their claims to be unprepared; then read back the published devices, each claim's CPUs
(from the daemon's ``/debug/state``) and each container's cpuset (from the cgroup tree) and
print them with the CPU map.
"""

from __future__ import annotations

import json
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
from dracpu.demo.scenario import Scenario
from dracpu.sim.node import SimNode, SimNodeError
from dracpu.topology.model import Topology

__all__ = ["DemoError", "DemoOptions", "DemoResult", "run_demo"]

SETTLE_TIMEOUT = 30.0


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


@dataclass
class DemoResult:
    slices: list[dict[str, Any]] = field(default_factory=list)
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)
    containers: dict[str, str] = field(default_factory=dict)
    shared_pool: str = ""
    reserved: str = ""
    problems: list[str] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        return {"slices": self.slices, "claims": self.claims, "containers": self.containers}


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
    """Why a pod is not running: the scheduler's or the kubelet's last word on it."""
    state = node.pod_states().get(pod_ref)
    if state is not None and state["errors"]:
        return str(state["errors"][-1])
    if node.scheduler is not None:
        for event in reversed(node.scheduler.events):
            if event.pod == pod_ref and event.kind == "FailedScheduling":
                return event.message
    return None


async def _wait_settled(
    node: SimNode, pods: list[str], progress: Callable[[str], None]
) -> dict[str, str]:
    """Wait until each pod runs or has a reason not to; returns pod -> problem."""
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
                    if problems.get(ref) != problem:
                        progress(f"pod {ref} not running: {problem}")
                    problems[ref] = problem
                else:
                    pending = True
            if not pending and len(reported) + len(problems) == len(pods):
                # Stuck pods get one more look after a retry interval before we give up.
                await trio.sleep(1.0 if problems else 0)
                if all(node.pod_states().get(r, {}).get("phase") != "Running" for r in problems):
                    return problems
            await trio.sleep(0.1)
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


def _devices_line(slices: list[dict[str, Any]]) -> list[str]:
    lines = []
    for s in slices:
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
            ):
                if key in attrs:
                    bits.append(f"{label} {next(iter(attrs[key].values()))}")
            lines.append(f"  {dev['name']:<16} {', '.join(bits)}")
    return lines


async def _collect(node: SimNode, scenario: Scenario, problems: dict[str, str]) -> DemoResult:
    result = DemoResult()
    result.slices = node.api.list("resourceslices")
    state = await node.debug_state()
    result.shared_pool = state.get("sharedPool", "")
    result.reserved = state.get("reserved", "")
    held = {c["uid"]: c["cpus"] for c in state.get("claims") or []}
    for claim in scenario.claims:
        key = _claim_key(claim)
        ns, name = key.split("/", 1)
        live = node.api.get("resourceclaims", name, ns)
        uid = live["metadata"]["uid"]
        error = None
        users = [
            p
            for p in scenario.pods
            if any(
                r.get("resourceClaimName") == name for r in p["spec"].get("resourceClaims") or []
            )
        ]
        for pod in users:
            problem = problems.get(_claim_key(pod))
            if problem is not None:
                error = problem
        result.claims[key] = {"cpus": held.get(uid, ""), "error": error}
        if error:
            result.problems.append(f"claim {key}: {error}")
    for ref, st in sorted(node.pod_states().items()):
        if st["phase"] != "Running":
            continue
        for ctr_name, ctr in st["containers"].items():
            result.containers[f"{ref}/{ctr_name}"] = node.cpuset_of(ctr["id"])
    return result


def _text_report(opts: DemoOptions, result: DemoResult, out: TextIO) -> None:
    topo = opts.topology
    w = out.write
    w("\nPublished devices:\n")
    for line in _devices_line(result.slices):
        w(line + "\n")
    w("\nClaims:\n")
    for key, claim in result.claims.items():
        if claim["error"]:
            w(f"  {key:<28} not allocated: {claim['error']}\n")
        elif claim["cpus"]:
            cpus = CPUSet.parse(claim["cpus"])
            numa = CPUSet(topo.cpus[c].numa for c in cpus if c in topo.cpus).format()
            plural = "s" if len(cpus) != 1 else ""
            w(f"  {key:<28} {claim['cpus']} ({len(cpus)} CPU{plural}, NUMA {numa})\n")
        else:
            w(f"  {key:<28} (no CPUs held: unprepared)\n")
    w("\nContainers (cpuset read back from the cgroup tree):\n")
    for key, ctr_cpus in result.containers.items():
        kind = "shared pool" if ctr_cpus == result.shared_pool else "exclusive"
        w(f"  {key:<28} {kind:<12} {ctr_cpus}\n")
    w("\nCPU map:\n")
    claims = {k: CPUSet.parse(v["cpus"]) for k, v in result.claims.items() if v["cpus"]}
    w(
        render_cpu_map(
            rows_from_topology(topo),
            claims=claims,
            shared=CPUSet.parse(result.shared_pool),
            reserved=CPUSet.parse(result.reserved),
        )
    )
    if opts.scenario.notes:
        w("\n")
        for note in opts.scenario.notes:
            w(f"note: {note}\n")
        w(
            f"note: this node has {topo.num_cpus} CPU(s); for the whole scenario try another "
            "machine shape, e.g. dracpu demo --sysfs-root tests/fake_sysfs/xeon-2s-ht\n"
        )


async def run_demo(opts: DemoOptions, out: TextIO) -> DemoResult:
    """Run the demo; writes progress and the report (text) or the JSON document to ``out``."""
    progress = _Progress(out, opts.output == "text")
    workdir = opts.workdir or tempfile.mkdtemp(prefix="dracpu-demo-", dir="/tmp")
    topo = opts.topology
    mems = CPUSet(sorted(topo.by_numa)).format() or "0"
    node = SimNode(workdir=workdir, node_cpus=topo.online.format(), node_mems=mems)
    extra = [f"--cpu-device-mode={opts.mode}", f"--group-by={opts.group_by}"]
    if opts.reserved:
        extra.append(f"--reserved-cpus={opts.reserved}")
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            progress(
                f"simulated node {node.node_name}: API server {node.api.url}, NRI runtime "
                f"{node.nri_socket}, kubelet root {node.kubelet_root}"
            )
            started = time.monotonic()
            try:
                daemon = await node.start_daemon(sysfs_root=opts.sysfs_root, extra_args=extra)
            except SimNodeError as exc:
                raise DemoError(str(exc)) from exc
            progress(
                f"dracpu run (pid {daemon.process.pid}) ready in "
                f"{(time.monotonic() - started) * 1000:.0f} ms: registered with the kubelet, "
                f"synchronized with the runtime, slices published"
            )
            devices = sum(
                len(s["spec"].get("devices") or []) for s in node.api.list("resourceslices")
            )
            progress(f"{devices} device(s) published in {opts.mode} mode")
            for claim in opts.scenario.claims:
                await node.create(claim)
            for pod in opts.scenario.pods:
                await node.create(pod)
            progress(
                f"applied scenario: {len(opts.scenario.claims)} claim(s), "
                f"{len(opts.scenario.pods)} pod(s)"
            )
            pod_refs = [_claim_key(p) for p in opts.scenario.pods]
            problems = await _wait_settled(node, pod_refs, progress)
            for ns, name in opts.scenario.pods_to_delete():
                ref = f"{ns}/{name}"
                if ref in problems:
                    continue
                uids = {
                    node.api.get("resourceclaims", r["resourceClaimName"], ns)["metadata"]["uid"]
                    for p in opts.scenario.pods
                    if _claim_key(p) == ref
                    for r in p["spec"].get("resourceClaims") or []
                }
                await node.delete_pod(ns, name)
                if await _wait_gone(node, ref, uids):
                    progress(f"pod {ref} deleted: its claim was unprepared, CPUs back in the pool")
                else:
                    problems[ref] = "deletion did not finish"
            result = await _collect(node, opts.scenario, problems)
            if opts.output == "json":
                out.write(json.dumps(result.document(), indent=2) + "\n")
            else:
                _text_report(opts, result, out)
            if opts.keep_running:
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
            nursery.cancel_scope.cancel()
        return result
    finally:
        # Everything that used the directory has stopped by now (Ctrl-C included).
        if opts.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
