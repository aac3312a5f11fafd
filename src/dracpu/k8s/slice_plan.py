"""What this node's ResourceSlices must become (behavior.md §6.4): pure, no I/O.

``plan_reconcile`` compares the desired slices (from ``devices.build_slices``) with the
slices that exist for this driver and node, and gives the creates, updates and deletes
that converge them and the pool generation to write. ``cache_in_sync`` tells whether
that plan would be empty from ``SliceDigest`` values alone (what the reconciler's
watch-fed cache keeps), so that a periodic resync need not call the API: the two must
agree, and tests/k8s checks one against the other. ``k8s/slices.py`` runs them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

__all__ = [
    "Plan",
    "SliceDigest",
    "SliceUpdate",
    "cache_in_sync",
    "content_digest",
    "plan_reconcile",
    "slice_digest",
]

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class SliceUpdate:
    """Replace the existing slice ``name`` (at ``resource_version``) with ``body``."""

    name: str
    resource_version: str
    body: Obj


@dataclass(frozen=True, slots=True)
class Plan:
    generation: int
    creates: list[Obj] = field(default_factory=list)
    updates: list[SliceUpdate] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.creates or self.updates or self.deletes)


def _generation(obj: Mapping[str, Any]) -> int:
    gen = obj.get("spec", {}).get("pool", {}).get("generation", 0)
    return gen if isinstance(gen, int) else 0


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def json_copy(obj: Mapping[str, Any]) -> Obj:
    """A deep copy of JSON-shaped data (the desired slices, the bodies to write)."""
    # A JSON round trip: a deep copy of JSON-shaped data at a fraction of copy.deepcopy's
    # cost (a 768-device pool is some 280 kB of JSON).
    return msgspec.json.decode(msgspec.json.encode(obj))  # type: ignore[no-any-return]


def _with_generation(desired: Mapping[str, Any], generation: int) -> Obj:
    body = json_copy(desired)
    body["spec"]["pool"]["generation"] = generation
    return body


def _same_content(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    # Only what we own: the spec and the owner reference. Server-set metadata (uid,
    # resourceVersion, managedFields, ...) never counts as a difference.
    return existing.get("spec") == wanted.get("spec") and existing.get("metadata", {}).get(
        "ownerReferences"
    ) == wanted.get("metadata", {}).get("ownerReferences")


def _match_index(name: str, prefixes: Sequence[str]) -> int | None:
    for index, prefix in enumerate(prefixes):
        if name.startswith(prefix):
            return index
    return None


def plan_reconcile(
    desired: Sequence[Mapping[str, Any]],
    existing: Sequence[Mapping[str, Any]],
    *,
    current_generation: int | None,
) -> Plan:
    """What to create, update and delete so that ``existing`` becomes ``desired``.

    ``desired`` carries ``metadata.generateName`` (index prefix) and any generation (it is
    overwritten). ``current_generation`` is the last generation this process wrote, if
    any: the pool generation never goes backwards even when every slice was deleted.
    """
    seen = [_generation(e) for e in existing]
    known = [g for g in seen if g > 0] + ([current_generation] if current_generation else [])
    pool_gen = max(known) if known else None
    matched, deletes = _match_existing(desired, existing, pool_gen)

    if pool_gen is None:
        return Plan(
            generation=1, creates=[_with_generation(d, 1) for d in desired], deletes=deletes
        )

    missing = [i for i in range(len(desired)) if i not in matched]
    changed = [
        i
        for i, obj in sorted(matched.items())
        if not _same_content(obj, _with_generation(desired[i], pool_gen))
    ]
    if not missing and len(changed) <= 1:
        updates = [_update(matched[i], _with_generation(desired[i], pool_gen)) for i in changed]
        return Plan(generation=pool_gen, updates=updates, deletes=deletes)

    generation = pool_gen + 1
    return Plan(
        generation=generation,
        creates=[_with_generation(desired[i], generation) for i in missing],
        updates=[
            _update(obj, _with_generation(desired[i], generation))
            for i, obj in sorted(matched.items())
        ],
        deletes=deletes,
    )


def _match_existing(
    desired: Sequence[Mapping[str, Any]],
    existing: Sequence[Mapping[str, Any]],
    pool_gen: int | None,
) -> tuple[dict[int, Mapping[str, Any]], list[str]]:
    """The existing slice kept for each desired index, and the names of the others to
    delete: older than the pool generation (all of them when there is none yet), of no
    desired index, or a duplicate."""
    prefixes = [str(d["metadata"]["generateName"]) for d in desired]
    deletes: list[str] = []
    matched: dict[int, Mapping[str, Any]] = {}
    # Sorted by name so that the choice among duplicates is stable between runs.
    for obj in sorted(existing, key=_name):
        index = _match_index(_name(obj), prefixes)
        if pool_gen is None or _generation(obj) < pool_gen or index is None:
            deletes.append(_name(obj))
            continue
        kept = matched.get(index)
        if kept is None:
            matched[index] = obj
            continue
        # A duplicate for one index (e.g. a create whose answer was lost): keep the one
        # that already has the wanted content, delete the other.
        wanted = _with_generation(desired[index], pool_gen)
        if _same_content(obj, wanted) and not _same_content(kept, wanted):
            deletes.append(_name(kept))
            matched[index] = obj
        else:
            deletes.append(_name(obj))
    return matched, deletes


def _update(existing: Mapping[str, Any], wanted: Obj) -> SliceUpdate:
    meta = existing.get("metadata", {})
    body = wanted  # already a fresh copy (_with_generation)
    body["metadata"].pop("generateName", None)
    body["metadata"]["name"] = str(meta.get("name", ""))
    body["metadata"]["resourceVersion"] = str(meta.get("resourceVersion", ""))
    return SliceUpdate(
        name=str(meta.get("name", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        body=body,
    )


@dataclass(frozen=True, slots=True)
class SliceDigest:
    """What the reconciler remembers of one of its slices: enough to tell, without the
    API, whether ``plan_reconcile`` would find anything to do."""

    name: str
    resource_version: str
    generation: int
    content: bytes  # content_digest(): spec without the generation, owner references


def content_digest(obj: Mapping[str, Any]) -> bytes:
    """A digest of what ``plan_reconcile`` compares (the spec and the owner references),
    the pool generation left out: a slice and the desired slice it matches have equal
    digests exactly when they differ at most in generation."""
    spec = obj.get("spec")
    if isinstance(spec, Mapping) and isinstance(spec.get("pool"), Mapping):
        spec = {**spec, "pool": {**spec["pool"], "generation": 0}}
    meta = obj.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    encoded = msgspec.json.encode([spec, owners], order="sorted")
    return hashlib.blake2b(encoded, digest_size=16).digest()


def slice_digest(obj: Mapping[str, Any]) -> SliceDigest | None:
    """The digest of a slice as the server returned it; None without a name."""
    name = _name(obj)
    if not name:
        return None
    rv = obj.get("metadata", {}).get("resourceVersion", "")
    return SliceDigest(name, str(rv), _generation(obj), content_digest(obj))


def cache_in_sync(
    desired: Sequence[Mapping[str, Any]],
    cached: Sequence[SliceDigest],
    *,
    current_generation: int | None,
    desired_digests: Sequence[bytes] | None = None,
) -> bool:
    """Whether ``plan_reconcile(desired, <the slices cached stands for>)`` is empty: one
    slice per desired index, no strays, all at one generation no older than the last one
    written, each with the wanted content. ``desired_digests`` (``content_digest`` of
    each desired slice) saves computing them again."""
    if not desired:
        return not cached
    if len(cached) != len(desired):
        return False
    generations = {c.generation for c in cached}
    if len(generations) != 1:
        return False
    (generation,) = generations
    if generation <= 0 or (current_generation is not None and generation < current_generation):
        return False
    prefixes = [str(d["metadata"]["generateName"]) for d in desired]
    wanted = (
        list(desired_digests)
        if desired_digests is not None
        else [content_digest(d) for d in desired]
    )
    seen: set[int] = set()
    for c in cached:
        index = _match_index(c.name, prefixes)
        if index is None or index in seen or c.content != wanted[index]:
            return False
        seen.add(index)
    return True
