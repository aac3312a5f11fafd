"""DRAService without sockets: claim owners released on unprepare, the change callback,
restoring a store from specs on disk."""

from __future__ import annotations

import logging
import shutil
from typing import Any

import pytest
from kubelet_harness import claim, make_node, result, short_dir

from dracpu.allocation.store import AllocationStore, ClaimTracker
from dracpu.cpuset import CPUSet
from dracpu.kubelet import ClaimRef, DRAService, restore_claims


@pytest.fixture
def cdi_dir() -> Any:
    path = short_dir("cdi.")
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_unprepare_releases_the_claim_owner(cdi_dir: str) -> None:
    node = make_node(cdi_dir)
    tracker = ClaimTracker()
    service = DRAService(
        claims=node.claims,
        store=node.store,
        inventory=node.inventory,
        topology=node.topology,
        online=node.topology.online,
        cdi_dir=cdi_dir,
        metrics=node.metrics,
        node_name="node-a",
        tracker=tracker,
    )
    node.claims.put(claim("o1", result("cpudevnuma000", 1), name="web"))
    ref = ClaimRef(namespace="default", name="web", uid="o1")
    assert (await service.prepare([ref]))["o1"].error == ""
    tracker.set_owner("pod-1", "app", ["o1"])
    assert (await service.unprepare([ref]))["o1"].error == ""
    assert tracker.owner_of("o1") is None


async def test_failing_change_callback_does_not_fail_the_call(
    cdi_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    node = make_node(cdi_dir)

    def boom() -> None:
        raise RuntimeError("pool update queue closed")

    service = DRAService(
        claims=node.claims,
        store=node.store,
        inventory=node.inventory,
        topology=node.topology,
        online=node.topology.online,
        cdi_dir=cdi_dir,
        metrics=node.metrics,
        node_name="node-a",
        on_change=boom,
    )
    node.claims.put(claim("cb", result("cpudevnuma000", 1), name="web"))
    ref = ClaimRef(namespace="default", name="web", uid="cb")
    with caplog.at_level(logging.ERROR, logger="dracpu.kubelet.dra"):
        assert (await service.prepare([ref]))["cb"].error == ""
    assert "on_change callback failed" in caplog.text
    assert "cb" in node.store


def test_restore_claims_reports_conflicts() -> None:
    store = AllocationStore(CPUSet.parse("0-7"), CPUSet.parse("0"))
    errors = restore_claims(
        store,
        {
            "a": CPUSet.parse("1-2"),
            "b": CPUSet.parse("2-3"),
            "c": CPUSet.parse("0"),
            "d": CPUSet.parse("7"),
        },
    )
    assert errors == [
        'claim "b" has overlapping CPU assignment "2-3"',
        'claim "c" has overlapping CPU assignment "0"',
    ]
    assert {r.uid: r.cpus for r in store.records()} == {
        "a": CPUSet.parse("1-2"),
        "d": CPUSet.parse("7"),
    }
