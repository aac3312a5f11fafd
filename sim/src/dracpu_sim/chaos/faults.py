"""The faults of a chaos run, each injected into the simulated node by a function of its own.

A fault draws its parameters from the planned random number (``Action.value``); which
container a tamper hits, or which slice is deleted, is chosen from what exists when it
fires. Each says what it did, or None when it found nothing to hit.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

import trio

from dracpu.cpuset import CPUSet, CPUSetParseError
from dracpu_sim.chaos.plan import Action
from dracpu_sim.node import SimNode
from dracpu_sim.runtime.simulator import RuntimeSimulator

__all__ = ["API_409_TARGETS", "API_500_TARGETS", "inject_fault"]

# (verb, resource) the API faults hit: the daemon's slice and claim calls, the scheduler's
# claim status writes, the kubelet's pod calls.
API_409_TARGETS = (
    ("update", "resourceslices"),
    ("update", "resourceclaims/status"),
    ("patch", "pods/status"),
    ("delete", "resourceslices"),
)
API_500_TARGETS = (
    ("get", "resourceclaims"),
    ("list", "resourceslices"),
    ("create", "resourceslices"),
    ("update", "resourceslices"),
    ("watch", "resourceslices"),
    ("list", "pods"),
    ("get", "nodes"),
    ("update", "resourceclaims/status"),
    ("*", "*"),
)

Say = Callable[[str], None]


def _runtime(node: SimNode) -> RuntimeSimulator:
    runtime = node.runtime
    assert runtime is not None
    return runtime


async def _kill_daemon(node: SimNode, action: Action, say: Say) -> str | None:
    delay = (action.value % 1500) / 1000.0
    # Faults run one at a time, so no other fault touches the daemon meanwhile.
    code = await node.kill_daemon()
    say(f"daemon killed ({code}); restarting in {delay:.2f}s")
    await trio.sleep(delay)
    await node.restart_daemon(wait=False)
    return "daemon killed and started again"


async def _restart_runtime(node: SimNode, action: Action, say: Say) -> str | None:
    downtime = (action.value % 800) / 1000.0
    await _runtime(node).restart(downtime)
    return f"runtime restarted ({downtime:.2f}s down)"


async def _drop_nri(node: SimNode, action: Action, say: Say) -> str | None:
    await _runtime(node).drop_connection()
    return "NRI connection dropped"


async def _fail_updates(node: SimNode, action: Action, say: Say) -> str | None:
    runtime = _runtime(node)
    n = 1 + action.value % 3
    how = (action.value >> 4) % 5
    if how == 3:
        # As containerd: the runtime says yes to best-effort updates it did not apply.
        runtime.set_update_mode("containerd-drop", calls=n)
        return f"next {n} update batches silently not applied"
    if how == 4:
        runtime.set_update_mode("cgroup-differs", calls=n)
        return f"next {n} update batches recorded but the cgroups keep their cpusets"
    if how == 0:
        runtime.fail_updates(n)
        return f"next {n} UpdateContainers fail"
    if how == 1:
        runtime.mark_failed_updates(n)
        return f"next {n} UpdateContainers list every update failed"
    runtime.drop_updates(n)
    return f"next {n} UpdateContainers unanswered"


async def _api_fault(node: SimNode, action: Action, say: Say) -> str | None:
    kind, value = action.kind, action.value
    targets = API_409_TARGETS if kind == "api-409" else API_500_TARGETS
    verb, resource = targets[value % len(targets)]
    count = 1 + (value >> 8) % 3
    if kind == "api-drop":
        node.api.faults.inject(verb, resource, count, drop_connection=True)
    else:
        status = 409 if kind == "api-409" else 500
        node.api.faults.inject(verb, resource, count, status=status, message="chaos")
    return f"{kind} on {verb} {resource} x{count}"


async def _drop_watches(node: SimNode, action: Action, say: Say) -> str | None:
    return f"{node.api.end_watches(drop=True)} watches dropped"


async def _delete_slice(node: SimNode, action: Action, say: Say) -> str | None:
    api = node.api
    slices = sorted(s["metadata"]["name"] for s in api.list("resourceslices"))
    if not slices:
        return None
    victim = slices[action.value % len(slices)]
    try:
        api.delete("resourceslices", victim)
    except Exception:  # the reconciler replaced it meanwhile
        return None
    return f"slice {victim} deleted"


def _running_containers(node: SimNode) -> list[tuple[str, str, str]]:
    """(pod ref, container name, container id) of every container of a running pod."""
    out = []
    for ref, st in sorted(node.pod_states().items()):
        if st["phase"] != "Running":
            continue
        for name, ctr in sorted(st["containers"].items()):
            out.append((ref, name, str(ctr["id"])))
    return out


async def _tamper(node: SimNode, action: Action, say: Say) -> str | None:
    """Rewrite a running container's cpuset file; None when there is none to hit."""
    runtime = _runtime(node)
    running = _running_containers(node)
    if not running:
        return None
    ref, name, cid = running[action.value % len(running)]
    try:
        container = runtime.container(cid)
        directory = runtime.tree.path_of(container.cgroups_path)
        # What the pod's cgroup allows (v2: its own set is usually empty, the parent's).
        parent = runtime.tree.effective_cpus(runtime.pod(container.pod_uid).cgroup_parent)
        current = CPUSet.parse(runtime.cpuset_of(cid))
        rng = random.Random(action.value)
        choices = sorted(parent)
        wrong = current
        while wrong == current:
            wrong = CPUSet(rng.sample(choices, rng.randint(1, min(8, len(choices)))))
        # Straight into the file, as an admin or another agent would: no runtime involved.
        with open(directory / "cpuset.cpus", "r+") as f:
            f.write(wrong.format() + "\n")
            f.truncate()
    except (KeyError, OSError, CPUSetParseError):
        return None  # removed meanwhile
    return f"{ref}/{name} cpuset {current} -> {wrong}"


_INJECTORS: dict[str, Callable[[SimNode, Action, Say], Awaitable[str | None]]] = {
    "daemon-kill9": _kill_daemon,
    "runtime-restart": _restart_runtime,
    "nri-drop": _drop_nri,
    "update-fail": _fail_updates,
    "api-409": _api_fault,
    "api-500": _api_fault,
    "api-drop": _api_fault,
    "watch-drop": _drop_watches,
    "slice-delete": _delete_slice,
    "cpuset-tamper": _tamper,
}


async def inject_fault(node: SimNode, action: Action, say: Say) -> str | None:
    """Inject one fault; what it did, or None when it found nothing to hit."""
    _runtime(node)
    injector = _INJECTORS.get(action.kind)
    if injector is None:
        raise ValueError(f"unknown fault kind {action.kind!r}")
    return await injector(node, action, say)
