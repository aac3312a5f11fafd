"""What the slice reconciler knows of its slices without asking the API (docs/scale.md).

``SliceCache`` is fed by the reconciler's lists, its own writes and its watch, and does
no I/O itself. It keeps a ``SliceDigest`` per slice, so that while the watch streams a
periodic resync is a comparison (``slice_plan.cache_in_sync``), as a client-go
informer's resync replays its store; and it keeps the resource versions of the
reconciler's own writes, so that their watch events are known as ours and wake nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from dracpu.k8s.slice_plan import SliceDigest, slice_digest

if TYPE_CHECKING:
    from dracpu.k8s.watch import WatchEvent

__all__ = ["SliceCache"]

# Our own writes remembered to recognise their watch events; far more than one sync makes.
_OWN_WRITES_KEPT = 4096


class _WrittenMeta(msgspec.Struct):
    resourceVersion: str = ""


class _Written(msgspec.Struct):
    metadata: _WrittenMeta = msgspec.field(default_factory=_WrittenMeta)


_written_decoder = msgspec.json.Decoder(_Written)


def _not_older(new: str, old: str) -> bool:
    # Resource versions are opaque strings to clients; the API server's are etcd
    # revisions, so compare them as numbers when both are, and trust order otherwise.
    try:
        return int(new) >= int(old)
    except ValueError:
        return True


class SliceCache:
    """The digests of this node's slices by name, the versions of our own writes, and
    the watch's changes not (yet) known as ours."""

    def __init__(self) -> None:
        self._slices: dict[str, SliceDigest] = {}
        self._own_writes: OrderedDict[str, None] = OrderedDict()
        self._external: list[WatchEvent] = []  # changes not known as ours when they came

    def __len__(self) -> int:
        return len(self._slices)

    def digests(self) -> list[SliceDigest]:
        return list(self._slices.values())

    def reset(self, listed: Iterable[Mapping[str, Any]]) -> None:
        """After a list: exactly the slices it returned."""
        digests = (slice_digest(o) for o in listed)
        self._slices = {d.name: d for d in digests if d is not None}

    def forget(self, name: str) -> None:
        """A slice we meant to delete was already gone."""
        self._slices.pop(name, None)

    def watch_change(self, event: WatchEvent) -> bool:
        """A watch event other than a bookmark: applied; True when it is not (yet) known
        as one of our writes, so someone else may have changed our slices."""
        self._apply_event(event)
        if self._is_own(event.resource_version):
            return False
        self._external.append(event)
        return True

    def take_external(self) -> list[WatchEvent]:
        """The changes ``watch_change`` reported that are still not known as ours."""
        # An event may have come back before the answer to the write that caused it: only
        # once that sync is over (the reconciler calls this when it wakes up next) is
        # every write of ours known.
        external = [e for e in self._external if not self._is_own(e.resource_version)]
        self._external = []
        return external

    def remember_write(self, raw: bytes) -> None:
        """A create's or update's answer: the object as stored, and its version, so that
        its watch event is known as ours."""
        try:
            rv = _written_decoder.decode(raw).metadata.resourceVersion
            obj = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return  # only costs one extra sync when its event comes back
        digest = slice_digest(obj) if isinstance(obj, dict) else None
        if digest is not None:
            self._put(digest)
        if rv:
            self._remember_version(rv)

    def remember_delete(self, name: str, raw: bytes) -> None:
        """A delete's answer: the slice leaves the cache, and the version the answer
        carries, if any, is ours."""
        self._slices.pop(name, None)
        try:
            rv = _written_decoder.decode(raw).metadata.resourceVersion
        except msgspec.DecodeError:
            return
        if rv:
            self._remember_version(rv)

    def _apply_event(self, event: WatchEvent) -> None:
        """A watch event, ours or not (bookmarks are the watch's business)."""
        if event.type == "DELETED":
            cached = self._slices.get(event.name)
            if cached is not None and _not_older(event.resource_version, cached.resource_version):
                del self._slices[event.name]
            return
        try:
            obj = msgspec.json.decode(event.object)
        except msgspec.DecodeError:
            return  # unreadable: the sync this event wakes lists and refills the cache
        digest = slice_digest(obj) if isinstance(obj, dict) else None
        if digest is not None:
            self._put(digest)

    def _is_own(self, resource_version: str) -> bool:
        """Whether a watch event at this version is one of our writes coming back (each
        is recognised once)."""
        if resource_version in self._own_writes:
            del self._own_writes[resource_version]
            return True
        return False

    def _put(self, digest: SliceDigest) -> None:
        cached = self._slices.get(digest.name)
        if cached is None or _not_older(digest.resource_version, cached.resource_version):
            self._slices[digest.name] = digest

    def _remember_version(self, rv: str) -> None:
        self._own_writes[rv] = None
        while len(self._own_writes) > _OWN_WRITES_KEPT:
            self._own_writes.popitem(last=False)
