"""Discovery documents (/version, /api, /apis, group versions), enough for kubectl's
legacy discovery to find the served resources. Pure."""

from __future__ import annotations

from typing import Any

from dracpu_sim.apiserver.resources import RESOURCES, ResourceType

__all__ = [
    "api_group",
    "api_group_list",
    "api_resource_list",
    "api_versions",
    "version_info",
]

KUBE_VERSION = "v1.34.0"


def version_info() -> dict[str, Any]:
    return {
        "major": "1",
        "minor": "34",
        "gitVersion": f"{KUBE_VERSION}+dracpu-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-08-27T00:00:00Z",
        "goVersion": "go1.24.6",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _groups() -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    for r in RESOURCES:
        if r.group and (r.group, r.version) not in seen:
            seen.append((r.group, r.version))
    return seen


def api_group(name: str) -> dict[str, Any] | None:
    versions = [v for g, v in _groups() if g == name]
    if not versions:
        return None
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": name,
        "versions": entries,
        "preferredVersion": entries[0],
    }


def api_group_list() -> dict[str, Any]:
    groups = []
    for name in dict.fromkeys(g for g, _ in _groups()):
        group = api_group(name)
        assert group is not None
        del group["kind"], group["apiVersion"]
        groups.append(group)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _entry(r: ResourceType, name: str, verbs: list[str], kind: str) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "singularName": "" if "/" in name else r.singular,
        "namespaced": r.namespaced,
        "kind": kind,
        "verbs": verbs,
    }
    if r.short_names and "/" not in name:
        entry["shortNames"] = list(r.short_names)
    return entry


def api_resource_list(group: str, version: str) -> dict[str, Any] | None:
    served = [r for r in RESOURCES if r.group == group and r.version == version]
    if not served:
        return None
    resources = []
    for r in served:
        resources.append(_entry(r, r.plural, list(r.verbs), r.kind))
        if r.has_status:
            resources.append(_entry(r, f"{r.plural}/status", ["get", "patch", "update"], r.kind))
        if r.plural == "pods":
            resources.append(_entry(r, "pods/binding", ["create"], "Binding"))
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }
