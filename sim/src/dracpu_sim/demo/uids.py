"""Pods and claims by name in the demo's messages, not by UID.

The daemon, the runtime and the kubelet speak of pods and claims by UID (``claimUID "…"
already bound to pod "…"``): exact, and what the protocols carry, but a UID means nothing
to someone reading the demo's report. ``UIDNames`` remembers every pod's and claim's UID
as the demo sees them (a deleted pod's too) and rewrites a message so that each one is
``pod <namespace>/<name>`` or ``claim <namespace>/<name>``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["UIDNames"]

# A UID with the word that introduces it, if any, and its quotes: all of it is replaced.
_LEAD = r"(?:\b(?:pod|podUID|podUid|claim|claimUID|claimUid|uid|UID)\s+)?"


class UIDNames:
    def __init__(self) -> None:
        self._names: dict[str, str] = {}  # uid -> "pod ns/name" or "claim ns/name"
        self._pattern: re.Pattern[str] | None = None

    def learn(self, kind: str, objects: Iterable[Mapping[str, Any]]) -> UIDNames:
        """Remember the UIDs of ``objects`` (API objects) as ``<kind> <ns>/<name>``."""
        for obj in objects:
            meta = obj.get("metadata") or {}
            uid, name = meta.get("uid"), meta.get("name")
            if uid and name and uid not in self._names:
                self._names[str(uid)] = f"{kind} {meta.get('namespace', 'default')}/{name}"
                self._pattern = None
        return self

    def refresh(self, node: Any) -> UIDNames:
        """Learn the pods and claims the simulated node's API server holds now."""
        self.learn("pod", node.api.list("pods"))
        return self.learn("claim", node.api.list("resourceclaims"))

    def name(self, text: str) -> str:
        """``text`` with each known UID (and the word and quotes around it) replaced by
        ``pod ns/name`` or ``claim ns/name``."""
        if not self._names:
            return text
        if self._pattern is None:
            uids = "|".join(re.escape(u) for u in sorted(self._names, key=len, reverse=True))
            self._pattern = re.compile(rf"{_LEAD}([\"']?)({uids})\1")
        return self._pattern.sub(lambda m: self._names[m.group(2)], text)
