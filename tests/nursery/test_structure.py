"""Issue 25 acceptance, read from the source: every task of the daemon lives in a nursery.
No module of the daemon's package starts a Trio system task (a task no nursery waits for,
which a stop could only abandon)."""

from __future__ import annotations

import ast
from pathlib import Path

import dracpu

PACKAGE = Path(dracpu.__file__).parent


def system_task_calls(source: str) -> list[int]:
    """Lines that call ``spawn_system_task`` (by any import path)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "spawn_system_task":
                lines.append(node.lineno)
    return lines


def test_the_finder_sees_the_call_in_every_spelling() -> None:
    assert system_task_calls("import trio\ntrio.lowlevel.spawn_system_task(f)\n") == [2]
    assert system_task_calls("from trio.lowlevel import spawn_system_task as s\ns(f)\n") == []
    assert system_task_calls(
        "from trio.lowlevel import spawn_system_task\nspawn_system_task(f)"
    ) == [2]
    assert system_task_calls("# spawn_system_task(f) in a comment\n") == []


def test_no_system_task_in_the_daemons_package() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        lines = system_task_calls(source)
        if "spawn_system_task as " in source:
            # An alias would hide the call from the finder: refuse it too.
            lines = [*lines, 0]
        if lines:
            found[str(path.relative_to(PACKAGE))] = lines
    assert found == {}
