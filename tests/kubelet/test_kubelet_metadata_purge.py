"""Device metadata removed without waiting for directory deletions, and written as durable
as the CDI spec that mounts it.

An unprepare renames the claim's metadata directory aside (``.removed-<random>``), so the
claim's path is free at once; a new run's first purge deletes what an earlier one set
aside, and ``MetadataPurger`` keeps some as spares for later prepares (tests/kubelet/
test_metadata_spares.py) and deletes the others in the background.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from dracpu.allocation.prepare import ClaimAllocation
from dracpu.allocation.store import PreparedDevice
from dracpu.kubelet import metadata, metadata_tree
from dracpu.kubelet.metadata import (
    METADATA_DIR,
    MetadataPurger,
    remove_claim_metadata,
    write_claim_metadata,
)
from dracpu.kubelet.metadata_tree import SpareDirs

UID = "6f1c2a3e-0b5d-4c1e-9a57-1d2e3f405162"
CLAIM = ClaimAllocation(uid=UID, namespace="team-a", name="web")
DEVICES = [PreparedDevice(pool_name="node-a", device_name="cpudevnuma000", request_names=("cpus",))]


def purge_as_a_new_run(plugin_dir: str) -> int:
    """What a new run's first purge deletes: every set-aside directory."""
    return SpareDirs(os.path.join(plugin_dir, METADATA_DIR)).purge()


def entries(plugin_dir: str) -> list[str]:
    return sorted(os.listdir(os.path.join(plugin_dir, METADATA_DIR)))


def test_removal_sets_the_claim_directory_aside_and_a_purge_deletes_it(
    plugin_cdi_dirs: tuple[str, str],
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    assert write_claim_metadata(plugin_dir, cdi_dir, CLAIM, DEVICES, None)
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "web", UID, purge=False)
    assert os.listdir(cdi_dir) == []
    (aside,) = entries(plugin_dir)
    assert aside.startswith(".removed-") and len(aside) == len(".removed-") + 16
    # Prepared again before any purge: the claim's path is free, and the purge keeps it.
    assert write_claim_metadata(plugin_dir, cdi_dir, CLAIM, DEVICES, None)
    assert purge_as_a_new_run(plugin_dir) == 1
    assert entries(plugin_dir) == ["team-a_web"]
    assert purge_as_a_new_run(plugin_dir) == 0


def test_default_removal_deletes_at_once(plugin_cdi_dirs: tuple[str, str]) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    write_claim_metadata(plugin_dir, cdi_dir, CLAIM, DEVICES, None)
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "web", UID)
    assert entries(plugin_dir) == [] and os.listdir(cdi_dir) == []


def test_a_directory_that_cannot_be_set_aside_is_deleted_in_place(
    plugin_cdi_dirs: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    write_claim_metadata(plugin_dir, cdi_dir, CLAIM, DEVICES, None)

    def refuse(src: str, dst: str) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(metadata.os, "rename", refuse)
    with caplog.at_level(logging.WARNING, logger=metadata.__name__):
        remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "web", UID, purge=False)
    assert entries(plugin_dir) == []
    assert "failed to set device metadata" in caplog.text and "Permission denied" in caplog.text


def test_nothing_to_remove_or_purge_is_fine(plugin_cdi_dirs: tuple[str, str]) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "web", UID, purge=False)
    assert purge_as_a_new_run(plugin_dir) == 0  # not even the metadata dir exists


async def test_the_purger_deletes_in_the_background_and_again_when_asked_meanwhile(
    plugin_cdi_dirs: tuple[str, str],
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    purger = MetadataPurger(plugin_dir, keep=0)  # no spares kept: each one is deleted
    async with trio.open_nursery() as nursery:
        await nursery.start(purger.run)  # a service under the supervisor in the daemon
        for name in ("a", "b"):
            claim = ClaimAllocation(uid=UID, namespace="team-a", name=name)
            write_claim_metadata(plugin_dir, cdi_dir, claim, DEVICES, None)
            remove_claim_metadata(
                plugin_dir, cdi_dir, "team-a", name, UID, purge=False, spares=purger.spares
            )
            purger.soon()  # the second call finds the first purge running, or done
        with trio.fail_after(10):
            while purger.purged < 2 or entries(plugin_dir):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert purger.purged == 2


@pytest.mark.parametrize("durable", [True, False])
def test_the_metadata_file_is_as_durable_as_its_cdi_spec(
    plugin_cdi_dirs: tuple[str, str], monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    seen: list[tuple[str, str, bool]] = []
    write, in_place = metadata.atomic_write, metadata_tree._write_in_place

    def recorded(path: str, data: bytes, **kw: Any) -> None:
        seen.append(("replaced", os.path.basename(path), kw.get("durable", True)))
        write(path, data, **kw)

    def recorded_in_place(path: str, data: bytes, *, durable: bool) -> None:
        seen.append(("in place", os.path.basename(path), durable))
        in_place(path, data, durable=durable)

    monkeypatch.setattr(metadata, "atomic_write", recorded)  # the CDI spec
    monkeypatch.setattr(metadata_tree, "atomic_write", recorded)  # a live file replaced
    monkeypatch.setattr(metadata_tree, "_write_in_place", recorded_in_place)
    write_claim_metadata(plugin_dir, cdi_dir, CLAIM, DEVICES, None, spec_durable=durable)
    spec = f"dra.cpu_metadata_{UID}_cpus.json"
    # A tree this call made: the file is nobody's yet and is written in place.
    assert seen == [("in place", "metadata.json", durable), ("replaced", spec, durable)]
    seen.clear()
    # Prepared again: the file may be mounted by now, so it is replaced with a rename.
    write_claim_metadata(plugin_dir, cdi_dir, CLAIM, DEVICES, None, spec_durable=durable)
    assert seen == [("replaced", "metadata.json", durable), ("replaced", spec, durable)]


async def test_the_purger_deletes_what_an_earlier_run_left_as_it_starts(
    plugin_cdi_dirs: tuple[str, str],
) -> None:
    # A crash (or a stop mid-purge) leaves set-aside directories; they go at start, not
    # only after this run's first unprepare.
    plugin_dir, cdi_dir = plugin_cdi_dirs
    write_claim_metadata(plugin_dir, cdi_dir, CLAIM, DEVICES, None)
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "web", UID, purge=False)
    assert len(entries(plugin_dir)) == 1
    purger = MetadataPurger(plugin_dir)  # a new run: nobody asks
    async with trio.open_nursery() as nursery:
        await nursery.start(purger.run)
        with trio.fail_after(10):
            while purger.purged < 1:  # counted once its thread returned
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert purger.purged == 1 and entries(plugin_dir) == []


async def test_a_purge_left_behind_holds_its_own_thread_not_trios_shared_pool(
    plugin_cdi_dirs: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin_dir, _ = plugin_cdi_dirs
    entered, release = threading.Event(), threading.Event()
    calls: list[str] = []

    purger = MetadataPurger(plugin_dir)

    def hung_purge() -> int:
        calls.append(purger.spares.root)
        entered.set()
        release.wait(30)
        return 0

    monkeypatch.setattr(purger.spares, "purge", hung_purge)
    default = trio.to_thread.current_default_thread_limiter()
    before = default.borrowed_tokens
    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(purger.run)
                await trio.to_thread.run_sync(entered.wait, 10)
                assert default.borrowed_tokens == before
                scope.cancel()  # a stop: the purge is left to its thread
        assert scope.cancelled_caught
        # A restarted service's purge waits for the one left behind instead of running
        # beside it.
        purger.soon()
        with trio.move_on_after(0.2):
            await purger.run()
        assert calls == [os.path.join(plugin_dir, METADATA_DIR)]
    finally:
        release.set()


NEW_UID = "0a9b8c7d-6e5f-4a3b-8c2d-1e0f9a8b7c6d"


@pytest.mark.parametrize("purge", [True, False])
def test_an_old_claims_unprepare_leaves_the_new_claim_of_the_same_name(
    plugin_cdi_dirs: tuple[str, str], purge: bool
) -> None:
    # team-a/web deleted and created again (a new UID), the new one prepared before the
    # old one's unprepare: the directory, keyed by namespace and name, is the new one's.
    plugin_dir, cdi_dir = plugin_cdi_dirs
    write_claim_metadata(plugin_dir, cdi_dir, CLAIM, DEVICES, None)
    new = ClaimAllocation(uid=NEW_UID, namespace="team-a", name="web")
    assert write_claim_metadata(plugin_dir, cdi_dir, new, DEVICES, None)
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "web", UID, purge=purge)
    assert entries(plugin_dir) == ["team-a_web"]
    document = json.loads(
        Path(plugin_dir, METADATA_DIR, "team-a_web", "cpus", "metadata.json").read_text()
    )
    assert document["metadata"]["uid"] == NEW_UID
    assert os.listdir(cdi_dir) == [f"dra.cpu_metadata_{NEW_UID}_cpus.json"]
    # The new claim's own unprepare removes it.
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "web", NEW_UID, purge=purge)
    assert purge_as_a_new_run(plugin_dir) == (0 if purge else 1)
    assert entries(plugin_dir) == [] and os.listdir(cdi_dir) == []


def test_only_the_old_claims_requests_go_when_both_wrote_some(
    plugin_cdi_dirs: tuple[str, str],
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    write_claim_metadata(plugin_dir, cdi_dir, CLAIM, DEVICES, None)
    new = ClaimAllocation(uid=NEW_UID, namespace="team-a", name="web")
    other_request = [
        PreparedDevice(pool_name="node-a", device_name="cpudevnuma001", request_names=("pool",))
    ]
    write_claim_metadata(plugin_dir, cdi_dir, new, other_request, None)
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "web", UID, purge=False)
    assert sorted(os.listdir(Path(plugin_dir, METADATA_DIR, "team-a_web"))) == ["pool"]
    assert os.listdir(cdi_dir) == [f"dra.cpu_metadata_{NEW_UID}_pool.json"]


@pytest.mark.parametrize("content", [b"not json", b'{"metadata": 3}', b"{}"])
def test_a_document_that_names_no_uid_is_taken_for_the_claims_own(
    plugin_cdi_dirs: tuple[str, str], content: bytes
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    write_claim_metadata(plugin_dir, cdi_dir, CLAIM, DEVICES, None)
    Path(plugin_dir, METADATA_DIR, "team-a_web", "cpus", "metadata.json").write_bytes(content)
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "web", UID)
    assert entries(plugin_dir) == []
