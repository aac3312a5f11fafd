"""The device-metadata file steps in a process of their own, beside the daemon.

Why a process: a prepare writes a claim's metadata tree and its CDI spec, an unprepare
sets the tree aside and deletes the spec (§10.3, ``metadata.py``, ``metadata_tree.py``).
On disk these must not run on the event loop (a stalled disk would stall every service),
and in a worker thread each of their twenty-odd system calls hands the interpreter lock
back and forth with the event loop. Measured in a node drain (``bench/grpc.py --real``,
64 claims prepared and unprepared at once): the metadata steps cost the daemon 0.55 ms
of CPU per prepare+unprepare pair, 0.29 ms of it on the event loop's thread, most of that
waits for the lock (futex sleeps, 2.5 per pair), and took 30% off the pairs per second.
Here the event loop's share is the encoding of one request and its reply, and the file
work runs on another core in parallel.

The writer is ``python -m dracpu.kubelet.metadata_proc``: it reads requests from its stdin
and writes replies to its stdout, in order, each a 4-byte big-endian length and a
msgpack message (``WriteTree``/``RemoveTree`` → ``TreeWritten``/``TreeRemoved`` or
``CallFailed``); its log lines go to the daemon's stderr in the daemon's format. It owns
the spare trees (``SpareDirs``): it deletes what an earlier run set aside as it starts,
and the spares beyond the kept number whenever no request waits. It exits at the end of
its input, so it ends with the daemon, kill -9 included.

``MetadataProcess`` is the daemon's side, a service of the root supervisor
(``metadata-writer``, started before the kubelet's sockets so it stops after them):
``run`` starts a writer and serves it; callers ``write`` and ``remove`` and wait for the
reply, shielded (a request sent cannot be taken back). When a writer ends, ``run``
starts another after a backoff and sends it what was unanswered (the steps are
idempotent) one request at a time, each once the one before is answered: a writer that
ends then ended on the one request it had, and a request two writers ended on so is
answered ``CallFailed``, so no request can end writers forever. A writer that cannot
start fails what waits. When ``run`` ends, every unanswered call fails ("the daemon is
stopping"), and so does every later one, at once. The writer handles no request once the
daemon that sent it is gone (its parent changed), so after a kill -9 it does not race a
new daemon's writer over the spare trees.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import struct
import subprocess
import sys
from collections.abc import Callable, Sequence

import msgspec
import trio

from dracpu.allocation.prepare import ClaimAllocation
from dracpu.atomicfile import write_all
from dracpu.kubelet.metadata import (
    METADATA_DIR,
    remove_claim_metadata,
    write_files_and_specs,
)
from dracpu.kubelet.metadata_tree import MAX_SPARES, SpareDirs
from dracpu.logs import logging_setup

__all__ = [
    "CallFailed",
    "MetadataProcess",
    "RemoveTree",
    "TreeRemoved",
    "TreeWritten",
    "WriteTree",
    "child_main",
]

log = logging.getLogger("dracpu.kubelet.metadata_proc")  # also when run as __main__

MAX_FRAME = 16 << 20  # a request or reply (a metadata document is a few KiB)
START_TIMEOUT = 60.0  # for the writer's imports and its first purge
STOP_TIMEOUT = 3.0  # for the writer to finish its request; below the service grace
MAX_ATTEMPTS = 2  # writers a request may see exit before it is answered CallFailed
_HELLO = b"\x01"  # the writer's first byte: imported, purged, reading
_LENGTH = struct.Struct(">I")


# -- the messages ---------------------------------------------------------------------------
class WriteTree(msgspec.Struct, tag="write", array_like=True, frozen=True):
    """``write_claim_files`` then ``write_metadata_specs`` for one claim (of which the
    steps read only the UID, namespace and name: the daemon sends no more)."""

    id: int
    claim: ClaimAllocation
    claim_dir: str
    files: list[tuple[str, bytes]]
    cdi_dir: str
    durable: bool


class RemoveTree(msgspec.Struct, tag="remove", array_like=True, frozen=True):
    """``remove_claim_metadata`` for one claim (its tree set aside as a spare)."""

    id: int
    plugin_dir: str
    cdi_dir: str
    namespace: str
    name: str
    uid: str


class TreeWritten(msgspec.Struct, tag="written", array_like=True, frozen=True):
    id: int
    ids: dict[str, str]  # base request -> metadata CDI id, for the specs written


class TreeRemoved(msgspec.Struct, tag="removed", array_like=True, frozen=True):
    id: int


class CallFailed(msgspec.Struct, tag="failed", array_like=True, frozen=True):
    id: int
    error: str


Request = WriteTree | RemoveTree
Reply = TreeWritten | TreeRemoved | CallFailed


class FrameError(Exception):
    """A frame longer than ``MAX_FRAME`` or a message that does not decode."""


class Frames:
    """Length-prefixed frames out of a byte stream fed in pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes | bytearray) -> list[bytes]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer)
            if length > MAX_FRAME:
                raise FrameError(f"frame of {length} bytes (at most {MAX_FRAME})")
            end = _LENGTH.size + length
            if len(self._buffer) < end:
                break
            frames.append(bytes(self._buffer[_LENGTH.size : end]))
            del self._buffer[:end]
        return frames


def frame(message: bytes) -> bytes:
    return _LENGTH.pack(len(message)) + message


# -- the writer process ---------------------------------------------------------------------
def handle(request: Request, spares: SpareDirs) -> Reply:
    """One request, as the thread path runs the same steps; an unexpected error (the
    steps log and absorb file errors themselves) becomes ``CallFailed``."""
    try:
        if isinstance(request, WriteTree):
            ids = write_files_and_specs(
                request.cdi_dir,
                request.claim,
                request.claim_dir,
                request.files,
                durable=request.durable,
                spares=spares,
            )
            return TreeWritten(id=request.id, ids=ids)
        remove_claim_metadata(
            request.plugin_dir,
            request.cdi_dir,
            request.namespace,
            request.name,
            request.uid,
            purge=False,
            spares=spares,
        )
        return TreeRemoved(id=request.id)
    except Exception as exc:  # the daemon logs it; the writer goes on
        return CallFailed(id=request.id, error=f"{type(exc).__name__}: {exc}")


def serve(read_fd: int, write_fd: int, spares: SpareDirs, parent: int | None = None) -> None:
    """Answer requests in order, the replies to what one read brought in one write, until
    the end of the input or the loss of ``parent`` (a daemon killed with requests still
    in the pipe: they are not handled for a daemon that is gone); purge spares whenever
    no request waits. Raises ``FrameError`` on input that is not requests."""
    frames = Frames()
    decoder = msgspec.msgpack.Decoder(Request)
    encoder = msgspec.msgpack.Encoder()
    while True:
        data = os.read(read_fd, 1 << 16)
        if not data:
            return
        replies = []
        for message in frames.feed(data):
            if parent is not None and os.getppid() != parent:
                return
            try:
                request = decoder.decode(message)
            except msgspec.DecodeError as exc:
                raise FrameError(f"not a request: {exc}") from None
            replies.append(frame(encoder.encode(handle(request, spares))))
        if replies:
            write_all(write_fd, b"".join(replies))
        if spares.overflowing() and not select.select([read_fd], [], [], 0)[0]:
            spares.purge()


def child_main(argv: Sequence[str] | None = None) -> int:
    """``python -m dracpu.kubelet.metadata_proc --plugin-dir DIR [--keep N] [--log-format F]
    [--v N] [--vmodule SPEC]``: the writer. Exit 0 at the end of the input, 2 on bad
    input."""
    from dracpu.logs import setup_logging

    parser = argparse.ArgumentParser(prog="dracpu-metadata-writer")
    parser.add_argument("--plugin-dir", required=True)
    parser.add_argument("--keep", type=int, default=MAX_SPARES)
    parser.add_argument("--log-format", default="text")
    parser.add_argument("--v", type=int, default=0)
    parser.add_argument("--vmodule", default="")
    args = parser.parse_args(argv)
    setup_logging(args.log_format, args.v, vmodule=args.vmodule)
    spares = SpareDirs(os.path.join(args.plugin_dir, METADATA_DIR), keep=args.keep)
    spares.purge()  # what an earlier run or writer set aside
    read_fd, write_fd = sys.stdin.fileno(), sys.stdout.fileno()
    parent = os.getppid()
    write_all(write_fd, _HELLO)
    try:
        serve(read_fd, write_fd, spares, parent)
    except FrameError as exc:
        log.error("device metadata writer: bad input from the daemon, exiting: %s", exc)
        return 2
    return 0


# -- the daemon's side ----------------------------------------------------------------------
class _Call:
    __slots__ = ("done", "frame", "reply", "sent_to", "strikes")

    def __init__(self, frame_bytes: bytes) -> None:
        self.frame = frame_bytes
        self.reply: Reply | None = None
        self.done = trio.Event()
        self.sent_to = 0  # the writer (its start number) it was last sent to
        self.strikes = 0  # writers that died on it


class MetadataProcess:
    """The daemon's side of the writer process (see the module docstring)."""

    def __init__(
        self,
        plugin_dir: str,
        *,
        keep: int = MAX_SPARES,
        command: Sequence[str] | None = None,
        restart_delay: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        """``command``: the writer to run (tests); by default this module under the
        daemon's interpreter, logging as the daemon is set up to when it starts.
        ``restart_delay``: the first and the longest wait before a writer that ended is
        replaced (doubling in between, back to the first after a minute of service)."""
        self.plugin_dir = plugin_dir
        self.keep = keep
        self.command = list(command) if command is not None else None
        self.restart_delay = restart_delay
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Reply)
        self._calls: dict[int, _Call] = {}  # unanswered, in the order they were made
        self._unsent: list[int] = []  # of those, not yet sent to the running writer
        self._next_id = 0
        self._wake = trio.Event()
        self._running = False  # run() is active: calls wait for a writer
        self._started: Callable[[], None] | None = None  # run()'s task_status.started
        self._alone: int | None = None  # the call resent alone, while one is
        self.serving = False  # a writer has started and is being served
        self.starts = 0  # writers started (for tests)
        self.pid: int | None = None

    # -- callers --------------------------------------------------------------------------
    async def write(
        self,
        claim: ClaimAllocation,
        claim_dir: str,
        files: Sequence[tuple[str, bytes]],
        cdi_dir: str,
        *,
        durable: bool,
    ) -> dict[str, str]:
        """``write_claim_files`` + ``write_metadata_specs`` in the writer: the metadata
        CDI ids of the specs written. ``CallFailed`` is logged and writes nothing."""
        reply = await self._call(
            lambda i: WriteTree(
                id=i,
                claim=ClaimAllocation(uid=claim.uid, namespace=claim.namespace, name=claim.name),
                claim_dir=claim_dir,
                files=list(files),
                cdi_dir=cdi_dir,
                durable=durable,
            )
        )
        if isinstance(reply, TreeWritten):
            return reply.ids
        assert isinstance(reply, CallFailed)
        log.warning(
            "cannot write device metadata for claim %s/%s: %s",
            claim.namespace,
            claim.name,
            reply.error,
        )
        return {}

    async def remove(
        self, plugin_dir: str, cdi_dir: str, namespace: str, name: str, uid: str
    ) -> None:
        """``remove_claim_metadata`` in the writer; ``CallFailed`` is logged."""
        reply = await self._call(
            lambda i: RemoveTree(
                id=i,
                plugin_dir=plugin_dir,
                cdi_dir=cdi_dir,
                namespace=namespace,
                name=name,
                uid=uid,
            )
        )
        if isinstance(reply, CallFailed):
            log.warning(
                "cannot remove device metadata of claim %s/%s: %s", namespace, name, reply.error
            )

    async def _call(self, make: Callable[[int], Request]) -> Reply:
        call_id = self._next_id
        self._next_id += 1
        message = self._encoder.encode(make(call_id))
        if not self._running:
            return CallFailed(id=call_id, error="the device metadata writer is not running")
        if len(message) > MAX_FRAME:
            too_big = f"request of {len(message)} bytes (at most {MAX_FRAME})"
            return CallFailed(id=call_id, error=too_big)
        call = _Call(frame(message))
        self._calls[call_id] = call
        self._unsent.append(call_id)
        self._wake.set()
        # Answered by a writer, or failed by run(): a request sent cannot be taken back.
        with trio.CancelScope(shield=True):
            await call.done.wait()
        assert call.reply is not None
        return call.reply

    def _answer(self, call_id: int, reply: Reply) -> None:
        call = self._calls.pop(call_id)
        call.reply = reply
        call.done.set()

    def _fail_all(self, error: str) -> None:
        for call_id in list(self._calls):
            self._answer(call_id, CallFailed(id=call_id, error=error))

    # -- the service ----------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve writers one after another until cancelled. Started once the first
        writer serves or has failed to start (then calls fail, logged by the caller, until
        one starts): the daemon starts with a writer, or without one rather than not at
        all. When run ends, every unanswered call fails and later ones fail at once."""
        self._running = True
        self._started = task_status.started
        first, longest = self.restart_delay
        delay = first
        stopping = "the device metadata writer stopped"
        try:
            while True:
                began = trio.current_time()
                ended = await self._serve_one()
                if trio.current_time() - began >= 60.0:
                    delay = first
                log.warning("device metadata writer: %s; another in %gs", ended, delay)
                await trio.sleep(delay)
                delay = min(delay * 2, longest)
        except BaseException as exc:
            if _cancelled(exc):
                stopping = "the daemon is stopping"
            raise
        finally:
            self._running = False
            self._fail_all(stopping)

    async def _serve_one(self) -> str:
        """Start one writer and serve it until it ends; why it ended."""
        try:
            process = await trio.lowlevel.open_process(
                self.command or self._default_command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        except OSError as exc:
            why = f"cannot start: {exc}"
            self._fail_all(f"the device metadata writer {why}")
            self._report_started()
            return why
        self.starts += 1
        self.pid = process.pid
        assert process.stdin is not None and process.stdout is not None
        try:
            hello = b""
            with trio.move_on_after(START_TIMEOUT):
                hello = bytes(await process.stdout.receive_some(len(_HELLO)))
            if hello != _HELLO:
                why = "did not start" if not hello else f"started with {hello!r}"
                self._fail_all(f"the device metadata writer {why}")
                self._report_started()
                return why
            # Whatever an earlier writer left unanswered goes to this one, oldest first,
            # one at a time; later calls after them.
            careful, self._unsent = list(self._calls), []
            self.serving = True
            self._report_started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._send, process.stdin, careful)
                ended = await self._receive(process.stdout)
                nursery.cancel_scope.cancel()
            self._strike()
            return ended
        finally:
            self.serving = False
            with trio.CancelScope(shield=True):
                await self._stop(process)

    def _report_started(self) -> None:
        started, self._started = self._started, None
        if started is not None:
            started()

    def _strike(self) -> None:
        """A writer ended while it had one request, resent alone: it ended on that one.
        A request two writers ended on is failed."""
        call_id, self._alone = self._alone, None
        call = self._calls.get(call_id) if call_id is not None else None
        if call_id is None or call is None or call.sent_to != self.starts:
            return
        call.strikes += 1
        if call.strikes >= MAX_ATTEMPTS:
            exited = "the device metadata writer exited on it"
            self._answer(call_id, CallFailed(id=call_id, error=exited))

    def _default_command(self) -> list[str]:
        log_format, verbosity, vmodule = logging_setup()
        return [
            *(sys.executable, "-m", "dracpu.kubelet.metadata_proc"),
            *("--plugin-dir", self.plugin_dir, "--keep", str(self.keep)),
            *("--log-format", log_format, "--v", str(verbosity), "--vmodule", vmodule),
        ]

    async def _send(self, stdin: trio.abc.SendStream, careful: list[int]) -> None:
        try:
            for call_id in careful:
                call = self._calls.get(call_id)
                if call is None:
                    continue
                self._alone = call_id
                call.sent_to = self.starts
                await stdin.send_all(call.frame)
                await call.done.wait()
            self._alone = None
            while True:
                if not self._unsent:
                    await self._wake.wait()
                    self._wake = trio.Event()
                    continue
                batch, self._unsent = self._unsent, []
                frames = []
                for call_id in batch:
                    call = self._calls.get(call_id)
                    if call is not None:
                        call.sent_to = self.starts
                        frames.append(call.frame)
                await stdin.send_all(b"".join(frames))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the writer is gone: _receive reads its end

    async def _receive(self, stdout: trio.abc.ReceiveStream) -> str:
        """Answer calls from the writer's replies; returns why it can serve no more."""
        frames = Frames()
        while True:
            data = await stdout.receive_some(1 << 16)
            if not data:
                return "exited"
            try:
                replies = [self._decoder.decode(m) for m in frames.feed(data)]
            except (FrameError, msgspec.DecodeError) as exc:
                return f"sent a bad reply: {exc}"
            for reply in replies:
                if reply.id not in self._calls:
                    return f"answered unknown call {reply.id}"
                self._answer(reply.id, reply)

    async def _stop(self, process: trio.Process) -> None:
        """End the writer's input, give it ``STOP_TIMEOUT`` to finish, then kill it."""
        assert process.stdin is not None
        await process.stdin.aclose()
        with trio.move_on_after(STOP_TIMEOUT):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
        if process.stdout is not None:
            await process.stdout.aclose()
        self.pid = None


def _cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is a cancellation (or a group of nothing else): a stop."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


if __name__ == "__main__":
    sys.exit(child_main())
