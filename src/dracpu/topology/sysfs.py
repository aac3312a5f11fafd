"""Read-only access to a sysfs tree, optionally seen through a YAML overlay (behavior.md §4.6).

``SysfsReader`` is the only place topology discovery touches the filesystem. Paths are
relative to the sysfs root and slash-separated (``devices/system/cpu/online``). Every failure
is a ``SysfsError`` naming the file; ``OSError`` never escapes.

The overlay replaces or adds files: its keys are absolute ``/sys/...`` paths, its values the
file contents. Overlaid files are served from memory, their parent directories are
synthesised, listings merge host and overlay entries, and in a ``devices/system/cpu/cpuN``
directory an overlaid ``nodeX`` entry hides the host's ``node*`` entries so a CPU can be moved
to another NUMA node.

Reads use ``os.open``/``os.read`` on plain strings rather than ``pathlib``: discovery of a
768-CPU machine does about ten thousand of them, and the object overhead shows.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "SYSFS_ROOT",
    "SysfsError",
    "SysfsOverlayError",
    "SysfsReader",
    "TopologyError",
    "load_overlay",
    "parse_overlay",
    "validate_overlay",
]

SYSFS_ROOT = "/sys"
_CPU_DIR = re.compile(r"devices/system/cpu/cpu[0-9]+")
_NODE_ENTRY = re.compile(r"node[0-9]+")
# Sysfs attribute files are at most a page; anything larger is not a sysfs file.
_READ_LIMIT = 1 << 16
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC
# Bound once: discovery calls these ten thousand times on a large machine.
_open, _read, _close = os.open, os.read, os.close


class TopologyError(Exception):
    """Topology discovery cannot go on; the message is what the user sees."""


class SysfsError(TopologyError):
    """A sysfs file or directory could not be read. ``path`` is the full path shown."""

    def __init__(self, op: str, path: str, reason: str, *, missing: bool = False) -> None:
        self.op = op
        self.path = path
        self.reason = reason
        # True when the file does not exist, so callers can apply a documented fallback.
        self.missing = missing
        super().__init__(f"{op} {path}: {reason}")


class SysfsOverlayError(TopologyError):
    """The overlay file is unreadable (``read sysfs overlay: ...``) or invalid (``create ...``)."""


# -- overlay parsing ------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys instead of keeping the last one."""


def _construct_strict_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    result: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in result
        except TypeError as err:  # an unhashable key, e.g. a sequence
            raise yaml.constructor.ConstructorError(
                None, None, f"unhashable key {key!r}", key_node.start_mark
            ) from err
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        result[key] = loader.construct_object(value_node, deep=True)
    return result


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_strict_mapping,
)


def parse_overlay(data: str | bytes) -> dict[str, str]:
    """Parse overlay YAML into ``{absolute path: content}``; errors say ``parse sysfs overlay``."""
    try:
        raw = yaml.load(data, Loader=_StrictLoader)
    except yaml.YAMLError as err:
        raise SysfsOverlayError(f"parse sysfs overlay: {_yaml_message(err)}") from err
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SysfsOverlayError(
            f"parse sysfs overlay: the top level must be a mapping, not {type(raw).__name__}"
        )
    overlay: dict[str, str] = {}
    for key, value in raw.items():
        # YAML allows non-string keys; they are named as text and rejected by validation.
        path = key if isinstance(key, str) else str(key)
        if not isinstance(value, str):
            raise SysfsOverlayError(f'parse sysfs overlay: value for "{path}" must be a string')
        overlay[path] = value
    return overlay


def _yaml_message(err: yaml.YAMLError) -> str:
    """One line: what is wrong and where, without PyYAML's source snippet."""
    if isinstance(err, yaml.MarkedYAMLError):
        what = " ".join(part for part in (err.context, err.problem) if part)
        mark = err.problem_mark or err.context_mark
        if mark is not None:
            return f"{what} (line {mark.line + 1}, column {mark.column + 1})"
        return what
    return " ".join(str(err).split())


def load_overlay(path: str | Path) -> dict[str, str]:
    """Read and validate an overlay file; returns relative name -> content."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as err:
        raise SysfsOverlayError(f"read sysfs overlay: {path}: {err.strerror}") from err
    try:
        return validate_overlay(parse_overlay(data))
    except SysfsOverlayError as err:
        raise SysfsOverlayError(f"create sysfs overlay: {err}") from err


def _overlay_name(full: str) -> str:
    if not full.startswith(SYSFS_ROOT + "/"):
        raise SysfsOverlayError(f'sysfs overlay path "{full}" must be beneath {SYSFS_ROOT}')
    if posixpath.normpath(full) != full:
        raise SysfsOverlayError(f'sysfs overlay path "{full}" is not clean')
    name = full[len(SYSFS_ROOT) + 1 :]
    if not name or any(part in ("", ".", "..") for part in name.split("/")):
        raise SysfsOverlayError(f'invalid sysfs overlay path "{full}"')
    return name


def validate_overlay(overlay: Mapping[str, str]) -> dict[str, str]:
    """Check overlay keys (§4.6) in sorted order, so the first error is deterministic."""
    files: dict[str, str] = {}
    for full in sorted(overlay):
        files[_overlay_name(full)] = overlay[full]
    for name in sorted(files):
        parent = posixpath.dirname(name)
        while parent:
            if parent in files:
                raise SysfsOverlayError(
                    f'sysfs overlay path "{SYSFS_ROOT}/{parent}" is both a file and a directory'
                )
            parent = posixpath.dirname(parent)
    nodes: dict[str, str] = {}
    for name in sorted(files):
        parent, base = posixpath.split(name)
        if _CPU_DIR.fullmatch(parent) and _NODE_ENTRY.fullmatch(base):
            if parent in nodes:
                raise SysfsOverlayError(
                    f"sysfs overlay defines multiple NUMA nodes beneath "
                    f"{SYSFS_ROOT}/{parent}: {nodes[parent]} and {base}"
                )
            nodes[parent] = base
    return files


# -- the reader -----------------------------------------------------------------------------


class SysfsReader:
    """Reads files and lists directories beneath ``root``, overlay first.

    ``overlay`` maps names relative to the sysfs root to file contents, as returned by
    ``load_overlay``; use ``SysfsReader.with_overlay_file`` to load one from YAML.
    """

    def __init__(self, root: str | Path = SYSFS_ROOT, overlay: Mapping[str, str] | None = None):
        self.root = os.fspath(root).rstrip("/") or "/"
        self._prefix = "" if self.root == "/" else self.root
        self._files: dict[str, str] = dict(validate_overlay_names(overlay or {}))
        # overlay directory -> {entry name: is_dir}; "" is the sysfs root.
        self._dirs: dict[str, dict[str, bool]] = {}
        for name in self._files:
            parts = name.split("/")
            for depth, part in enumerate(parts):
                parent = "/".join(parts[:depth])
                self._dirs.setdefault(parent, {})[part] = depth < len(parts) - 1

    @classmethod
    def with_overlay_file(
        cls, root: str | Path = SYSFS_ROOT, overlay_file: str | Path | None = None
    ) -> SysfsReader:
        """A reader over ``root``; a non-empty ``overlay_file`` is loaded and validated."""
        if not overlay_file:
            return cls(root)
        return cls(root, load_overlay(overlay_file))

    @property
    def has_overlay(self) -> bool:
        return bool(self._files)

    def full_path(self, rel: str) -> str:
        """The path shown in messages; overlaid paths are shown as the host would have them."""
        return f"{self._prefix}/{rel}" if rel else self.root

    # -- files ------------------------------------------------------------------------------
    def read_text(self, rel: str) -> str:
        """The whole file, decoded as UTF-8 (bad bytes replaced)."""
        if self._files:
            content = self._files.get(rel)
            if content is not None:
                return content
            if rel in self._dirs:
                raise SysfsError("read", self.full_path(rel), os.strerror(errno.EISDIR))
        full = self._prefix + "/" + rel
        try:
            fd = _open(full, _READ_FLAGS)
        except OSError as err:
            raise self._error("open", full, err) from err
        try:
            data = _read(fd, _READ_LIMIT)
        except OSError as err:
            raise self._error("read", full, err) from err
        finally:
            _close(fd)
        return data.decode("utf-8", "replace")

    def read_first_line(self, rel: str) -> str:
        """The first line, without its newline (what the kernel's list files hold)."""
        text = self.read_text(rel)
        end = text.find("\n")
        return text if end < 0 else text[:end]

    @staticmethod
    def _error(op: str, full: str, err: OSError) -> SysfsError:
        reason = err.strerror or str(err)
        return SysfsError(op, full, reason, missing=err.errno in (errno.ENOENT, errno.ENOTDIR))

    # -- directories ------------------------------------------------------------------------
    def scandir(self, rel: str) -> list[tuple[str, bool]]:
        """``(name, is_dir)`` for every entry, sorted by name; symlinks are followed."""
        return sorted(self._entries(rel, with_types=True).items())

    def listdir(self, rel: str) -> list[str]:
        """Entry names, sorted. Cheaper than ``scandir``: no stat of symlinked entries."""
        return sorted(self._entries(rel, with_types=False))

    def _entries(self, rel: str, *, with_types: bool) -> dict[str, bool]:
        if rel in self._files:
            raise SysfsError("list", self.full_path(rel), os.strerror(errno.ENOTDIR))
        overlay = self._dirs.get(rel)
        full = f"{self._prefix}/{rel}" if rel else self.root
        entries: dict[str, bool] = {}
        try:
            if with_types:
                with os.scandir(full) as it:
                    for entry in it:
                        entries[entry.name] = _is_dir(entry)
            else:
                entries = dict.fromkeys(os.listdir(full), False)
        except OSError as err:
            # A directory that only the overlay has is fine; anything else is an error.
            if overlay is None or err.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise self._error("list", full, err) from err
        if overlay is not None:
            if _CPU_DIR.fullmatch(rel) and any(_NODE_ENTRY.fullmatch(n) for n in overlay):
                entries = {n: d for n, d in entries.items() if not _NODE_ENTRY.fullmatch(n)}
            entries.update(overlay)
        return entries

    def exists(self, rel: str) -> bool:
        if rel in self._files or rel in self._dirs:
            return True
        return os.path.exists(self.full_path(rel))

    def is_dir(self, rel: str) -> bool:
        if rel in self._dirs:
            return True
        if rel in self._files:
            return False
        return os.path.isdir(self.full_path(rel))


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a dangling symlink or a racing removal
        return False


def validate_overlay_names(overlay: Mapping[str, str]) -> Mapping[str, str]:
    """Accept an already relative overlay (from ``load_overlay``) after a light sanity check."""
    for name in overlay:
        if not name or name.startswith("/") or any(p in ("", ".", "..") for p in name.split("/")):
            raise SysfsOverlayError(f"create sysfs overlay: invalid sysfs overlay path {name!r}")
    return overlay
