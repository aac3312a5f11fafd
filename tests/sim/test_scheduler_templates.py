"""Claims from ResourceClaimTemplates: shaped as the resourceclaim controller shapes them,
recorded in the pod's status, used by the scheduler, deleted when the pod is gone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import builders
import pytest
import trio
from builders import NODE, claim_request, device_class, machine

from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.k8s.client import KubeClient
from dracpu_sim.apiserver import SimAPIServer
from dracpu_sim.scheduler import Scheduler
from dracpu_sim.scheduler.templates import (
    POD_CLAIM_NAME_ANNOTATION,
    claim_from_template,
    claim_generate_name,
    find_generated_claim,
)


def template(name: str = "cpu-template", cpus: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}},
            "spec": {"devices": {"requests": [claim_request(cpus=cpus)]}},
        },
    }


POD = {"metadata": {"name": "web-0", "namespace": "default", "uid": "uid-web-0"}}


def test_generate_name() -> None:
    assert claim_generate_name("web-0", "cpus") == "web-0-cpus-"
    # Too long: both parts cut in proportion, joined by one hyphen, 57 characters at most.
    long_pod, long_claim = "p" * 60, "c" * 20
    name = claim_generate_name(long_pod, long_claim)
    assert len(name) <= 57
    assert name == "p" * (60 * 57 // 82) + "-" + "c" * (20 * 57 // 82)


def test_claim_from_template() -> None:
    claim = claim_from_template(POD, "cpus", template())
    assert claim["metadata"] == {
        "generateName": "web-0-cpus-",
        "namespace": "default",
        "annotations": {"note": "x", POD_CLAIM_NAME_ANNOTATION: "cpus"},
        "labels": {"team": "a"},
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "web-0",
                "uid": "uid-web-0",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    assert claim["spec"] == template()["spec"]["spec"]
    # Found again by owner and annotation, not by name.
    named = {**claim, "metadata": {**claim["metadata"], "name": "web-0-cpus-x2z4b"}}
    assert find_generated_claim([named], POD, "cpus") is named
    assert find_generated_claim([named], POD, "other") is None
    other_pod = {"metadata": {**POD["metadata"], "uid": "uid-other"}}
    assert find_generated_claim([named], other_pod, "cpus") is None


class Cluster:
    def __init__(self, server: SimAPIServer, api: KubeClient) -> None:
        self.server = server
        self.scheduler = Scheduler(api, NODE)

    def pod(self, name: str, template_name: str) -> dict[str, Any]:
        body = builders.pod(name, container={"name": "main"}, template=template_name)
        return self.server.create("pods", body)

    def claims(self) -> list[dict[str, Any]]:
        return self.server.list("resourceclaims")


@pytest.fixture
async def cluster(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Cluster]:
    server = SimAPIServer(seed=1)
    await nursery.start(server.serve)
    api = KubeClient.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    server.create("deviceclasses", device_class())
    for obj in build_slices(
        build_inventory(machine("xeon-2s-ht"), DeviceSettings()),
        node_name=NODE,
        node_uid="uid-1",
        expose_pcie_roots=False,
    ):
        server.create("resourceslices", obj)
    yield Cluster(server, api)
    api.close()


async def test_claim_generated_recorded_and_scheduled(cluster: Cluster) -> None:
    cluster.server.create("resourceclaimtemplates", template())
    pod = cluster.pod("web-0", "cpu-template")
    outcomes = await cluster.scheduler.schedule_once()
    assert [(o.kind, o.pod) for o in outcomes] == [("Scheduled", "default/web-0")]
    (claim,) = cluster.claims()
    name = claim["metadata"]["name"]
    assert name.startswith("web-0-tpl-") and len(name) == len("web-0-tpl-") + 5
    assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    assert claim["metadata"]["annotations"][POD_CLAIM_NAME_ANNOTATION] == "tpl"
    assert claim["status"]["reservedFor"][0]["uid"] == pod["metadata"]["uid"]
    assert outcomes[0].claims == (f"default/{name}",)
    live = cluster.server.get("pods", "web-0", "default")
    assert live["status"]["resourceClaimStatuses"] == [{"name": "tpl", "resourceClaimName": name}]
    # Another round makes no second claim.
    await cluster.scheduler.schedule_once()
    assert [c["metadata"]["name"] for c in cluster.claims()] == [name]


async def test_orphaned_generated_claim_is_adopted(cluster: Cluster) -> None:
    # Created by an earlier round that failed before writing the pod's status.
    cluster.server.create("resourceclaimtemplates", template())
    pod = cluster.pod("web-0", "cpu-template")
    orphan = claim_from_template(pod, "tpl", template())
    orphan["metadata"]["name"] = "web-0-tpl-abcde"
    cluster.server.create("resourceclaims", orphan)
    await cluster.scheduler.schedule_once()
    assert [c["metadata"]["name"] for c in cluster.claims()] == ["web-0-tpl-abcde"]
    live = cluster.server.get("pods", "web-0", "default")
    assert live["status"]["resourceClaimStatuses"][0]["resourceClaimName"] == "web-0-tpl-abcde"


async def test_missing_template_then_created(cluster: Cluster) -> None:
    cluster.pod("web-0", "cpu-template")
    (outcome,) = await cluster.scheduler.schedule_once()
    assert outcome.message == (
        "pod default/web-0: pod claim 'tpl': resourceclaimtemplate \"default/cpu-template\" "
        "not found"
    )
    assert cluster.claims() == []
    cluster.server.create("resourceclaimtemplates", template())
    (outcome,) = await cluster.scheduler.schedule_once()
    assert outcome.kind == "Scheduled"


async def test_generated_claim_is_deleted_with_its_pod(cluster: Cluster) -> None:
    cluster.server.create("resourceclaimtemplates", template())
    cluster.pod("web-0", "cpu-template")
    await cluster.scheduler.schedule_once()
    assert len(cluster.claims()) == 1
    cluster.server.delete("pods", "web-0", "default")
    outcomes = await cluster.scheduler.schedule_once()
    assert [o.kind for o in outcomes] == ["Deallocated"]
    assert cluster.claims() == []


async def test_generated_claim_of_a_finished_pod_is_deleted(cluster: Cluster) -> None:
    cluster.server.create("resourceclaimtemplates", template())
    cluster.pod("job-0", "cpu-template")
    await cluster.scheduler.schedule_once()
    cluster.server.patch(
        "pods", "job-0", {"status": {"phase": "Succeeded"}}, "default", subresource="status"
    )
    await cluster.scheduler.schedule_once()
    assert cluster.claims() == []
    # A claim made by hand stays, reserved or not.
    cluster.server.create(
        "resourceclaims", builders.resource_claim("mine", requests=[claim_request(cpus=1)])
    )
    await cluster.scheduler.schedule_once()
    assert [c["metadata"]["name"] for c in cluster.claims()] == ["mine"]
