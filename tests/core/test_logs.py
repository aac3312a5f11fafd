"""Daemon logging: klog text lines, JSON lines, verbosity, operation ids (behavior.md §16.1)."""

from __future__ import annotations

import io
import json
import logging
import os
import re
from collections.abc import Iterator

import msgspec
import pytest
import trio

from dracpu.logs import (
    LogSetupError,
    current_op_id,
    get_logger,
    operation,
    setup_logging,
)

KLOG_LINE = re.compile(
    r"^(?P<level>[IWE])(?P<mmdd>\d{4}) (?P<time>\d\d:\d\d:\d\d\.\d{6}) +(?P<pid>\d+) "
    r"(?P<file>[\w.]+):(?P<line>\d+)\] (?P<rest>.*)$"
)
OP_ID = re.compile(r'opID="([0-9a-f]{8})"')

log = get_logger("dracpu.test")


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


@pytest.fixture
def text(restore_root: None) -> io.StringIO:
    out = io.StringIO()
    setup_logging("text", 4, out)
    return out


@pytest.fixture
def jsonl(restore_root: None) -> io.StringIO:
    out = io.StringIO()
    setup_logging("json", 4, out)
    return out


def _lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def _keys(rest: str) -> list[str]:
    """The keys of a klog line's key=value part (after the quoted message)."""
    return re.findall(r' ([A-Za-z_][\w.]*)=(?:"(?:[^"\\]|\\.)*"|\S+)', rest)


def test_text_line_header_and_values(text: io.StringIO) -> None:
    log.info(
        "allocated",
        claim="ns/claim-a",
        cpus="2-3,66-67",
        count=4,
        ratio=0.5,
        exclusive=True,
        node=None,
        ids=[1, 2],
        odd='tab\there "q"',
    )
    (line,) = _lines(text)
    match = KLOG_LINE.match(line)
    assert match is not None, line
    assert match["level"] == "I"
    assert int(match["pid"]) == os.getpid()
    assert match["file"] == "test_logs.py"
    assert match["rest"] == (
        '"allocated" claim="ns/claim-a" cpus="2-3,66-67" count=4 ratio=0.5 exclusive=true '
        'node=<nil> ids=[1,2] odd="tab\\there \\"q\\""'
    )


def test_text_levels_and_err(text: io.StringIO) -> None:
    log.warning("flag is deprecated", flag="reserved-cpus", driverConfigField="reservedCPUs")
    log.error("prepare failed", err=ValueError("no CPUs left"), claim="c")
    log.error("plain error string", err="timed out")
    first, second, third = _lines(text)
    assert first.startswith("W")
    assert first.endswith(
        '"flag is deprecated" flag="reserved-cpus" driverConfigField="reservedCPUs"'
    )
    assert second.startswith("E")
    assert second.endswith('"prepare failed" err="ValueError: no CPUs left" claim="c"')
    assert third.endswith('"plain error string" err="timed out"')


def test_exception_with_traceback_is_a_klog_block(text: io.StringIO) -> None:
    try:
        raise KeyError("cpu 7")
    except KeyError:
        log.exception("crashed", service="nri")
    out = text.getvalue()
    first = out.splitlines()[0]
    assert first.endswith('"crashed" err="KeyError: \'cpu 7\'" service="nri" stacktrace=<')
    assert "\n\tTraceback (most recent call last):\n" in out
    assert out.endswith("\tKeyError: 'cpu 7'\n >\n")


def test_multiline_string_value_is_a_block(text: io.StringIO) -> None:
    log.info("config", config="a: 1\nb: 2")
    assert text.getvalue().endswith('"config" config=<\n\ta: 1\n\tb: 2\n >\n')


def test_stdlib_logging_calls_come_out_in_the_same_format(text: io.StringIO) -> None:
    std = logging.getLogger("dracpu.topology.discover")
    std.info("skipping CPU cpu=%d", 3, extra={"cpu": 3, "reason": "no core_id"})
    std.warning("accept failed (%s); retrying", "EMFILE")
    std.debug("hidden at -v=4")
    first, second = _lines(text)
    assert first.endswith('"skipping CPU cpu=3" cpu=3 reason="no core_id"')
    assert first.startswith("I")
    assert second.startswith("W") and second.endswith('"accept failed (EMFILE); retrying"')


def test_verbosity_filters_info_lines(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("text", 2, out)
    log.info("v0")
    log.info("v2", v=2)
    log.info("v3", v=3)
    log.info("v6", v=6)
    logging.getLogger("x").debug("debug")
    log.warning("warn")
    log.error("err")
    messages = [line.split("] ", 1)[1] for line in _lines(out)]
    assert messages == ['"v0"', '"v2"', '"warn"', '"err"']
    assert log.enabled(2) and not log.enabled(3)

    out6 = io.StringIO()
    setup_logging("text", 6, out6)  # replaces the handler above
    log.info("v6", v=6)
    logging.getLogger("x").debug("debug")
    assert [line.split("] ", 1)[1] for line in _lines(out6)] == ['"v6"', '"debug"']
    assert len(_lines(out)) == 4  # the replaced handler's stream got nothing more
    streams = [getattr(h, "stream", None) for h in logging.getLogger().handlers]
    assert out not in streams and streams.count(out6) == 1


def test_operation_binds_an_id_to_every_line(text: io.StringIO) -> None:
    assert current_op_id() is None
    with operation("preparing resource claims", v=4, claims=2) as op_id:
        assert re.fullmatch(r"[0-9a-f]{8}", op_id)
        assert current_op_id() == op_id
        log.info("allocated", claim="a")
        logging.getLogger("dracpu.other").warning("stdlib inside")
    log.info("after")
    lines = _lines(text)
    assert [OP_ID.findall(line) for line in lines] == [[op_id]] * 4 + [[]]
    assert lines[0].endswith(f'"begin: preparing resource claims" opID="{op_id}" claims=2')
    assert lines[3].endswith(f'"end: preparing resource claims" opID="{op_id}" claims=2')
    # begin/end lines point at the caller's `with`, not at dracpu/logs.py
    assert all(KLOG_LINE.match(line)["file"] == "test_logs.py" for line in lines)  # type: ignore[index]
    assert current_op_id() is None


def test_operation_end_line_reports_the_error(text: io.StringIO) -> None:
    with pytest.raises(RuntimeError), operation("CreateContainer", v=2):
        raise RuntimeError("cgroup gone")
    last = _lines(text)[-1]
    assert '"end: CreateContainer"' in last and last.endswith('err="RuntimeError: cgroup gone"')


def test_nested_operations_restore_the_outer_id(text: io.StringIO) -> None:
    ids = iter(["aaaaaaaa", "bbbbbbbb"])
    with operation(new_id=lambda: next(ids)) as outer:
        with operation(new_id=lambda: next(ids)) as inner:
            log.info("inner")
        log.info("outer")
    assert (outer, inner) == ("aaaaaaaa", "bbbbbbbb")
    assert [OP_ID.findall(line) for line in _lines(text)] == [["bbbbbbbb"], ["aaaaaaaa"]]


def test_operation_ids_are_fresh() -> None:
    seen = set()
    for _ in range(200):
        with operation() as op_id:
            seen.add(op_id)
    assert len(seen) == 200


async def test_concurrent_trio_tasks_keep_their_own_ids(text: io.StringIO) -> None:
    got: dict[str, str] = {}

    async def rpc(name: str, delay: float) -> None:
        with operation(f"rpc {name}") as op_id:
            got[name] = op_id
            await trio.sleep(delay)
            log.info("inside", rpc=name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(rpc, "a", 0.02)
        nursery.start_soon(rpc, "b", 0.01)
    assert got["a"] != got["b"]
    for line in _lines(text):
        if '"inside"' in line:
            name = re.search(r'rpc="(\w)"', line)[1]  # type: ignore[index]
            assert OP_ID.findall(line) == [got[name]]


def test_no_line_repeats_a_key(text: io.StringIO) -> None:
    with operation():
        log.info("dup", opID="explicit", claim="x")
        logging.getLogger("dracpu.other").info("std", extra={"err": "e", "claim": "y"})
        log.error("both", err="first", claim="z")
    for line in _lines(text):
        rest = KLOG_LINE.match(line)["rest"]  # type: ignore[index]
        keys = _keys(rest)
        assert len(keys) == len(set(keys)), line
    assert _lines(text)[0].endswith('"dup" opID="explicit" claim="x"')


def test_json_lines(jsonl: io.StringIO) -> None:
    with operation("synchronize state with the runtime") as op_id:
        log.info("pods", v=2, count=3, pods=["a", "b"])
        log.error("failed", err=OSError(5, "I/O error"), msg="shadowed", ts="also")
    records = [json.loads(line) for line in _lines(jsonl)]
    begin, info, error, end = records
    assert begin["msg"] == "begin: synchronize state with the runtime"
    assert end["msg"] == "end: synchronize state with the runtime"
    assert {r["opID"] for r in records} == {op_id}
    assert info["level"] == "info" and info["v"] == 2
    assert info["count"] == 3 and info["pods"] == ["a", "b"]
    assert info["caller"].startswith("test_logs.py:")
    assert isinstance(info["ts"], float)
    assert error["level"] == "error"
    assert error["err"] == "OSError: [Errno 5] I/O error"
    assert error["msg"] == "failed" and error["msg_"] == "shadowed" and error["ts_"] == "also"
    assert list(info)[:5] == ["ts", "level", "v", "caller", "msg"]


def test_json_encodes_structs_and_odd_values(jsonl: io.StringIO) -> None:
    class Intent(msgspec.Struct):
        cpus: str

    log.info("intent", intent=Intent(cpus="1-2"), path=b"raw", obj=object.__new__(_Named))
    (record,) = [json.loads(line) for line in _lines(jsonl)]
    assert record["intent"] == {"cpus": "1-2"}
    assert record["obj"] == "named"


class _Named:
    def __str__(self) -> str:
        return "named"


@pytest.mark.parametrize(
    ("fmt", "verbosity", "message"),
    [
        ("xml", 0, 'unknown log format "xml"; supported formats: text, json'),
        ("", 0, 'unknown log format ""; supported formats: text, json'),
        ("text", -1, "log verbosity must be >= 0, got -1"),
    ],
)
def test_bad_setup(restore_root: None, fmt: str, verbosity: int, message: str) -> None:
    with pytest.raises(LogSetupError) as info:
        setup_logging(fmt, verbosity, io.StringIO())
    assert str(info.value) == message


def test_bad_verbosity_on_a_call() -> None:
    with pytest.raises(ValueError, match="verbosity must be between 0 and 6, got 7"):
        log.info("too chatty", v=7)


def test_vmodule_raises_verbosity_for_matching_files(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("text", 0, out, vmodule="test_lo*=4,other=6")
    log.info("v4 here", v=4)
    log.info("v5 here", v=5)
    lines = _lines(out)
    assert len(lines) == 1 and lines[0].endswith('"v4 here"')


def test_vmodule_can_lower_a_files_verbosity(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("text", 4, out, vmodule="test_logs=1")
    log.info("v1", v=1)
    log.info("v2", v=2)
    log.warning("warnings always")
    assert [line.split("] ", 1)[1] for line in _lines(out)] == ['"v1"', '"warnings always"']


def test_vmodule_path_patterns(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("text", 0, out, vmodule="*/core/test_logs.py=3")
    log.info("v3", v=3)
    assert len(_lines(out)) == 1


@pytest.mark.parametrize("spec", ["allocation", "=3", "nri=x", "nri=-1", "a=1,b"])
def test_bad_vmodule(restore_root: None, spec: str) -> None:
    bad = spec.split(",")[-1]
    with pytest.raises(LogSetupError) as info:
        setup_logging("text", 0, io.StringIO(), vmodule=spec)
    assert str(info.value) == (
        f'invalid -vmodule "{spec}": expected comma-separated pattern=N entries, got "{bad}"'
    )
