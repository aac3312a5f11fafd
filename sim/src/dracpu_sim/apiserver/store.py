"""The object store behind the simulated API server. Pure: no I/O, no Trio.

One global ``resourceVersion`` counter (etcd's revision) orders every write. A bounded
history of events serves watches that resume from an older version and lists at an
exact older version; versions older than the history give 410 Gone, as after an etcd
compaction. Objects are kept as the JSON dicts the server would send; a stored dict is
never mutated after it is stored, so events can share it.
"""

from __future__ import annotations

import base64
import binascii
import json
import random
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from dracpu_sim.apiserver import errors, openapi
from dracpu_sim.apiserver.apply import APPLY_PATCH, applied_configuration, merge_applied
from dracpu_sim.apiserver.claim_status import (
    drop_deallocated,
    drop_disabled_device_status,
    validate_device_statuses,
)
from dracpu_sim.apiserver.deployments import validate_deployment, validate_deployment_update
from dracpu_sim.apiserver.errors import ApiError, FieldError
from dracpu_sim.apiserver.patch import json_patch, merge_patch
from dracpu_sim.apiserver.resources import (
    DEPLOYMENTS,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ResourceType,
)
from dracpu_sim.apiserver.selectors import FieldSelector, LabelSelector
from dracpu_sim.apiserver.strategic import strategic_merge_patch
from dracpu_sim.apiserver.update_rules import (
    FIELD_IMMUTABLE,
    immutable_spec,
    validate_pod_update,
)
from dracpu_sim.apiserver.validation import (
    _invalid,
    validate_name,
    validate_resource_slice,
    validate_resource_slice_update,
)

__all__ = [
    "APPLY_PATCH",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "ObjectStore",
    "WatchEvent",
    "Watcher",
]

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

# The real server's generateName alphabet (no vowels, no confusable digits).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_GENERATED_SUFFIX = 5
_MAX_GENERATE_NAME = 63 - _GENERATED_SUFFIX
# Fields a client cannot set; the server owns them.
_SERVER_META = (
    "uid",
    "creationTimestamp",
    "resourceVersion",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)


def _copy(obj: Any) -> Any:
    return msgspec.json.decode(msgspec.json.encode(obj))


def _format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class WatchEvent:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: ResourceType
    obj: Obj
    prev: Obj | None = None


@dataclass(eq=False, slots=True)
class Watcher:
    """A registered watch. ``deliver(type, object)`` is called for every event it
    should see, in order, synchronously from the write that caused it."""

    resource: ResourceType
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    deliver: Callable[[str, Obj], None]

    def _matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        if self.namespace is not None and obj["metadata"].get("namespace", "") != self.namespace:
            return False
        return self.labels.matches(obj) and self.fields.matches(obj)

    def offer(self, event: WatchEvent) -> None:
        if event.resource is not self.resource:
            return
        now, before = self._matches(event.obj), self._matches(event.prev)
        if event.type == "MODIFIED":
            # An object entering or leaving the selection is ADDED / DELETED for this
            # watcher, as the real watch cache reports it.
            if now and before:
                self.deliver("MODIFIED", event.obj)
            elif now:
                self.deliver("ADDED", event.obj)
            elif before:
                self.deliver("DELETED", event.obj)
        elif now:
            self.deliver(event.type, event.obj)


@dataclass(slots=True)
class _ListPage:
    items: list[Obj]
    rv: int
    continue_key: Key | None
    remaining: int


_META_STRINGS = ("name", "namespace", "generateName", "resourceVersion", "uid")
_META_STRING_MAPS = ("labels", "annotations")


def _cannot_unmarshal(field_name: str, value: Any, go_type: str) -> ApiError:
    # The wording of encoding/json's UnmarshalTypeError, which the real server returns.
    kind = {
        bool: "bool",
        int: "number",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), "value")
    return errors.bad_request(
        f"json: cannot unmarshal {kind} into Go struct field ObjectMeta.metadata.{field_name} "
        f"of type {go_type}"
    )


def _check_meta_types(meta: dict[str, Any]) -> None:
    """Refuse metadata fields of the wrong JSON type before anything reads them."""
    for field_name in _META_STRINGS:
        value = meta.get(field_name)
        if value is not None and not isinstance(value, str):
            raise _cannot_unmarshal(field_name, value, "string")
    for field_name in _META_STRING_MAPS:
        value = meta.get(field_name)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise _cannot_unmarshal(field_name, value, "map[string]string")
        for item in value.values():
            if not isinstance(item, str):
                raise _cannot_unmarshal(field_name, item, "string")
    finalizers = meta.get("finalizers")
    if finalizers is not None and (
        not isinstance(finalizers, list) or not all(isinstance(f, str) for f in finalizers)
    ):
        raise _cannot_unmarshal("finalizers", finalizers, "[]string")


@dataclass
class ObjectStore:
    history_limit: int = 1000
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    rng: random.Random = field(default_factory=random.Random)
    # Pods bound to a node are deleted gracefully (deletionTimestamp first, removal on a
    # later delete with gracePeriodSeconds=0), as the real server does.
    graceful_pod_deletion: bool = False
    # The DRAResourceClaimDeviceStatus feature gate (on by default from 1.33): off, a
    # claim's status.devices is dropped on write unless the claim already had some.
    device_status: bool = True

    rv: int = 0
    compacted_rv: int = 0
    _objects: dict[str, dict[Key, Obj]] = field(default_factory=dict)
    _history: deque[WatchEvent] = field(default_factory=deque)
    _watchers: list[Watcher] = field(default_factory=list)
    # Server-side apply: object uid -> field manager -> its last applied configuration.
    _applied: dict[str, dict[str, Obj]] = field(default_factory=dict)

    # ---- reads -------------------------------------------------------------------------

    def _table(self, resource: ResourceType) -> dict[Key, Obj]:
        return self._objects.setdefault(resource.plural, {})

    def _key(self, resource: ResourceType, namespace: str | None, name: str) -> Key:
        return (namespace or "" if resource.namespaced else "", name)

    def _existing(self, resource: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self._table(resource).get(self._key(resource, namespace, name))
        if obj is None:
            raise errors.not_found(resource.plural, resource.group, name)
        return obj

    def get(self, resource: ResourceType, namespace: str | None, name: str) -> Obj:
        return _copy(self._existing(resource, namespace, name))  # type: ignore[no-any-return]

    def _snapshot(self, resource: ResourceType, at_rv: int) -> dict[Key, Obj]:
        """The objects of ``resource`` as they were at ``at_rv``, by undoing newer events."""
        if at_rv < self.compacted_rv:
            raise errors.gone("The resourceVersion for the provided list is too old.")
        state = dict(self._table(resource))
        for event in reversed(self._history):
            if event.rv <= at_rv:
                break
            if event.resource is not resource:
                continue
            key = self._key(
                resource, event.obj["metadata"].get("namespace"), event.obj["metadata"]["name"]
            )
            if event.type == "ADDED":
                state.pop(key, None)
            elif event.prev is not None:
                state[key] = event.prev
        return state

    def _list_rv(self, resource_version: str | None, match: str | None) -> tuple[int, bool]:
        """(version to list at, whether it must be exact)."""
        if resource_version in (None, "", "0"):
            return self.rv, False
        try:
            wanted = int(resource_version)
        except ValueError:
            raise errors.bad_request(f"invalid resource version: {resource_version}") from None
        if wanted > self.rv:
            raise ApiError(
                504,
                "Timeout",
                f"Too large resource version: {wanted}, current: {self.rv}",
                {
                    "causes": [
                        {
                            "reason": "ResourceVersionTooLarge",
                            "message": "Too large resource version",
                        }
                    ],
                    "retryAfterSeconds": 1,
                },
                retry_after=1,
            )
        return (wanted, True) if match == "Exact" else (self.rv, False)

    def list(
        self,
        resource: ResourceType,
        namespace: str | None = None,
        labels: LabelSelector | None = None,
        fields: FieldSelector | None = None,
        *,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> Obj:
        """A ``<Kind>List`` object, as ``GET`` on a collection returns it."""
        start: Key | None = None
        if continue_token:
            at_rv, start = _decode_continue(continue_token)
            exact = True
            if at_rv < self.compacted_rv:
                raise errors.gone(
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter."
                )
        else:
            at_rv, exact = self._list_rv(resource_version, resource_version_match)
        table = (
            self._snapshot(resource, at_rv) if exact and at_rv != self.rv else self._table(resource)
        )
        page = self._page(table, resource, namespace, labels, fields, start, limit)
        metadata: Obj = {"resourceVersion": str(at_rv)}
        if page.continue_key is not None:
            metadata["continue"] = _encode_continue(at_rv, page.continue_key)
            metadata["remainingItemCount"] = page.remaining
        return {
            "kind": resource.list_kind,
            "apiVersion": resource.api_version,
            "metadata": metadata,
            "items": [_list_item(obj) for obj in page.items],
        }

    def _page(
        self,
        table: dict[Key, Obj],
        resource: ResourceType,
        namespace: str | None,
        labels: LabelSelector | None,
        fields: FieldSelector | None,
        start: Key | None,
        limit: int | None,
    ) -> _ListPage:
        keys = sorted(
            k
            for k in table
            if (start is None or k > start)
            and (namespace is None or not resource.namespaced or k[0] == namespace)
        )
        selected = [
            table[k]
            for k in keys
            if (labels is None or labels.matches(table[k]))
            and (fields is None or fields.matches(table[k]))
        ]
        if limit is None or limit <= 0 or len(selected) <= limit:
            return _ListPage(_copy(selected), self.rv, None, 0)
        head = selected[:limit]
        last = head[-1]["metadata"]
        return _ListPage(
            _copy(head), self.rv, (last.get("namespace", ""), last["name"]), len(selected) - limit
        )

    # ---- watch -------------------------------------------------------------------------

    def watch(
        self,
        resource: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        resource_version: str | None,
        deliver: Callable[[str, Obj], None],
    ) -> Watcher:
        """Register a watcher and deliver what it must see first: the current objects as
        ADDED (no version or "0"), or the retained events after ``resource_version``.
        Raises a 410 ``ApiError`` when that version is older than the history."""
        watcher = Watcher(resource, namespace, labels, fields, deliver)
        if resource_version in (None, "", "0"):
            for key in sorted(self._table(resource)):
                obj = self._table(resource)[key]
                if watcher._matches(obj):
                    deliver("ADDED", obj)
        else:
            try:
                since = int(resource_version)
            except ValueError:
                raise errors.bad_request(f"invalid resource version: {resource_version}") from None
            if since < self.compacted_rv:
                raise errors.gone(f"too old resource version: {since} ({self.compacted_rv + 1})")
            for event in self._history:
                if event.rv > since:
                    watcher.offer(event)
        self._watchers.append(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        if watcher in self._watchers:
            self._watchers.remove(watcher)

    @property
    def watcher_count(self) -> int:
        return len(self._watchers)

    def bookmark(self, resource: ResourceType) -> Obj:
        """The object of a BOOKMARK event: only kind, apiVersion and resourceVersion."""
        return {
            "kind": resource.kind,
            "apiVersion": resource.api_version,
            "metadata": {"resourceVersion": str(self.rv)},
        }

    def compact(self) -> None:
        """Forget all history (as an etcd compaction): older versions now give 410."""
        self._history.clear()
        self.compacted_rv = self.rv

    # ---- writes ------------------------------------------------------------------------

    def _record(self, kind: str, resource: ResourceType, obj: Obj, prev: Obj | None) -> None:
        event = WatchEvent(self.rv, kind, resource, obj, prev)
        self._history.append(event)
        while len(self._history) > self.history_limit:
            self.compacted_rv = self._history.popleft().rv
        for watcher in list(self._watchers):
            watcher.offer(event)

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _check_namespace(self, resource: ResourceType, namespace: str | None, meta: Obj) -> None:
        if not resource.namespaced:
            meta.pop("namespace", None)
            return
        if not namespace:
            raise errors.bad_request("the namespace of the object must be set")
        if meta.get("namespace") not in (None, "", namespace):
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        meta["namespace"] = namespace

    def _body(self, resource: ResourceType, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request was in an unknown format")
        obj = _copy(body)
        kind = obj.get("kind")
        if kind not in (None, "", resource.kind):
            raise errors.bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({resource.kind})"
            )
        obj["kind"] = resource.kind
        obj["apiVersion"] = resource.api_version
        if not isinstance(obj.get("metadata"), dict):
            obj["metadata"] = {}
        _check_meta_types(obj["metadata"])
        return obj  # type: ignore[no-any-return]

    def _validate(
        self, resource: ResourceType, obj: Obj, old: Obj | None, *, spec_rules: bool = True
    ) -> None:
        """Everything the real registry's strategy would refuse, create or update.
        ``spec_rules=False``: a /status write (the status strategies leave the spec alone)
        or pods/binding (the real BindingREST sets spec.nodeName itself)."""
        name = obj["metadata"].get("name", "")
        problems: list[FieldError] = validate_name(name) if old is None else []
        if resource is RESOURCE_SLICES:
            problems += (
                validate_resource_slice(obj)
                if old is None
                else validate_resource_slice_update(obj, old)
            )
        elif resource is DEPLOYMENTS:
            problems += (
                validate_deployment(obj) if old is None else validate_deployment_update(obj, old)
            )
        elif old is not None and resource is PODS and spec_rules:
            problems += validate_pod_update(obj, old)
        elif (
            old is not None
            and spec_rules
            and resource in (RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES)
        ):
            problems += immutable_spec(obj, old)
        if old is not None and resource is RESOURCE_CLAIMS:
            problems += validate_device_statuses(obj)
        if problems:
            raise errors.invalid(resource.kind, resource.group, name, problems)

    def _generate_name(self, prefix: str) -> str:
        suffix = "".join(self.rng.choice(_NAME_ALPHABET) for _ in range(_GENERATED_SUFFIX))
        return prefix[:_MAX_GENERATE_NAME] + suffix

    def _uid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def create(self, resource: ResourceType, namespace: str | None, body: Any) -> Obj:
        obj = self._body(resource, body)
        meta = obj["metadata"]
        self._check_namespace(resource, namespace, meta)
        if meta.get("resourceVersion"):
            raise errors.bad_request("resourceVersion should not be set on objects to be created")
        for server_field in _SERVER_META:
            meta.pop(server_field, None)
        table = self._table(resource)
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise errors.invalid(
                    resource.kind,
                    resource.group,
                    "",
                    [
                        FieldError(
                            "FieldValueRequired",
                            "metadata.name",
                            "Required value: name or generateName is required",
                        )
                    ],
                )
            # The real server retries a generated name that collides (RetryGenerateName).
            for _ in range(8):
                meta["name"] = self._generate_name(prefix)
                if self._key(resource, namespace, meta["name"]) not in table:
                    break
        self._validate(resource, obj, None)
        key = self._key(resource, namespace, meta["name"])
        if key in table:
            raise errors.already_exists(resource.plural, resource.group, meta["name"])
        meta["uid"] = self._uid()
        meta["creationTimestamp"] = _format_time(self.clock())
        if resource.has_generation:
            meta["generation"] = 1
        if resource is PODS:
            obj["status"] = {"phase": "Pending"}
        elif resource.has_status and resource.plural != "nodes":
            obj.pop("status", None)
        meta["resourceVersion"] = self._next_rv()
        table[key] = obj
        self._record("ADDED", resource, obj, None)
        return _copy(obj)  # type: ignore[no-any-return]

    def update(
        self,
        resource: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
    ) -> Obj:
        old = self._existing(resource, namespace, name)
        obj = self._body(resource, body)
        meta = obj["metadata"]
        if meta.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL "
                f"({name})"
            )
        meta["name"] = name
        self._check_namespace(resource, namespace, meta)
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv and wanted_rv != old["metadata"]["resourceVersion"]:
            raise errors.conflict(resource.plural, resource.group, name, errors.STALE_OBJECT)
        new = self._merge_for_update(resource, old, obj, subresource)
        return self._commit_update(resource, old, new, spec_rules=subresource is None)

    def _merge_for_update(
        self, resource: ResourceType, old: Obj, obj: Obj, subresource: str | None
    ) -> Obj:
        if subresource == "status":
            # Only status changes through /status; spec and metadata stay as stored.
            new = _copy(old)
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
            if resource is RESOURCE_CLAIMS:
                if not self.device_status:
                    drop_disabled_device_status(new, old)
                drop_deallocated(new, old)
            return new  # type: ignore[no-any-return]
        new = obj
        if resource.has_status:
            # The main resource cannot change status when a /status subresource exists.
            if "status" in old:
                new["status"] = _copy(old["status"])
            else:
                new.pop("status", None)
        meta, old_meta = new["metadata"], old["metadata"]
        for server_field in _SERVER_META:
            if server_field in old_meta:
                meta[server_field] = old_meta[server_field]
            else:
                meta.pop(server_field, None)
        if resource.has_generation and new.get("spec") != old.get("spec"):
            meta["generation"] = int(old_meta.get("generation", 0)) + 1
        return new

    def _commit_update(
        self, resource: ResourceType, old: Obj, new: Obj, *, spec_rules: bool = True
    ) -> Obj:
        self._validate(resource, new, old, spec_rules=spec_rules)
        if new == old:
            return _copy(old)  # type: ignore[no-any-return]  # a no-op write keeps the version
        meta = new["metadata"]
        key = self._key(resource, meta.get("namespace"), meta["name"])
        meta["resourceVersion"] = self._next_rv()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            # The last finalizer is gone: the pending delete completes now.
            del self._table(resource)[key]
            self._applied.pop(meta.get("uid", ""), None)
            self._record("DELETED", resource, new, old)
            return _copy(new)  # type: ignore[no-any-return]
        self._table(resource)[key] = new
        self._record("MODIFIED", resource, new, old)
        return _copy(new)  # type: ignore[no-any-return]

    def bind(self, namespace: str | None, name: str, body: Any) -> Obj:
        """``POST pods/<name>/binding``: assign an unassigned pod to a node, as the
        scheduler does; answers a success Status (the real BindingREST's checks)."""
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request was in an unknown format")
        raw_meta, raw_target = body.get("metadata"), body.get("target")
        meta: Obj = raw_meta if isinstance(raw_meta, dict) else {}
        if meta.get("name", name) != name:
            raise errors.bad_request("name in URL does not match name in Binding object")
        target: Obj = raw_target if isinstance(raw_target, dict) else {}
        problems: list[FieldError] = []
        kind = target.get("kind", "")
        if kind not in ("", "Node"):
            problems.append(
                FieldError(
                    "FieldValueNotSupported",
                    "target.kind",
                    f'Unsupported value: "{kind}": supported values: "Node", "<empty>"',
                )
            )
        if not target.get("name"):
            problems.append(FieldError("FieldValueRequired", "target.name", "Required value"))
        if problems:
            raise errors.invalid("Binding", "", name, problems)
        old = self._existing(PODS, namespace, name)
        old_meta = old["metadata"]
        wanted_uid = meta.get("uid")
        if wanted_uid and wanted_uid != old_meta["uid"]:
            raise errors.conflict(
                "pods",
                "",
                name,
                f"Precondition failed: UID in precondition: {wanted_uid}, UID in object meta: "
                f"{old_meta['uid']}",
            )
        node = (old.get("spec") or {}).get("nodeName")
        if old_meta.get("deletionTimestamp"):
            raise errors.conflict(
                "pods/binding",
                "",
                name,
                f"pod {name} is being deleted, cannot be assigned to a host",
            )
        if node:
            raise errors.conflict(
                "pods/binding", "", name, f'pod {name} is already assigned to node "{node}"'
            )
        new = _copy(old)
        new.setdefault("spec", {})["nodeName"] = target["name"]
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and annotations:
            new["metadata"]["annotations"] = {
                **(new["metadata"].get("annotations") or {}),
                **annotations,
            }
        status = new.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": _format_time(self.clock()),
            }
        )
        status["conditions"] = conditions
        self._commit_update(PODS, old, new, spec_rules=False)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }

    def patch(
        self,
        resource: ResourceType,
        namespace: str | None,
        name: str,
        patch_type: str,
        patch: Any,
        *,
        subresource: str | None = None,
        field_validation: str = "",
    ) -> Obj:
        """A JSON, merge or strategic merge patch. ``field_validation="Strict"`` refuses a
        result with unknown fields as the real jsonPatcher and smpPatcher do (apiserver
        pkg/endpoints/handlers/patch.go): 422 with the patched document (JSON and merge
        patches) or the patch (strategic, printed as Go's %+v) as the bad value."""
        old = self._existing(resource, namespace, name)
        base = _copy(old)
        if patch_type == MERGE_PATCH:
            if not isinstance(patch, dict):
                raise errors.bad_request("the body of the request was in an unknown format")
            patched = merge_patch(base, patch)
        elif patch_type == STRATEGIC_MERGE_PATCH:
            patched = strategic_merge_patch(base, patch)
        elif patch_type == JSON_PATCH:
            patched = json_patch(base, patch)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - "
                f"accepted media types include: {JSON_PATCH}, {MERGE_PATCH}, "
                f"{STRATEGIC_MERGE_PATCH}, {APPLY_PATCH}",
            )
        if field_validation == "Strict":
            unknown = openapi.unknown_fields(resource, patched)
            if unknown:
                shown = (
                    errors.go_format(patch)
                    if patch_type == STRATEGIC_MERGE_PATCH
                    else json.dumps(patched, separators=(",", ":"), ensure_ascii=False)
                )
                raise errors.invalid_patch(shown, openapi.strict_decoding_error(unknown))
        return self.update(resource, namespace, name, patched, subresource=subresource)

    def apply(
        self,
        resource: ResourceType,
        namespace: str | None,
        name: str,
        config: Obj,
        *,
        manager: str,
        subresource: str | None = None,
    ) -> tuple[Obj, int]:
        """Server-side apply (``apply.py``): creates the object when missing (201), else
        merges ``config`` into it (200)."""
        config = applied_configuration(resource, config)
        raw_meta = config.get("metadata")
        meta: Obj = raw_meta if isinstance(raw_meta, dict) else {}
        if meta.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL "
                f"({name})"
            )
        table = self._table(resource)
        old = table.get(self._key(resource, namespace, name))
        if old is None:
            if subresource is not None:
                raise errors.not_found(resource.plural, resource.group, name)
            if meta.get("uid"):
                # patch.go's applyPatch: a UID with nothing stored under the name.
                raise errors.conflict(
                    resource.plural,
                    resource.group,
                    name,
                    f"uid mismatch: the provided object specified uid {meta['uid']}, and no "
                    "existing object was found",
                )
            created = self.create(
                resource, namespace, {**config, "metadata": {**meta, "name": name}}
            )
            self._applied[created["metadata"]["uid"]] = {manager: _copy(config)}
            return created, 201
        uid = old["metadata"]["uid"]
        if meta.get("uid") and meta["uid"] != uid:
            # An apply is no UID precondition (patch.go gives the store none), but
            # rest.BeforeUpdate validates the merged metadata against the stored object's:
            # another UID is an immutable field changed, 422, on the main resource and on
            # /status alike (ResetObjectMetaForStatus leaves the UID as sent).
            problem = _invalid("metadata.uid", str(meta["uid"]), FIELD_IMMUTABLE)
            raise errors.invalid(resource.kind, resource.group, name, [problem])
        previous = self._applied.get(uid, {}).get(manager)
        merged = self._body(resource, merge_applied(_copy(old), config, previous))
        self._check_namespace(resource, namespace, merged["metadata"])
        new = self._merge_for_update(resource, old, merged, subresource)
        result = self._commit_update(resource, old, new, spec_rules=subresource is None)
        if self._key(resource, namespace, name) in table:  # not a finished deletion
            self._applied.setdefault(uid, {})[manager] = _copy(config)
        return result, 200

    def delete(
        self,
        resource: ResourceType,
        namespace: str | None,
        name: str,
        options: Obj | None = None,
    ) -> tuple[Obj, int]:
        """(response body, HTTP code): 200 when gone now, 202 when finalizers or a grace
        period keep the object for a while."""
        old = self._existing(resource, namespace, name)
        options = options or {}
        self._check_preconditions(resource, old, options.get("preconditions") or {})
        meta = old["metadata"]
        grace = self._grace_period(resource, old, options)
        if meta.get("finalizers") or grace:
            if meta.get("deletionTimestamp") and not grace:
                return _copy(old), 202
            new = _copy(old)
            new["metadata"]["deletionTimestamp"] = _format_time(
                self.clock() + timedelta(seconds=grace)
            )
            new["metadata"]["deletionGracePeriodSeconds"] = grace
            new["metadata"]["resourceVersion"] = self._next_rv()
            key = self._key(resource, namespace, name)
            self._table(resource)[key] = new
            self._record("MODIFIED", resource, new, old)
            return _copy(new), 202
        gone = self._remove(resource, old)
        if resource.returns_deleted_object:
            return gone, 200
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": name,
                **({"group": resource.group} if resource.group else {}),
                "kind": resource.plural,
                "uid": meta["uid"],
            },
        }, 200

    def _remove(self, resource: ResourceType, old: Obj) -> Obj:
        gone = _copy(old)
        gone["metadata"]["resourceVersion"] = self._next_rv()
        key = self._key(resource, old["metadata"].get("namespace"), old["metadata"]["name"])
        del self._table(resource)[key]
        self._applied.pop(old["metadata"].get("uid", ""), None)
        self._record("DELETED", resource, gone, old)
        return gone  # type: ignore[no-any-return]

    def _grace_period(self, resource: ResourceType, old: Obj, options: Obj) -> int:
        if resource is not PODS or not self.graceful_pod_deletion:
            return 0
        if not (old.get("spec") or {}).get("nodeName"):
            return 0  # never scheduled: nothing to stop, removed at once
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = (old.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        return max(int(grace), 0)

    def _check_preconditions(self, resource: ResourceType, old: Obj, pre: Obj) -> None:
        meta = old["metadata"]
        for label, key in (("UID", "uid"), ("ResourceVersion", "resourceVersion")):
            wanted = pre.get(key)
            if wanted and wanted != meta.get(key):
                raise errors.conflict(
                    resource.plural,
                    resource.group,
                    meta["name"],
                    f"Precondition failed: {label} in precondition: {wanted}, {label} in "
                    f"object meta: {meta.get(key)}",
                )

    def delete_collection(
        self,
        resource: ResourceType,
        namespace: str | None,
        labels: LabelSelector | None = None,
        fields: FieldSelector | None = None,
    ) -> Obj:
        listed = self.list(resource, namespace, labels, fields)
        deleted = []
        for item in listed["items"]:
            body, _ = self.delete(
                resource, item["metadata"].get("namespace"), item["metadata"]["name"]
            )
            deleted.append(item if body.get("kind") == "Status" else body)
        return {
            "kind": resource.list_kind,
            "apiVersion": resource.api_version,
            "metadata": {"resourceVersion": str(self.rv)},
            "items": deleted,
        }

    def objects(self, resource: ResourceType) -> Iterator[Obj]:
        """Stored objects of one resource, read-only (for in-process inspection)."""
        for key in sorted(self._table(resource)):
            yield self._table(resource)[key]


def _list_item(obj: Obj) -> Obj:
    # The real server leaves kind/apiVersion out of list items.
    obj.pop("kind", None)
    obj.pop("apiVersion", None)
    return obj


def _encode_continue(rv: int, key: Key) -> str:
    raw = json.dumps({"rv": rv, "ns": key[0], "name": key[1]}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_continue(token: str) -> tuple[int, Key]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), (str(data["ns"]), str(data["name"]))
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise errors.bad_request(f"continue key is not valid: {token}") from None
