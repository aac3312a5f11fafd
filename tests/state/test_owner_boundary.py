"""Issue 25's acceptance for the owner, read from the source: outside ``dracpu/state/``
(the daemon's other modules, the simulator, bench/ and tests/) nothing calls the steps of
the owner's transactions (``begin_*``, ``finish_*``, ``abort_*``, ``bind``) or reads its
stores (``store``, ``tracker``, ``containers``, ``sandboxes``), which are private now;
``writer_running`` has one writer; hotplug does not call the daemon; every unbounded
channel of the daemon's package says why it may be unbounded."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import dracpu
from dracpu.allocation.store import AllocationStore
from dracpu.cpuset import CPUSet
from dracpu.state import NodeState

PACKAGE = Path(dracpu.__file__).parent
STATE = PACKAGE / "state"
TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
BENCH = ROOT / "bench"
SIMULATOR = ROOT / "sim" / "src"
# tests/state/ holds the owner's own unit tests: they may drive one private step at a time
# (a pending claim between begin and finish), but they read the state through the view too.
STATE_TESTS = TESTS / "state"

# The owner's step methods, from the class itself (a step added later is covered too),
# under their private names and the public ones they had.
PRIVATE_STEPS = sorted(
    name for name in vars(NodeState) if name.startswith(("_begin_", "_finish_", "_abort_"))
)
STEPS = sorted({*PRIVATE_STEPS, *(name.removeprefix("_") for name in PRIVATE_STEPS)})
STORES = ("store", "tracker", "containers", "sandboxes")


def outside_state() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if STATE not in p.parents]


def sources_outside_the_owner(*, with_state_tests: bool) -> list[Path]:
    """The daemon's package outside state/, the simulator, bench/ and tests/ (this file
    names the steps itself; tests/state/ only when asked)."""
    here = Path(__file__).resolve()
    tests = [
        p
        for p in sorted(TESTS.rglob("*.py"))
        if p != here and (with_state_tests or STATE_TESTS not in p.parents)
    ]
    return [
        *outside_state(),
        *sorted(SIMULATOR.rglob("*.py")),
        *sorted(BENCH.rglob("*.py")),
        *tests,
    ]


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT if ROOT in path.parents else PACKAGE))


def test_the_owner_has_the_steps_this_test_looks_for() -> None:
    # Guards the test itself: an empty list would make the next ones pass vacuously.
    assert {"_begin_prepare", "_finish_prepare", "_abort_unprepare"} <= set(PRIVATE_STEPS)
    assert {"begin_prepare", "_begin_prepare", "finish_unprepare"} <= set(STEPS)
    assert len(outside_state()) > 50
    scanned = sources_outside_the_owner(with_state_tests=False)
    assert BENCH / "owner.py" in scanned and TESTS / "nri" / "test_plugin.py" in scanned
    assert BENCH / "nri.py" in scanned and TESTS / "daemon" / "test_state_files.py" in scanned


def test_the_steps_and_stores_are_private() -> None:
    """The steps have no public name left, ``bind`` is gone (``admit`` binds), and a
    state's public attributes hold no store."""
    public = {name for name in vars(NodeState) if not name.startswith("_")}
    assert not {n for n in public if n.startswith(("begin_", "finish_", "abort_"))}
    assert not {"bind", "_bind", "unbind", "_unbind"} & set(vars(NodeState))
    state = NodeState(AllocationStore(CPUSet.parse("0-3"), CPUSet()))
    attributes = set(vars(state))
    assert not set(STORES) & attributes
    assert {f"_{name}" for name in STORES} <= attributes  # the names this test scans for


def test_no_step_of_a_transaction_is_called_outside_state() -> None:
    calls = re.compile(r"\.({})\(".format("|".join(STEPS)))
    found = []
    for path in sources_outside_the_owner(with_state_tests=False):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in STEPS
            ):
                found.append(f"{_where(path)}:{node.lineno} .{node.func.attr}(")
    assert found == [], f"steps of the owner's transactions called outside state/: {found}"
    assert calls.search("state.begin_prepare(plan)")  # the patterns the listing names
    assert calls.search("state._finish_unprepare(uid)")


def test_no_store_of_the_owner_is_read_outside_state() -> None:
    # Any attribute chain ending in ``state.<store>`` or ``state._<store>``
    # (self.state.store, self._state._containers, daemon.state.tracker, ...).
    reads = re.compile(r"\b_?state\._?({})\b".format("|".join(STORES)))
    found = [
        f"{_where(path)}:{n}: {line.strip()}"
        for path in sources_outside_the_owner(with_state_tests=True)
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if reads.search(line)
    ]
    assert found == [], f"the owner's stores read outside state/: {found}"
    assert reads.search("plugin._state._store.reserve(r)") and reads.search("node.state.tracker")


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
