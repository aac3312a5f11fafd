"""Server-side printing: the ``meta.k8s.io`` Table the real API server answers when a client
asks for one (``Accept: application/json;as=Table;v=v1;g=meta.k8s.io``, what ``kubectl
get`` sends), for pods. Other kinds are answered with their JSON, from which kubectl prints
its own NAME and AGE columns.

The pod columns and cells follow kubernetes ``pkg/printers/internalversion/printers.go``
(``podColumnDefinitions``, ``printPod``): Name, Ready (ready/total containers), Status (the
phase, or the reason a container waits or ended, ``Terminating`` once deleted), Restarts,
Age, and with priority 1 (``-o wide``) IP, Node, Nominated Node, Readiness Gates. The server
always sends every column; kubectl drops the priority-1 ones unless asked for ``wide``.
Age is apimachinery's ``duration.HumanDuration``. The row's ``object`` is what
``includeObject`` asks for: ``Metadata`` (default, a PartialObjectMetadata), ``Object`` or
``None``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

__all__ = ["POD_COLUMNS", "human_duration", "pod_cells", "pod_table", "table_version"]

Obj = dict[str, Any]

_META = "meta.k8s.io"


def _column(name: str, kind: str, description: str, *, priority: int = 0) -> Obj:
    column: Obj = {"name": name, "type": kind, "format": "", "description": description}
    if name == "Name":
        column["format"] = "name"
    column["priority"] = priority
    return column


POD_COLUMNS: tuple[Obj, ...] = (
    _column("Name", "string", "Name must be unique within a namespace."),
    _column("Ready", "string", "The aggregate readiness state of this pod for accepting traffic."),
    _column("Status", "string", "The aggregate status of the containers in this pod."),
    _column(
        "Restarts",
        "string",
        "The number of times the containers in this pod have been restarted and when the "
        "last container in this pod has restarted.",
    ),
    _column("Age", "string", "CreationTimestamp is a timestamp of when this object was created."),
    _column("IP", "string", "podIP address allocated to the pod.", priority=1),
    _column(
        "Node", "string", "NodeName indicates in which node this pod is scheduled.", priority=1
    ),
    _column(
        "Nominated Node",
        "string",
        "nominatedNodeName is set only when this pod preempts other pods on the node.",
        priority=1,
    ),
    _column(
        "Readiness Gates",
        "string",
        "If specified, all readiness gates will be evaluated for pod readiness.",
        priority=1,
    ),
)


def table_version(accept: str) -> str | None:
    """The Table version (``v1`` or ``v1beta1``) the first acceptable entry of an Accept
    header asks for, or None when that entry is plain JSON (or anything else we serve)."""
    for entry in accept.split(","):
        parts = [p.strip() for p in entry.split(";")]
        if parts[0] not in ("application/json", "*/*", "application/*"):
            continue
        params = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        if params.get("as") != "Table":
            return None
        if params.get("g") == _META and params.get("v") in ("v1", "v1beta1"):
            return params["v"]
    return None


def human_duration(seconds: float) -> str:
    """apimachinery ``pkg/util/duration.HumanDuration``: about 2-3 significant figures."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        rest = whole % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        rest = (hours // 24) % 365
        return f"{hours // 24 // 365}y{rest}d" if rest else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _since(timestamp: str | None, now: float) -> str:
    """``translateTimestampSince``: ``<unknown>`` for a missing timestamp."""
    if not timestamp:
        return "<unknown>"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "<unknown>"
    return human_duration(now - then)


def _status(pod: Mapping[str, Any]) -> tuple[str, int, int, str | None]:
    """(status text, ready containers, restarts, last restart time) as ``printPod`` works
    them out for regular containers (the simulator runs no init containers)."""
    status = pod.get("status") or {}
    reason = str(status.get("reason") or status.get("phase") or "")
    ready = restarts = 0
    last_restart: str | None = None
    has_running = False
    for container in reversed(status.get("containerStatuses") or []):
        restarts += int(container.get("restartCount") or 0)
        finished = ((container.get("lastState") or {}).get("terminated") or {}).get("finishedAt")
        if finished and (last_restart is None or finished > last_restart):
            last_restart = finished
        state = container.get("state") or {}
        waiting, terminated = state.get("waiting"), state.get("terminated")
        if waiting is not None and waiting.get("reason"):
            reason = str(waiting["reason"])
        elif terminated is not None and terminated.get("reason"):
            reason = str(terminated["reason"])
        elif terminated is not None:
            signal = terminated.get("signal")
            reason = f"Signal:{signal}" if signal else f"ExitCode:{terminated.get('exitCode', 0)}"
        elif container.get("ready") and state.get("running") is not None:
            has_running = True
            ready += 1
    if reason == "Completed" and has_running:
        conditions = status.get("conditions") or []
        pod_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        reason = "Running" if pod_ready else "NotReady"
    deleted = (pod.get("metadata") or {}).get("deletionTimestamp")
    if deleted and status.get("reason") == "NodeLost":
        reason = "Unknown"
    elif deleted and status.get("phase") not in ("Succeeded", "Failed"):
        reason = "Terminating"
    return reason, ready, restarts, last_restart


def pod_cells(pod: Mapping[str, Any], now: float) -> list[Any]:
    """One pod's row: every column of ``POD_COLUMNS``, wide ones included."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    reason, ready, restarts, last_restart = _status(pod)
    restarts_text = str(restarts)
    if restarts and last_restart:
        restarts_text = f"{restarts} ({_since(last_restart, now)} ago)"
    ips = status.get("podIPs") or []
    gates = spec.get("readinessGates") or []
    gates_text = "<none>"
    if gates:
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        met = sum(1 for g in gates if conditions.get(g.get("conditionType")) == "True")
        gates_text = f"{met}/{len(gates)}"
    return [
        meta.get("name", ""),
        f"{ready}/{len(spec.get('containers') or [])}",
        reason,
        restarts_text,
        _since(meta.get("creationTimestamp"), now),
        (ips[0].get("ip") if ips else "") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        gates_text,
    ]


def _row_object(obj: Mapping[str, Any], include: str, version: str) -> Obj | None:
    if include == "None":
        return None
    if include == "Object":
        return dict(obj)
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": f"{_META}/{version}",
        "metadata": obj.get("metadata") or {},
    }


def pod_table(
    pods: Sequence[Mapping[str, Any]],
    *,
    now: float,
    version: str = "v1",
    include_object: str = "Metadata",
    list_metadata: Mapping[str, Any] | None = None,
) -> Obj:
    """The Table of ``pods``; ``list_metadata`` (resourceVersion, continue) is the list's."""
    rows = []
    for pod in pods:
        row: Obj = {"cells": pod_cells(pod, now)}
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            row["conditions"] = [
                {
                    "type": "Completed",
                    "status": "True",
                    "reason": phase,
                    "message": "The pod has completed successfully."
                    if phase == "Succeeded"
                    else "The pod failed.",
                }
            ]
        obj = _row_object(pod, include_object, version)
        if obj is not None:
            row["object"] = obj
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": f"{_META}/{version}",
        "metadata": dict(list_metadata or {}),
        "columnDefinitions": [dict(c) for c in POD_COLUMNS],
        "rows": rows,
    }
