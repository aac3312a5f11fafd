"""The device-metadata writer process (kubelet/metadata_proc.py): the same files as the
thread path, spares reused, requests that outlive a writer, a request that kills writers,
bad input, a stop, and the wire format's bytes."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import trio

from dracpu.allocation.prepare import ClaimAllocation
from dracpu.kubelet import metadata_proc
from dracpu.kubelet.metadata import METADATA_DIR, write_claim_files, write_metadata_specs
from dracpu.kubelet.metadata_proc import (
    CallFailed,
    FrameError,
    Frames,
    MetadataProcess,
    RemoveTree,
    TreeWritten,
    WriteTree,
    frame,
)
from dracpu.kubelet.metadata_tree import SpareDirs

UID = "6f1c2a3e-0b5d-4c1e-9a57-1d2e3f405162"
DOC = b'{"kind":"DeviceMetadata"}\n'


def claim(name: str = "web", uid: str = UID) -> ClaimAllocation:
    return ClaimAllocation(uid=uid, namespace="team-a", name=name)


def claim_dir(plugin_dir: str, name: str = "web") -> str:
    return os.path.join(plugin_dir, METADATA_DIR, f"team-a_{name}")


def files_under(root: str) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(Path(root).rglob("*"))
        if p.is_file()
    }


def quick(plugin_dir: str, command: list[str] | None = None) -> MetadataProcess:
    """A writer process service that replaces ended writers at once (tests)."""
    return MetadataProcess(plugin_dir, command=command, restart_delay=(0.01, 0.05))


async def test_the_writer_writes_what_the_thread_path_writes(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    dirs = {}
    for kind in ("thread", "process"):
        plugin_dir, cdi_dir = tmp_path / kind / "plugin", tmp_path / kind / "cdi"
        plugin_dir.mkdir(parents=True)
        cdi_dir.mkdir()
        dirs[kind] = (str(plugin_dir), str(cdi_dir))
    files = [("cpus", DOC), ("gpu", DOC.replace(b"}", b',"x":1}'))]

    plugin_dir, cdi_dir = dirs["thread"]
    written = write_claim_files(claim(), claim_dir(plugin_dir), files, durable=False, spares=None)
    thread_ids = write_metadata_specs(
        cdi_dir, claim(), claim_dir(plugin_dir), written, durable=False
    )

    plugin_dir, cdi_dir = dirs["process"]
    process = MetadataProcess(plugin_dir)
    await nursery.start(process.run)
    ids = await process.write(claim(), claim_dir(plugin_dir), files, cdi_dir, durable=False)
    assert (
        ids
        == thread_ids
        == {"cpus": f"dra.cpu/metadata={UID}_cpus", "gpu": f"dra.cpu/metadata={UID}_gpu"}
    )
    assert files_under(dirs["process"][0]) == files_under(dirs["thread"][0])
    # The specs name the file by its path, which differs by the directory only.
    thread_specs = files_under(dirs["thread"][1])
    process_specs = files_under(dirs["process"][1])
    assert process_specs == {
        name: spec.replace(dirs["thread"][0].encode(), plugin_dir.encode())
        for name, spec in thread_specs.items()
    }

    await process.remove(plugin_dir, cdi_dir, "team-a", "web", UID)
    assert os.listdir(cdi_dir) == []
    spare = os.listdir(os.path.join(plugin_dir, METADATA_DIR))
    assert len(spare) == 1 and spare[0].startswith(".removed-")
    # The next claim takes that spare: its file keeps the inode.
    inode = os.stat(os.path.join(plugin_dir, METADATA_DIR, spare[0], "cpus", "metadata.json"))
    await process.write(claim("db"), claim_dir(plugin_dir, "db"), files[:1], cdi_dir, durable=False)
    assert os.stat(os.path.join(claim_dir(plugin_dir, "db"), "cpus", "metadata.json")).st_ino == (
        inode.st_ino
    )
    assert process.starts == 1


def stop(pid: int | None) -> None:
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)


async def wait_for(condition: Callable[[], bool]) -> None:
    with trio.fail_after(10):
        while not condition():
            await trio.sleep(0.01)


async def test_requests_outlive_a_writer_that_dies(
    nursery: trio.Nursery, plugin_cdi_dirs: tuple[str, str]
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    process = quick(plugin_dir)
    await nursery.start(process.run)
    await wait_for(lambda: process.serving)
    first = process.pid
    stop(first)  # the writer hangs; the request waits in its pipe
    results: list[dict[str, str]] = []

    async def write() -> None:
        results.append(
            await process.write(
                claim(), claim_dir(plugin_dir), [("cpus", DOC)], cdi_dir, durable=False
            )
        )

    nursery.start_soon(write)
    await trio.sleep(0.1)
    assert results == []
    assert first is not None
    os.kill(first, signal.SIGKILL)
    await wait_for(lambda: bool(results))
    # The next writer answered it: the files are there, the spec names them.
    assert results == [{"cpus": f"dra.cpu/metadata={UID}_cpus"}]
    assert process.starts == 2 and process.pid != first
    assert os.listdir(cdi_dir) == [f"dra.cpu_metadata_{UID}_cpus.json"]
    assert files_under(claim_dir(plugin_dir)) == {"cpus/metadata.json": DOC}


# The real writer, except that a claim named "poison" ends it.
POISONED = """
import os, sys
from dracpu.kubelet import metadata_proc as m
real = m.handle
def handle(request, spares):
    if isinstance(request, m.WriteTree) and request.claim.name == "poison":
        os._exit(9)
    return real(request, spares)
m.handle = handle
sys.exit(m.child_main(sys.argv[1:]))
"""


async def test_only_the_request_that_ends_writers_fails(
    plugin_cdi_dirs: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    command = [sys.executable, "-c", POISONED, "--plugin-dir", plugin_dir]
    process = quick(plugin_dir, command)
    results: dict[str, dict[str, str]] = {}

    async def write(name: str) -> None:
        results[name] = await process.write(
            claim(name, uid=f"uid-{name}"),
            claim_dir(plugin_dir, name),
            [("cpus", DOC)],
            cdi_dir,
            durable=False,
        )

    with caplog.at_level(logging.WARNING, logger="dracpu.kubelet.metadata_proc"):
        async with trio.open_nursery() as nursery:
            await nursery.start(process.run)
            async with trio.open_nursery() as calls:
                for name in ("a", "poison", "b", "c"):
                    calls.start_soon(write, name)
                    await trio.sleep(0)  # in this order
            nursery.cancel_scope.cancel()
    assert results == {
        "a": {"cpus": "dra.cpu/metadata=uid-a_cpus"},
        "poison": {},
        "b": {"cpus": "dra.cpu/metadata=uid-b_cpus"},
        "c": {"cpus": "dra.cpu/metadata=uid-c_cpus"},
    }
    # The first writer ended on the batch; the next two on it, resent alone (it is
    # failed then); the fourth served the rest.
    assert process.starts == 4
    assert (
        "cannot write device metadata for claim team-a/poison: the device metadata writer "
        "exited on it" in caplog.text
    )
    assert sorted(os.listdir(cdi_dir)) == [
        f"dra.cpu_metadata_uid-{n}_cpus.json" for n in ("a", "b", "c")
    ]


async def test_a_writer_that_cannot_start_fails_what_waits(
    plugin_cdi_dirs: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    process = quick(plugin_dir, [sys.executable, "-c", "import sys; sys.exit(3)"])
    with caplog.at_level(logging.WARNING, logger="dracpu.kubelet.metadata_proc"):
        async with trio.open_nursery() as nursery:
            await nursery.start(process.run)
            with trio.fail_after(20):
                ids = await process.write(
                    claim(), claim_dir(plugin_dir), [("cpus", DOC)], cdi_dir, durable=False
                )
            nursery.cancel_scope.cancel()
    assert ids == {}
    assert (
        "cannot write device metadata for claim team-a/web: the device metadata writer did "
        "not start" in caplog.text
    )
    assert "device metadata writer: did not start; another in 0.01s" in caplog.text


async def test_a_stop_answers_what_is_unanswered_and_what_comes_after(
    plugin_cdi_dirs: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metadata_proc, "STOP_TIMEOUT", 0.2)
    plugin_dir, cdi_dir = plugin_cdi_dirs
    process = quick(plugin_dir)
    removed: list[str] = []
    with caplog.at_level(logging.WARNING, logger="dracpu.kubelet.metadata_proc"):
        async with trio.open_nursery() as nursery:
            await nursery.start(process.run)
            await wait_for(lambda: process.serving)
            pid = process.pid
            stop(pid)

            async def remove() -> None:
                await process.remove(plugin_dir, cdi_dir, "team-a", "web", UID)
                removed.append("answered")

            nursery.start_soon(remove)
            await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
        assert removed == ["answered"]
        assert "cannot remove device metadata of claim team-a/web: the daemon is stopping" in (
            caplog.text
        )
        # A call after the stop fails at once.
        with trio.fail_after(1):
            await process.remove(plugin_dir, cdi_dir, "team-a", "db", UID)
        assert "claim team-a/db: the device metadata writer is not running" in caplog.text
    # The hung writer was killed once its grace ran out.
    assert process.pid is None
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_bad_input_makes_the_writer_exit_2(plugin_cdi_dirs: tuple[str, str]) -> None:
    plugin_dir = plugin_cdi_dirs[0]
    command = [sys.executable, "-m", "dracpu.kubelet.metadata_proc", "--plugin-dir", plugin_dir]
    cases = {
        frame(b"\xc1"): "not a request",
        frame(msgspec.msgpack.encode(["written", 1, {}])): "not a request",
        (1 << 30).to_bytes(4, "big"): f"frame of {1 << 30} bytes (at most {16 << 20})",
    }
    for data, words in cases.items():
        done = subprocess.run(command, input=data, capture_output=True, timeout=60)
        assert done.returncode == 2
        assert done.stdout == b"\x01"  # started, then answered nothing
        assert f"bad input from the daemon, exiting: {words}" in done.stderr.decode()
    # The end of the input is a clean exit.
    done = subprocess.run(command, input=b"", capture_output=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, b"\x01")


def test_frames_arrive_in_pieces_and_are_bounded() -> None:
    frames = Frames()
    stream = frame(b"abc") + frame(b"") + frame(b"x" * 300)
    got = []
    for i in range(0, len(stream), 7):
        got += frames.feed(stream[i : i + 7])
    assert got == [b"abc", b"", b"x" * 300]
    with pytest.raises(FrameError, match="frame of 16777217 bytes"):
        Frames().feed((16 << 20 | 1).to_bytes(4, "big"))


def test_the_wire_format_bytes() -> None:
    # Golden vectors: a request and a reply as the daemon and the writer exchange them.
    remove = RemoveTree(id=7, plugin_dir="/p", cdi_dir="/c", namespace="ns", name="n", uid="u")
    assert frame(msgspec.msgpack.encode(remove)) == bytes.fromhex(
        "00000016"
        "97a6"
        + b"remove".hex()
        + "07a2"
        + b"/p".hex()
        + "a2"
        + b"/c".hex()
        + "a2"
        + b"ns".hex()
        + "a1"
        + b"n".hex()
        + "a1"
        + b"u".hex()
    )
    written = TreeWritten(id=1, ids={"cpus": "dra.cpu/metadata=u_cpus"})
    assert msgspec.msgpack.encode(written) == (
        b"\x93\xa7written\x01\x81\xa4cpus\xb7dra.cpu/metadata=u_cpus"
    )
    assert msgspec.msgpack.encode(CallFailed(id=2, error="e")) == b"\x93\xa6failed\x02\xa1e"
    write = WriteTree(
        id=3, claim=claim(), claim_dir="/d", files=[("r", b"{}")], cdi_dir="/c", durable=True
    )
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(write), type=WriteTree | RemoveTree)
    assert decoded == write


def test_no_request_is_handled_once_the_daemon_is_gone(plugin_cdi_dirs: tuple[str, str]) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    spares = SpareDirs(os.path.join(plugin_dir, METADATA_DIR))
    request = RemoveTree(
        id=1, plugin_dir=plugin_dir, cdi_dir=cdi_dir, namespace="team-a", name="web", uid=UID
    )
    for parent, replies in ((os.getppid(), 1), (-1, 0)):  # -1: the writer's parent changed
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        os.write(requests_w, frame(msgspec.msgpack.encode(request)))
        os.close(requests_w)
        metadata_proc.serve(requests_r, replies_w, spares, parent)
        os.close(replies_w)
        got = Frames().feed(os.read(replies_r, 1 << 16))
        assert len(got) == replies
        os.close(requests_r)
        os.close(replies_r)
