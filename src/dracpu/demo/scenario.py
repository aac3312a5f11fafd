"""Demo scenarios: ordinary Kubernetes YAML (Pods and ResourceClaims) and the built-in one.

A scenario file is a YAML stream of ``v1/Pod`` and ``resource.k8s.io/v1/ResourceClaim``
documents, applied in order. One annotation is the demo's own: a pod annotated
``demo.dracpu.io/delete-after-start: "true"`` is deleted once it runs, to show its claim
being unprepared and its CPUs going back to the shared pool.

The built-in scenario is sized from the node it runs on, so `make demo` works on a
2-CPU laptop VM as well as on a 768-CPU server; a claim the node is too small for is left
out with a note instead of failing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from dracpu.topology.model import Topology

__all__ = [
    "DELETE_AFTER_START",
    "Scenario",
    "ScenarioError",
    "default_scenario",
    "load_scenario",
    "parse_scenario",
    "scenario_yaml",
]

DELETE_AFTER_START = "demo.dracpu.io/delete-after-start"
DEVICE_CLASS = "dra.cpu"
_KINDS = {("v1", "Pod"), ("resource.k8s.io/v1", "ResourceClaim")}


class ScenarioError(ValueError):
    """A scenario document that cannot be applied; the message names the document."""


@dataclass
class Scenario:
    claims: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def pods_to_delete(self) -> list[tuple[str, str]]:
        out = []
        for pod in self.pods:
            meta = pod["metadata"]
            if str((meta.get("annotations") or {}).get(DELETE_AFTER_START, "")).lower() == "true":
                out.append((meta.get("namespace", "default"), meta["name"]))
        return out


def _where(index: int, doc: Any) -> str:
    if isinstance(doc, dict):
        meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
        name = meta.get("name") if isinstance(meta, dict) else None
        if name:
            return f"document {index + 1} ({doc.get('kind', '?')} {name})"
    return f"document {index + 1}"


def _check_pod(pod: dict[str, Any], where: str, claims: set[tuple[str, str]]) -> None:
    spec = pod.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list):
        raise ScenarioError(f"{where}: spec.containers must be a list")
    if not spec["containers"]:
        raise ScenarioError(f"{where}: a pod needs at least one container")
    ns = pod["metadata"].get("namespace", "default")
    refs = {}
    for ref in spec.get("resourceClaims") or []:
        if not isinstance(ref, dict) or "name" not in ref:
            raise ScenarioError(f"{where}: every spec.resourceClaims entry needs a name")
        target = ref.get("resourceClaimName")
        if not target:
            raise ScenarioError(
                f"{where}: resourceClaims[{ref['name']}] must name a ResourceClaim "
                f"(resourceClaimName); claim templates are not supported by the demo"
            )
        if (ns, target) not in claims:
            raise ScenarioError(
                f"{where}: ResourceClaim {ns}/{target} is not defined earlier in the scenario"
            )
        refs[ref["name"]] = target
    for ctr in spec["containers"]:
        if not isinstance(ctr, dict) or not ctr.get("name"):
            raise ScenarioError(f"{where}: every container needs a name")
        for use in (ctr.get("resources") or {}).get("claims") or []:
            if not isinstance(use, dict) or use.get("name") not in refs:
                raise ScenarioError(
                    f"{where}: container {ctr['name']} uses claim {use!r}, which is not in "
                    f"spec.resourceClaims"
                )


def parse_scenario(text: str, source: str = "scenario") -> Scenario:
    """Parse and check a scenario stream. Raises ScenarioError."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: not valid YAML: {exc}") from None
    if not docs:
        raise ScenarioError(f"{source}: no documents")
    scenario = Scenario()
    claim_keys: set[tuple[str, str]] = set()
    pod_keys: set[tuple[str, str]] = set()
    for index, doc in enumerate(docs):
        where = f"{source}: {_where(index, doc)}"
        if not isinstance(doc, dict):
            raise ScenarioError(f"{where}: expected a mapping, got {type(doc).__name__}")
        kind = (doc.get("apiVersion"), doc.get("kind"))
        if kind not in _KINDS:
            raise ScenarioError(
                f"{where}: unsupported apiVersion/kind {kind[0]}/{kind[1]}; a scenario holds "
                f"v1 Pods and resource.k8s.io/v1 ResourceClaims"
            )
        meta = doc.get("metadata")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
            raise ScenarioError(f"{where}: metadata.name is required")
        key = (meta.setdefault("namespace", "default"), meta["name"])
        if kind[1] == "ResourceClaim":
            if key in claim_keys:
                raise ScenarioError(f"{where}: ResourceClaim {key[0]}/{key[1]} defined twice")
            requests = ((doc.get("spec") or {}).get("devices") or {}).get("requests")
            if not isinstance(requests, list) or not requests:
                raise ScenarioError(f"{where}: spec.devices.requests must be a non-empty list")
            claim_keys.add(key)
            scenario.claims.append(doc)
        else:
            if key in pod_keys:
                raise ScenarioError(f"{where}: Pod {key[0]}/{key[1]} defined twice")
            _check_pod(doc, where, claim_keys)
            pod_keys.add(key)
            scenario.pods.append(doc)
    return scenario


def load_scenario(path: str) -> Scenario:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc.strerror or exc}") from None
    return parse_scenario(text, path)


# -- the built-in scenario -----------------------------------------------------------------


def _claim(
    name: str,
    request: dict[str, Any],
    *,
    config: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "cpus", "exactly": request}]}}
    if config:
        spec["devices"]["config"] = list(config)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def _pod(
    name: str, claim: str | None, cpus: int = 0, *, delete_after_start: bool = False
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "app",
        "image": "busybox:1.36",
        "command": ["sleep", "inf"],
    }
    spec: dict[str, Any] = {"containers": [container]}
    if claim is not None:
        spec["resourceClaims"] = [{"name": "cpus", "resourceClaimName": claim}]
        # Mirror the claim in the container's own CPU request, as the user guide asks.
        container["resources"] = {
            "requests": {"cpu": str(cpus)},
            "limits": {"cpu": str(cpus)},
            "claims": [{"name": "cpus"}],
        }
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if delete_after_start:
        meta["annotations"] = {DELETE_AFTER_START: "true"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _request(mode: str, cpus: int, selector: str | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"deviceClassName": DEVICE_CLASS}
    if mode == "individual":
        request["count"] = cpus
    else:
        request["capacity"] = {"requests": {"dra.cpu/cpu": str(cpus)}}
    if selector:
        request["selectors"] = [{"cel": {"expression": selector}}]
    return request


def default_scenario(topo: Topology, *, mode: str, group_by: str, reserved: int) -> Scenario:
    """A NUMA-pinned claim, a full-core claim, a plain grouped claim, a pod in the shared
    pool and a pod that is deleted after it starts; sizes fit ``topo``."""
    scenario = Scenario()
    free = topo.num_cpus - reserved
    threads = max(topo.cpus_per_core, 1)
    numa_ids = sorted(topo.by_numa)
    last_numa = numa_ids[-1]
    per_numa = min(len(c) for c in topo.by_numa.values())
    # Machine grouping needs an external scheduler's cpuset override (behavior.md §8.3).
    pinned_ok = mode == "individual" or group_by == "numanode"
    wanted: list[tuple[str, int]] = []
    if pinned_ok:
        wanted.append(("numa-pinned", min(2, per_numa)))
    wanted.append(("full-cores", 2 * threads))
    wanted.append(("grouped", 2))
    wanted.append(("short-lived", 1))
    budget = free - 1  # keep at least one CPU for the shared pool
    for name, size in wanted:
        if size > budget and name != "full-cores" and budget >= 1:
            size = 1  # a small node still shows the claim, with one CPU
        if size > budget or (mode == "grouped" and group_by == "machine"):
            why = (
                "machine grouping takes cpusets from an external scheduler"
                if group_by == "machine" and mode == "grouped"
                else f"the node has {budget} CPU(s) left for claims"
            )
            scenario.notes.append(f"claim {name} ({size} CPUs) left out: {why}")
            continue
        budget -= size
        selector = None
        config: list[dict[str, Any]] = []
        if name == "numa-pinned":
            selector = f'device.attributes["resource.kubernetes.io"].numaNode == {last_numa}'
        if name == "full-cores" and mode == "grouped":
            options = {
                "apiVersion": "dra.cpu/v1alpha1",
                "kind": "AllocationOptions",
                "fullPCPUsOnly": True,
            }
            config.append(
                {"requests": ["cpus"], "opaque": {"driver": "dra.cpu", "parameters": options}}
            )
        scenario.claims.append(_claim(name, _request(mode, size, selector), config=config))
        scenario.pods.append(
            _pod(
                {"numa-pinned": "pinned", "full-cores": "fullcore", "grouped": "worker"}.get(
                    name, "short-lived"
                ),
                name,
                size,
                delete_after_start=name == "short-lived",
            )
        )
    scenario.pods.append(_pod("plain", None))
    return scenario


def scenario_yaml(scenario: Scenario) -> str:
    """The scenario as a YAML stream (for `--print-scenario`-style output and tests)."""
    docs = [*scenario.claims, *scenario.pods]
    return yaml.safe_dump_all(json.loads(json.dumps(docs)), sort_keys=False)
