"""Logging for the daemon: klog-compatible text lines or JSON lines (behavior.md §16.1).

``setup_logging`` puts one handler on the root logger, so the stdlib ``logging`` calls
already in the code base (``log.info("...", extra={"cpu": 3})``) come out in the same
format as calls through this module's small ``Logger`` wrapper::

    log = get_logger(__name__)
    log.info("allocated cpus", v=4, claim=uid, cpus=cpus)   # shown from -v=4 up
    log.error("nri session failed", err=exc)                 # err= right after the message
    with operation("preparing resource claims", v=4):        # opID=<8 hex> on every line,
        ...                                                  # "begin: ..." / "end: ..."

Verbosity V(n) maps to the stdlib level ``INFO - n`` (V(0) = INFO, V(6) = 14); stdlib
``debug`` counts as V(6). The root logger's level does the filtering, so a V(4) line costs
one integer comparison when -v is lower; ``-vmodule`` (klog syntax, ``allocator=6,nri*=4``)
sets other limits per source file. ``v`` is the one key name a call cannot use.

Keys: the operation id comes first, then ``err``, then the call's key/values; a key given
twice on one line keeps its first position and its last value, so no line repeats a key.
"""

from __future__ import annotations

import contextvars
import fnmatch
import logging
import os
import random
import secrets
import time
import traceback
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import IO, Final, Literal

import msgspec

from dracpu.gofmt import go_quote

__all__ = [
    "LOG_FORMATS",
    "LogSetupError",
    "Logger",
    "current_op_id",
    "get_logger",
    "klog_level_for",
    "operation",
    "parse_vmodule",
    "setup_logging",
]

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final = ("text", "json")
MAX_VERBOSITY: Final = 6

# The key/values of one call travel on the record under this attribute, so user keys such as
# "name" or "msg" cannot collide with LogRecord's own attributes.
_KV_ATTR: Final = "dracpu_kv"
_ERR_ATTR: Final = "dracpu_err"
_HANDLER_MARK: Final = "_dracpu_handler"

_op_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("dracpu_op_id", default=None)

_STANDARD_ATTRS: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName", _KV_ATTR, _ERR_ATTR}
)
_JSON_RESERVED: Final = frozenset({"ts", "level", "msg", "caller", "v"})


class LogSetupError(ValueError):
    """``setup_logging`` was given a format or verbosity it cannot honour."""


def klog_level_for(v: int) -> int:
    """The stdlib level that carries an info line of verbosity ``v``."""
    if not 0 <= v <= MAX_VERBOSITY:
        raise ValueError(f"verbosity must be between 0 and {MAX_VERBOSITY}, got {v}")
    return logging.INFO - v


def _severity(levelno: int) -> str:
    """klog's three severities: everything below WARNING (V levels included) is info."""
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warning"
    return "info"


def _verbosity_of(levelno: int) -> int:
    if levelno >= logging.INFO:
        return 0
    if levelno <= logging.DEBUG:
        return MAX_VERBOSITY
    return logging.INFO - levelno


def current_op_id() -> str | None:
    """The operation id bound in this context (task), if any."""
    return _op_id.get()


class Logger:
    """A thin wrapper over a stdlib logger: messages are constant strings, data goes in
    key/values, verbosity is an argument."""

    __slots__ = ("_logger",)

    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(name)

    @property
    def name(self) -> str:
        return self._logger.name

    def enabled(self, v: int = 0) -> bool:
        """Whether an info line at V(v) would be written (to skip costly key/values)."""
        return self._logger.isEnabledFor(klog_level_for(v))

    def info(self, msg: str, /, *, v: int = 0, **kv: object) -> None:
        level = klog_level_for(v)
        if self._logger.isEnabledFor(level):
            self._logger.log(level, msg, extra={_KV_ATTR: kv}, stacklevel=2)

    def warning(self, msg: str, /, **kv: object) -> None:
        self._logger.warning(msg, extra={_KV_ATTR: kv}, stacklevel=2)

    def error(self, msg: str, /, *, err: object = None, stack: bool = False, **kv: object) -> None:
        """An error line; ``err`` (an exception or a string) is printed as ``err="..."``.
        With ``stack`` and an exception, its traceback follows as ``stacktrace``."""
        exc_info = None
        if stack and isinstance(err, BaseException):
            exc_info = (type(err), err, err.__traceback__)
        self._logger.error(
            msg, exc_info=exc_info, extra={_KV_ATTR: kv, _ERR_ATTR: err}, stacklevel=2
        )

    def exception(self, msg: str, /, **kv: object) -> None:
        """An error line for the exception being handled, with its traceback."""
        self._logger.error(msg, exc_info=True, extra={_KV_ATTR: kv}, stacklevel=2)

    def enabled_for(self, level: int) -> bool:
        return self._logger.isEnabledFor(level)

    def _log_at(self, level: int, msg: str, kv: Mapping[str, object], stacklevel: int) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, msg, extra={_KV_ATTR: dict(kv)}, stacklevel=stacklevel + 1)


def get_logger(name: str) -> Logger:
    return Logger(name)


class operation:  # lower case: used like a function, ``with operation(...) as op_id``
    """Bind a fresh operation id (8 lowercase hex chars) to every line logged inside.

    With a ``message``, the first line is ``begin: <message>`` and the last ``end:
    <message>`` (both at V(``v``), with ``kv``); an exception leaving the block is reported
    on the ``end`` line as ``err``. Nested operations get their own id and restore the
    outer one on exit. Trio tasks spawned inside inherit the id (contextvars).
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        v: int = 0,
        logger: Logger | None = None,
        new_id: Callable[[], str] | None = None,
        **kv: object,
    ) -> None:
        self.message = message
        self.v = v
        self.kv = kv
        self._level = klog_level_for(v)
        self._logger = logger or _OPERATION_LOGGER
        self._new_id = new_id or _random_op_id
        self._token: contextvars.Token[str | None] | None = None
        self._logged = False
        self.op_id = ""

    def __enter__(self) -> str:
        self.op_id = self._new_id()
        self._token = _op_id.set(self.op_id)
        # Hot paths (every NRI event) open an operation whose lines are usually filtered:
        # decide once whether to build them at all.
        self._logged = self.message is not None and self._logger.enabled_for(self._level)
        if self._logged:
            self._logger._log_at(self._level, f"begin: {self.message}", self.kv, stacklevel=2)
        return self.op_id

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._logged:
                kv = dict(self.kv)
                if exc is not None:
                    kv["err"] = _describe_error(exc)
                self._logger._log_at(self._level, f"end: {self.message}", kv, stacklevel=2)
        finally:
            assert self._token is not None
            _op_id.reset(self._token)
            self._token = None


_OPERATION_LOGGER = Logger("dracpu")


# Operation ids tell lines apart, they guard nothing: a generator seeded once from the OS
# saves a getrandom(2) call on every NRI event.
_OP_IDS = random.Random(secrets.randbits(64))


def _random_op_id() -> str:
    return f"{_OP_IDS.getrandbits(32):08x}"


def _describe_error(err: object) -> str:
    if isinstance(err, BaseException):
        text = str(err)
        return f"{type(err).__name__}: {text}" if text else type(err).__name__
    return str(err)


def _record_pairs(record: logging.LogRecord) -> dict[str, object]:
    """Every key/value of one record, in output order, each key once."""
    pairs: dict[str, object] = {}
    op_id = getattr(record, "dracpu_op_id", None)
    if op_id:
        pairs["opID"] = op_id
    err = getattr(record, _ERR_ATTR, None)
    if err is not None:
        pairs["err"] = _describe_error(err)
    elif record.exc_info and record.exc_info[1] is not None:
        pairs["err"] = _describe_error(record.exc_info[1])
    for key, value in record.__dict__.items():
        if key not in _STANDARD_ATTRS and not key.startswith("_") and key != "dracpu_op_id":
            pairs[key] = value
    kv = getattr(record, _KV_ATTR, None)
    if kv:
        pairs.update(kv)
    if record.exc_info and record.exc_info[2] is not None:
        pairs["stacktrace"] = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
    return pairs


class _OpIdFilter(logging.Filter):
    """Copies the context's operation id onto the record at the time of the call."""

    def filter(self, record: logging.LogRecord) -> bool:
        op_id = _op_id.get()
        if op_id is not None and not hasattr(record, "dracpu_op_id"):
            record.dracpu_op_id = op_id
        return True


def _klog_value(value: object) -> str:
    """A value the way klog's text logger writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "<nil>"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, BaseException):
        return go_quote(_describe_error(value))
    if isinstance(value, msgspec.Struct | dict | list | tuple):
        return msgspec.json.encode(value, enc_hook=str).decode()
    text = value if isinstance(value, str) else str(value)
    if "\n" not in text:
        return go_quote(text)
    # klog writes multi-line strings as an indented block instead of one escaped line.
    lines = "".join(f"\t{line}\n" for line in text.split("\n"))
    return f"<\n{lines} >"


class KlogFormatter(logging.Formatter):
    """``I1202 15:04:05.000000    1234 file.py:42] "message" key="value" ...``"""

    def __init__(self, *, pid: int | None = None) -> None:
        super().__init__()
        self._pid = os.getpid() if pid is None else pid

    def format(self, record: logging.LogRecord) -> str:
        letter = _severity(record.levelno)[0].upper()
        tm = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        header = (
            f"{letter}{tm.tm_mon:02d}{tm.tm_mday:02d} "
            f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}.{micros:06d} "
            f"{self._pid:7d} {os.path.basename(record.pathname)}:{record.lineno}] "
        )
        parts = [header + go_quote(record.getMessage())]
        parts.extend(f"{key}={_klog_value(val)}" for key, val in _record_pairs(record).items())
        return " ".join(parts)


def _json_default(value: object) -> object:
    if isinstance(value, BaseException):
        return _describe_error(value)
    return str(value)


class JSONFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (Unix seconds), ``level``, ``v``, ``caller``,
    ``msg``, then the key/values. A key that would shadow one of those gets a ``_``
    suffix."""

    _encoder = msgspec.json.Encoder(enc_hook=_json_default)

    def format(self, record: logging.LogRecord) -> str:
        level = _severity(record.levelno)
        out: dict[str, object] = {
            "ts": round(record.created, 6),
            "level": level,
            "v": _verbosity_of(record.levelno) if level == "info" else 0,
            "caller": f"{os.path.basename(record.pathname)}:{record.lineno}",
            "msg": record.getMessage(),
        }
        for key, value in _record_pairs(record).items():
            name = key
            while name in out:
                name += "_"
            out[name] = value
        return self._encoder.encode(out).decode()


def parse_vmodule(spec: str) -> tuple[tuple[str, int], ...]:
    """klog's ``-vmodule``: comma-separated ``pattern=N``; a pattern is a glob on the source
    file's name without ``.py`` (``allocator``, ``nri*``), or on its path if it has a ``/``."""
    entries: list[tuple[str, int]] = []
    for item in spec.split(","):
        if not item:
            continue
        pattern, sep, level = item.partition("=")
        if not sep or not pattern or not level.isascii() or not level.isdigit():
            raise LogSetupError(
                f"invalid -vmodule {go_quote(spec)}: expected comma-separated pattern=N "
                f"entries, got {go_quote(item)}"
            )
        entries.append((pattern, int(level)))
    return tuple(entries)


class _VerbosityFilter(logging.Filter):
    """Per-file verbosity (``-vmodule``); the first matching pattern wins."""

    def __init__(self, verbosity: int, vmodule: tuple[tuple[str, int], ...]) -> None:
        super().__init__()
        self._verbosity = verbosity
        self._vmodule = vmodule

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.INFO:
            return True
        v = _verbosity_of(record.levelno)
        for pattern, level in self._vmodule:
            subject = record.pathname
            if "/" not in pattern:
                subject = os.path.splitext(os.path.basename(subject))[0]
            if fnmatch.fnmatchcase(subject, pattern):
                return v <= level
        return v <= self._verbosity


def logging_setup() -> tuple[str, int, str]:
    """The (format, verbosity, vmodule) ``setup_logging`` was last called with (a helper
    process logs as the daemon does); ("text", 0, "") before any call."""
    for handler in logging.getLogger().handlers:
        setup = getattr(handler, _HANDLER_MARK, None)
        if isinstance(setup, tuple):
            return setup
    return ("text", 0, "")


def setup_logging(
    format: str = "text",
    verbosity: int = 0,
    stream: IO[str] | None = None,
    *,
    vmodule: str = "",
) -> logging.Handler:
    """Send every log record (stdlib calls included) to ``stream`` (default stderr) in
    ``format``, showing info lines up to V(``verbosity``), or per ``vmodule`` for the files
    it names. Replaces a handler installed by an earlier call; returns the new one."""
    if format not in LOG_FORMATS:
        raise LogSetupError(
            f"unknown log format {go_quote(format)}; supported formats: {', '.join(LOG_FORMATS)}"
        )
    if verbosity < 0:
        raise LogSetupError(f"log verbosity must be >= 0, got {verbosity}")
    per_file = parse_vmodule(vmodule)
    formatter: logging.Formatter = KlogFormatter() if format == "text" else JSONFormatter()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(_OpIdFilter())
    handler.addFilter(_VerbosityFilter(verbosity, per_file))
    setattr(handler, _HANDLER_MARK, (format, verbosity, vmodule))
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, _HANDLER_MARK, False):
            root.removeHandler(old)
            old.close()
    root.addHandler(handler)
    # The root level lets through the most verbose line any file may show; the handler's
    # filter then applies each file's own limit.
    verbosity = max([verbosity, *(level for _, level in per_file)])
    for v in range(1, MAX_VERBOSITY + 1):
        logging.addLevelName(klog_level_for(v), f"V{v}")  # for any other handler's output
    if verbosity >= MAX_VERBOSITY:
        root.setLevel(logging.DEBUG)
    else:
        root.setLevel(logging.INFO - verbosity)
    return handler
