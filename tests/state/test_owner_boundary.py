"""Issue 25's acceptance for the owner, read from the source: outside ``dracpu/state/``
nothing calls the steps of the owner's transactions (``begin_*``, ``finish_*``, ``abort_*``,
``bind``) or reads its stores (``store``, ``tracker``, ``containers``, ``sandboxes``);
``writer_running`` has one writer; hotplug does not call the daemon; every unbounded
channel of the daemon's package says why it may be unbounded."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import dracpu
from dracpu.state import NodeState

PACKAGE = Path(dracpu.__file__).parent
STATE = PACKAGE / "state"

# The owner's step methods, from the class itself (a step added later is covered too).
STEPS = sorted(
    name
    for name in vars(NodeState)
    if name.startswith(("begin_", "finish_", "abort_")) or name == "bind"
)
STORES = ("store", "tracker", "containers", "sandboxes")


def outside_state() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if STATE not in p.parents]


def test_the_owner_has_the_steps_this_test_looks_for() -> None:
    # Guards the test itself: an empty list would make the next one pass vacuously.
    assert {"begin_prepare", "finish_prepare", "abort_unprepare", "bind"} <= set(STEPS)
    assert len(outside_state()) > 50


def test_no_step_of_a_transaction_is_called_outside_state() -> None:
    calls = re.compile(r"\.({})\(".format("|".join(STEPS)))
    found = []
    for path in outside_state():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in STEPS
                # A socket's bind is not the owner's.
                and not (node.func.attr == "bind" and _is_socket(node.func.value))
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.func.attr}(")
    assert found == [], f"steps of the owner's transactions called outside state/: {found}"
    assert calls.search("state.begin_prepare(plan)")  # the pattern the listing names


def _is_socket(value: ast.expr) -> bool:
    name = value.id if isinstance(value, ast.Name) else getattr(value, "attr", "")
    return "sock" in name


def test_no_store_of_the_owner_is_read_outside_state() -> None:
    # Any attribute chain ending in ``state.<store>`` (self.state.store, self._state.
    # containers, daemon.state.tracker, ...).
    reads = re.compile(r"\b_?state\.({})\b".format("|".join(STORES)))
    found = [
        f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for path in outside_state()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if reads.search(line)
    ]
    assert found == [], f"the owner's stores read outside state/: {found}"


def test_writer_running_is_written_by_the_owner_only() -> None:
    writes = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"writer_running\s*=[^=]", line)
    ]
    assert writes, "the owner keeps the flag"
    assert all(w.startswith("state/owner.py:") for w in writes), writes


def test_hotplug_does_not_import_or_call_the_daemon() -> None:
    tree = ast.parse((PACKAGE / "daemon" / "hotplug.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    called = {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert "dracpu.daemon.app" not in imported and "dracpu.daemon" not in imported
    assert "apply_topology" not in called and "send" in called


def test_every_unbounded_channel_says_why() -> None:
    """An ``open_memory_channel(math.inf)`` needs a comment or docstring line saying why
    within the few lines before it (or in the docstring of the function holding it)."""
    silent = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines):
            if "open_memory_channel" in line and "math.inf" in line:
                before = "\n".join(lines[max(0, n - 12) : n]).lower()
                if "unbounded" not in before:
                    silent.append(f"{path.relative_to(PACKAGE)}:{n + 1}")
    assert silent == [], f"unbounded channels without a reason: {silent}"
