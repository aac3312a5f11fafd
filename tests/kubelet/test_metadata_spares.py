"""Spare metadata trees: an unprepare's directory is taken by the next prepare.

Each prepare+unprepare pair used to create and delete two directories and a file; on ext4
without a journal every create then scans the inodes deleted in the last minute or more
(metadata_tree's docstring). A spare is renamed into place and its file rewritten in
place, so no inode is created or freed, and the purge keeps at most ``keep`` of them.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
from pathlib import Path

import pytest

from dracpu.allocation.prepare import ClaimAllocation
from dracpu.allocation.store import PreparedDevice
from dracpu.kubelet import metadata_tree
from dracpu.kubelet.metadata import (
    METADATA_DIR,
    MetadataPurger,
    remove_claim_metadata,
    write_claim_metadata,
)
from dracpu.kubelet.metadata_tree import SPARE_PREFIX, SpareDirs

UID = "6f1c2a3e-0b5d-4c1e-9a57-1d2e3f405162"
OTHER_UID = "0a9b8c7d-6e5f-4a3b-8c2d-1e0f9a8b7c6d"


def devices(*requests: str) -> list[PreparedDevice]:
    return [
        PreparedDevice(pool_name="node-a", device_name=f"cpudevnuma00{i}", request_names=(r,))
        for i, r in enumerate(requests)
    ]


def claim(name: str, uid: str = UID) -> ClaimAllocation:
    return ClaimAllocation(uid=uid, namespace="team-a", name=name)


def tree(plugin_dir: str) -> dict[str, list[str]]:
    root = Path(plugin_dir, METADATA_DIR)
    return {d.name: sorted(p.name for p in d.iterdir()) for d in sorted(root.iterdir())}


def document(plugin_dir: str, name: str, request: str) -> dict[str, object]:
    path = Path(plugin_dir, METADATA_DIR, f"team-a_{name}", request, "metadata.json")
    loaded: dict[str, object] = json.loads(path.read_bytes())
    return loaded


def inode(plugin_dir: str, name: str, request: str) -> int:
    return os.stat(
        Path(plugin_dir, METADATA_DIR, f"team-a_{name}", request, "metadata.json")
    ).st_ino


def leave_a_spare(dirs: tuple[str, str], spares: SpareDirs, name: str, *requests: str) -> None:
    """Prepare and unprepare claim ``name`` (UID ``UID``): its tree becomes a spare."""
    plugin_dir, cdi_dir = dirs
    write_claim_metadata(plugin_dir, cdi_dir, claim(name), devices(*requests), None, spares=spares)
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", name, UID, purge=False, spares=spares)


@pytest.fixture
def purger(plugin_cdi_dirs: tuple[str, str]) -> MetadataPurger:
    return MetadataPurger(plugin_cdi_dirs[0], keep=2)


def test_a_prepare_takes_the_tree_an_unprepare_set_aside(
    plugin_cdi_dirs: tuple[str, str], purger: MetadataPurger
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    spares = purger.spares
    assert write_claim_metadata(
        plugin_dir, cdi_dir, claim("a"), devices("cpus"), None, spares=spares
    )
    first = inode(plugin_dir, "a", "cpus")
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "a", UID, purge=False, spares=spares)
    (aside,) = tree(plugin_dir)
    assert aside.startswith(SPARE_PREFIX) and spares.count == 1
    assert os.listdir(cdi_dir) == []
    # Another claim: its tree is the spare, its file the same inode with its own document.
    ids = write_claim_metadata(
        plugin_dir, cdi_dir, claim("b", OTHER_UID), devices("cpus"), None, spares=spares
    )
    assert ids == {"cpus": f"dra.cpu/metadata={OTHER_UID}_cpus"}
    assert tree(plugin_dir) == {"team-a_b": ["cpus"]}
    assert spares.count == 0 and spares.taken == 1
    assert inode(plugin_dir, "b", "cpus") == first
    written = document(plugin_dir, "b", "cpus")
    assert written["metadata"] == {
        "name": "b",
        "namespace": "team-a",
        "uid": OTHER_UID,
        "generation": 1,
    }
    # Exactly the new document: a longer old one leaves no tail behind.
    path = Path(plugin_dir, METADATA_DIR, "team-a_b", "cpus", "metadata.json")
    assert path.read_bytes().endswith(b"}\n")
    mode = os.stat(path).st_mode
    assert stat.S_IMODE(mode) == 0o644


def test_a_spare_with_other_requests_is_reshaped(
    plugin_cdi_dirs: tuple[str, str], purger: MetadataPurger
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    spares = purger.spares
    leave_a_spare(plugin_cdi_dirs, spares, "a", "x", "y", "z")
    # Two requests, neither named like the spare's three: two are renamed, one deleted.
    ids = write_claim_metadata(
        plugin_dir, cdi_dir, claim("b", OTHER_UID), devices("cpus", "y"), None, spares=spares
    )
    assert sorted(ids) == ["cpus", "y"]
    assert tree(plugin_dir) == {"team-a_b": ["cpus", "y"]}
    for request in ("cpus", "y"):
        assert document(plugin_dir, "b", request)["requests"][0]["name"] == request  # type: ignore[index]
    assert sorted(os.listdir(cdi_dir)) == [
        f"dra.cpu_metadata_{OTHER_UID}_cpus.json",
        f"dra.cpu_metadata_{OTHER_UID}_y.json",
    ]
    # And one with more requests than the spare held: the missing ones are made.
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "b", OTHER_UID, purge=False, spares=spares)
    write_claim_metadata(
        plugin_dir, cdi_dir, claim("c"), devices("p", "q", "r"), None, spares=spares
    )
    assert tree(plugin_dir) == {"team-a_c": ["p", "q", "r"]}
    assert os.listdir(Path(plugin_dir, METADATA_DIR, "team-a_c", "r")) == ["metadata.json"]


def test_a_live_tree_is_never_written_in_place(
    plugin_cdi_dirs: tuple[str, str], purger: MetadataPurger
) -> None:
    # Prepared again while its containers may run: the file is replaced (a new inode), so
    # a container that mounts the old one never reads half a document.
    plugin_dir, cdi_dir = plugin_cdi_dirs
    spares = purger.spares
    write_claim_metadata(plugin_dir, cdi_dir, claim("a"), devices("cpus"), None, spares=spares)
    mounted = inode(plugin_dir, "a", "cpus")
    write_claim_metadata(plugin_dir, cdi_dir, claim("a"), devices("cpus"), None, spares=spares)
    assert inode(plugin_dir, "a", "cpus") != mounted
    assert spares.taken == 0


def test_a_claim_directory_that_is_there_is_written_live_and_no_spare_is_used(
    plugin_cdi_dirs: tuple[str, str], purger: MetadataPurger
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    spares = purger.spares
    leave_a_spare(plugin_cdi_dirs, spares, "a", "cpus")
    held = Path(plugin_dir, METADATA_DIR, "team-a_b")
    held.mkdir()
    (held / "keep").write_text("someone's")
    assert write_claim_metadata(
        plugin_dir, cdi_dir, claim("b"), devices("cpus"), None, spares=spares
    )
    assert sorted(os.listdir(held)) == ["cpus", "keep"]
    assert (held / "keep").read_text() == "someone's"
    assert spares.count == 1 and spares.taken == 0


def test_a_spare_deleted_behind_its_back_is_skipped(
    plugin_cdi_dirs: tuple[str, str], purger: MetadataPurger
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    spares = purger.spares
    for name in ("a", "b"):
        write_claim_metadata(plugin_dir, cdi_dir, claim(name), devices("cpus"), None, spares=spares)
    set_aside = []
    for name in ("a", "b"):
        before = set(tree(plugin_dir))
        remove_claim_metadata(plugin_dir, cdi_dir, "team-a", name, UID, purge=False, spares=spares)
        set_aside += sorted(set(tree(plugin_dir)) - before)
    newest = set_aside[-1]  # the one a prepare takes first
    os.rename(Path(plugin_dir, METADATA_DIR, newest), Path(plugin_dir, newest))
    assert write_claim_metadata(
        plugin_dir, cdi_dir, claim("c"), devices("cpus"), None, spares=spares
    )
    assert spares.count == 0 and spares.taken == 1
    assert tree(plugin_dir) == {"team-a_c": ["cpus"]}


def test_a_crash_mid_build_leaves_no_claim_path_and_the_next_run_deletes_the_tree(
    plugin_cdi_dirs: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Killed between taking a spare and renaming it into place: the claim's path holds
    # nothing (least of all the earlier claim's document), and a kubelet retry builds anew.
    plugin_dir, cdi_dir = plugin_cdi_dirs
    spares = MetadataPurger(plugin_dir).spares
    leave_a_spare(plugin_cdi_dirs, spares, "a", "cpus")

    class Killed(BaseException):
        pass

    def killed(path: str, data: bytes, *, durable: bool) -> None:
        raise Killed

    monkeypatch.setattr(metadata_tree, "_write_in_place", killed)
    with pytest.raises(Killed):
        write_claim_metadata(plugin_dir, cdi_dir, claim("b"), devices("cpus"), None, spares=spares)
    monkeypatch.undo()
    (left,) = tree(plugin_dir)
    assert left.startswith(SPARE_PREFIX) and os.listdir(cdi_dir) == []
    # The next run: its first purge deletes the half-built tree, and the retry writes.
    again = MetadataPurger(plugin_dir).spares
    assert again.purge() == 1 and tree(plugin_dir) == {}
    assert write_claim_metadata(
        plugin_dir, cdi_dir, claim("b"), devices("cpus"), None, spares=again
    )
    assert document(plugin_dir, "b", "cpus")["metadata"]["name"] == "b"  # type: ignore[index]


def test_a_tree_that_cannot_be_reshaped_is_deleted_and_every_request_reported(
    plugin_cdi_dirs: tuple[str, str],
    purger: MetadataPurger,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    spares = purger.spares
    leave_a_spare(plugin_cdi_dirs, spares, "a", "x")
    rename = os.rename

    def no_space(src: str, dst: str) -> None:
        if os.path.basename(dst) == "cpus":
            raise OSError(28, "No space left on device")
        rename(src, dst)

    monkeypatch.setattr(metadata_tree.os, "rename", no_space)
    with caplog.at_level(logging.WARNING):
        ids = write_claim_metadata(
            plugin_dir, cdi_dir, claim("b"), devices("cpus", "pool"), None, spares=spares
        )
    monkeypatch.undo()
    assert ids == {} and tree(plugin_dir) == {} and os.listdir(cdi_dir) == []
    for request in ("cpus", "pool"):
        assert f"claim team-a/b request {request}: [Errno 28] No space left" in caplog.text


def test_a_request_that_cannot_be_written_is_left_out_of_the_tree(
    plugin_cdi_dirs: tuple[str, str], purger: MetadataPurger, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    spares = purger.spares
    write_in_place = metadata_tree._write_in_place

    def refuse_pool(path: str, data: bytes, *, durable: bool) -> None:
        if "/pool/" in path:
            raise OSError(5, "Input/output error")
        write_in_place(path, data, durable=durable)

    monkeypatch.setattr(metadata_tree, "_write_in_place", refuse_pool)
    ids = write_claim_metadata(
        plugin_dir, cdi_dir, claim("a"), devices("cpus", "pool"), None, spares=spares
    )
    assert list(ids) == ["cpus"]
    assert tree(plugin_dir) == {"team-a_a": ["cpus"]}
    assert os.listdir(cdi_dir) == [f"dra.cpu_metadata_{UID}_cpus.json"]


def test_specs_of_requests_another_claim_took_over_are_still_removed(
    plugin_cdi_dirs: tuple[str, str], purger: MetadataPurger
) -> None:
    # The review's sequence: A (r1, r2) deleted and created again as B (r1), B prepared
    # before A's unprepare and unprepared first. A's unprepare then finds only r2 in the
    # directory, yet its spec for r1 must go too.
    plugin_dir, cdi_dir = plugin_cdi_dirs
    spares = purger.spares
    write_claim_metadata(plugin_dir, cdi_dir, claim("c"), devices("r1", "r2"), None, spares=spares)
    b = claim("c", OTHER_UID)
    write_claim_metadata(plugin_dir, cdi_dir, b, devices("r1"), None, spares=spares)
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "c", OTHER_UID, purge=False, spares=spares)
    assert sorted(os.listdir(cdi_dir)) == [
        f"dra.cpu_metadata_{UID}_r1.json",
        f"dra.cpu_metadata_{UID}_r2.json",
    ]
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "c", UID, purge=False, spares=spares)
    assert os.listdir(cdi_dir) == []
    assert all(name.startswith(SPARE_PREFIX) for name in tree(plugin_dir))


def test_the_purge_keeps_the_newest_spares_and_deletes_an_earlier_runs(
    plugin_cdi_dirs: tuple[str, str],
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    # An earlier run's set-aside directory, unknown to this run's spares.
    write_claim_metadata(plugin_dir, cdi_dir, claim("old"), devices("cpus"), None)
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "old", UID, purge=False)
    (earlier,) = tree(plugin_dir)
    purger = MetadataPurger(plugin_dir, keep=2)
    spares = purger.spares
    names = []
    for name in ("a", "b", "c", "d"):
        write_claim_metadata(plugin_dir, cdi_dir, claim(name), devices("cpus"), None, spares=spares)
    for name in ("a", "b", "c", "d"):  # four pods gone at once: four spares, oldest first
        before = set(tree(plugin_dir))
        remove_claim_metadata(plugin_dir, cdi_dir, "team-a", name, UID, purge=False, spares=spares)
        names += sorted(set(tree(plugin_dir)) - before)
    assert spares.overflowing()
    assert spares.purge() == 3  # the two oldest of this run, and the earlier run's
    assert sorted(tree(plugin_dir)) == sorted(names[2:])
    assert earlier not in tree(plugin_dir)
    assert not spares.overflowing() and spares.purge() == 0
    # The kept ones are still taken, newest first.
    write_claim_metadata(plugin_dir, cdi_dir, claim("e"), devices("cpus"), None, spares=spares)
    assert sorted(tree(plugin_dir)) == sorted([names[2], "team-a_e"])


def test_keep_must_not_be_negative(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep must not be negative, not -1"):
        SpareDirs(str(tmp_path), keep=-1)


def test_a_symlink_in_a_spare_is_not_followed(
    plugin_cdi_dirs: tuple[str, str], purger: MetadataPurger, caplog: pytest.LogCaptureFixture
) -> None:
    # Whatever replaced a spare's file with a link, the write does not go through it.
    plugin_dir, cdi_dir = plugin_cdi_dirs
    spares = purger.spares
    leave_a_spare(plugin_cdi_dirs, spares, "a", "cpus")
    (aside,) = tree(plugin_dir)
    target = Path(plugin_dir, "target")
    target.write_text("untouched")
    link = Path(plugin_dir, METADATA_DIR, aside, "cpus", "metadata.json")
    link.unlink()
    link.symlink_to(target)
    with caplog.at_level(logging.WARNING):
        ids = write_claim_metadata(
            plugin_dir, cdi_dir, claim("b"), devices("cpus"), None, spares=spares
        )
    assert ids == {} and os.listdir(cdi_dir) == []
    assert target.read_text() == "untouched"
    assert "failed to write device metadata for claim team-a/b request cpus" in caplog.text


def test_purges_and_prepares_at_once_never_lose_a_claims_file(
    plugin_cdi_dirs: tuple[str, str],
) -> None:
    # The purge deletes spares in its own thread while prepares take them: a spare is
    # taken or deleted, never both (a deletion walks a directory by its descriptor, and
    # would follow one renamed to a claim's path).
    plugin_dir, cdi_dir = plugin_cdi_dirs
    purger = MetadataPurger(plugin_dir, keep=1)
    spares = purger.spares
    stop = threading.Event()

    def purge_all_the_time() -> None:
        while not stop.is_set():
            spares.purge()

    purging = threading.Thread(target=purge_all_the_time)
    purging.start()
    try:
        for round_ in range(150):
            name = f"c{round_ % 7}"
            write_claim_metadata(
                plugin_dir, cdi_dir, claim(name), devices("cpus"), None, spares=spares
            )
            assert document(plugin_dir, name, "cpus")["metadata"]["name"] == name  # type: ignore[index]
            remove_claim_metadata(
                plugin_dir, cdi_dir, "team-a", name, UID, purge=False, spares=spares
            )
    finally:
        stop.set()
        purging.join()
    assert spares.taken > 0
    spares.purge()
    assert len(tree(plugin_dir)) <= 1 and os.listdir(cdi_dir) == []


def spare_file(plugin_dir: str, request: str = "cpus") -> Path:
    """The metadata file of the one spare in the plugin dir."""
    (aside,) = tree(plugin_dir)
    return Path(plugin_dir, METADATA_DIR, aside, request, "metadata.json")


def test_a_fifo_in_a_spare_is_refused_without_hanging(
    plugin_cdi_dirs: tuple[str, str], purger: MetadataPurger, caplog: pytest.LogCaptureFixture
) -> None:
    # Opening a FIFO to write waits for a reader: the metadata thread, and every prepare
    # and unprepare behind it, would wait for ever. Not a regular file: refused at once.
    plugin_dir, cdi_dir = plugin_cdi_dirs
    spares = purger.spares
    leave_a_spare(plugin_cdi_dirs, spares, "a", "cpus")
    fifo = spare_file(plugin_dir)
    fifo.unlink()
    os.mkfifo(fifo)
    with caplog.at_level(logging.WARNING):
        ids = write_claim_metadata(
            plugin_dir, cdi_dir, claim("b"), devices("cpus"), None, spares=spares
        )
    assert ids == {} and tree(plugin_dir) == {} and os.listdir(cdi_dir) == []
    # With no reader the open fails at once (ENXIO); with one, the file type is refused.
    assert "failed to write device metadata for claim team-a/b request cpus" in caplog.text


def test_an_unprepare_reading_a_fifo_does_not_hang(
    plugin_cdi_dirs: tuple[str, str], purger: MetadataPurger
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    spares = purger.spares
    write_claim_metadata(plugin_dir, cdi_dir, claim("a"), devices("cpus"), None, spares=spares)
    path = Path(plugin_dir, METADATA_DIR, "team-a_a", "cpus", "metadata.json")
    path.unlink()
    os.mkfifo(path)
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "a", UID, purge=False, spares=spares)
    # Unreadable is taken for the claim's own: set aside like any other.
    assert "team-a_a" not in tree(plugin_dir) and spares.count == 1


def test_a_stray_file_in_a_spare_is_removed_while_reshaping(
    plugin_cdi_dirs: tuple[str, str], purger: MetadataPurger
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    spares = purger.spares
    write_claim_metadata(plugin_dir, cdi_dir, claim("a"), devices("x"), None, spares=spares)
    Path(plugin_dir, METADATA_DIR, "team-a_a", "stray").write_text("not a request")
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "a", UID, purge=False, spares=spares)
    ids = write_claim_metadata(
        plugin_dir, cdi_dir, claim("b"), devices("cpus"), None, spares=spares
    )
    assert list(ids) == ["cpus"]
    assert tree(plugin_dir) == {"team-a_b": ["cpus"]}


def test_a_tree_in_place_is_kept_when_only_its_parent_cannot_be_synced(
    plugin_cdi_dirs: tuple[str, str],
    purger: MetadataPurger,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    root = os.path.join(plugin_dir, METADATA_DIR)
    fsync_dir = metadata_tree.fsync_dir

    def root_fails(path: str) -> None:
        if path == root:
            raise OSError(5, "Input/output error")
        fsync_dir(path)

    monkeypatch.setattr(metadata_tree, "fsync_dir", root_fails)
    with caplog.at_level(logging.WARNING):
        ids = write_claim_metadata(
            plugin_dir, cdi_dir, claim("a"), devices("cpus"), None, spares=purger.spares
        )
    assert list(ids) == ["cpus"] and tree(plugin_dir) == {"team-a_a": ["cpus"]}
    assert "failed to sync device metadata directory" in caplog.text
