"""The reference tables of docs/, generated from the code that defines them.

Each table sits in a page between two markers:

    <!-- generated: flags -->
    ...
    <!-- end generated -->

`python tests/docs/gen_reference.py --write` rewrites them in place; without `--write` it
exits 1 and names every table that differs (tests/docs runs the same comparison). The code
is the source of truth: root flags from `dracpu.flags.ROOT_FLAGS`, config fields from
`dracpu.config.DriverConfig` (and, for whether a field may be set in the file, what
`load_config` actually does with it), commands from `dracpu.flags.COMMANDS`, metrics from
`dracpu.metrics`.
"""

from __future__ import annotations

import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import msgspec

from dracpu.config import UPSTREAM_KEYS, ConfigError, DriverConfig, load_config
from dracpu.flags import COMMANDS, COMPATIBILITY_PATHS, ROOT_FLAGS, FlagSpec
from dracpu.irq.metrics import IRQ_METRIC_DEFINITIONS
from dracpu.metrics import (
    CONVERGENCE_BUCKETS,
    CPU_COUNT_BUCKETS,
    DRACPU_METRIC_DEFINITIONS,
    DURATION_BUCKETS,
    METRIC_DEFINITIONS,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"
_SECTION = re.compile(
    r"(<!-- generated: (?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S
)


def _cell(text: str) -> str:
    # `<root>` in a help text would otherwise be read as an HTML tag.
    return text.replace("|", "\\|").replace("<", "&lt;").replace("\n", " ")


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return '`""`'
    return f"`{value}`"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
        *("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows),
    ]
    return "\n".join(lines) + "\n"


def _flag_type(spec: FlagSpec) -> str:
    if spec.kind == "enum":
        return " or ".join(f"`{c}`" for c in spec.choices)
    return spec.kind


def flags_table() -> str:
    rows = []
    for spec in sorted(ROOT_FLAGS, key=lambda s: s.name):
        rows.append(
            (
                f"`--{spec.name}`",
                _flag_type(spec),
                _literal(spec.default),
                f"`{spec.config_key}`" if spec.config_key else "—",
                spec.help_text,
            )
        )
    return _table(("flag", "type", "default", "config field", "meaning"), rows)


def file_settable(key: str) -> bool:
    """Whether `load_config` accepts `key` in a config file (it refuses host paths and
    listen addresses there). Asked of the loader, not of a list kept beside it."""
    value = msgspec.structs.asdict(DriverConfig())[key]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(msgspec.json.encode({key: value}).decode())
        try:
            load_config(str(path), {})
        except ConfigError as err:
            if "is not configurable via the config file" in str(err):
                return False
            raise
    return True


def config_table() -> str:
    flags_by_key = {s.config_key: s for s in ROOT_FLAGS if s.config_key}
    rows = []
    for key, default in msgspec.structs.asdict(DriverConfig()).items():
        spec = flags_by_key.get(key)
        kind = "bool" if isinstance(default, bool) else "string"
        if spec is not None and spec.kind == "enum":
            kind = _flag_type(spec)
        rows.append(
            (
                f"`{key}`",
                kind,
                _literal(default),
                "yes" if file_settable(key) else "**no** (flag only)",
                f"`--{spec.name}`" if spec else "—",
                "upstream" if key in UPSTREAM_KEYS else "dracpu",
            )
        )
    return _table(("field", "type", "default", "in the file", "flag", "origin"), rows)


def commands_table() -> str:
    rows = [(f"`{synopsis}`", what) for synopsis, what in (*COMMANDS, *COMPATIBILITY_PATHS)]
    return _table(("command", "what it does"), rows)


def _buckets(name: str) -> str:
    if name == "dra_cpu_prepare_claim_duration_seconds":
        return ", ".join(str(b) for b in DURATION_BUCKETS)
    if name == "dra_cpu_claim_allocated_cpus":
        return ", ".join(str(b) for b in CPU_COUNT_BUCKETS)
    if name == "dracpu_pool_convergence_seconds":
        return ", ".join(str(b) for b in CONVERGENCE_BUCKETS)
    return ""


def metrics_table() -> str:
    rows = []
    for origin, definitions in (
        ("contract", METRIC_DEFINITIONS),
        ("dracpu", DRACPU_METRIC_DEFINITIONS),
        ("dracpu", IRQ_METRIC_DEFINITIONS),
    ):
        for d in definitions:
            labels = ", ".join(f"`{label}`" for label in d.labels) or "—"
            if _buckets(d.name):
                labels += f"; buckets {_buckets(d.name)}"
            rows.append((f"`{d.name}`", d.type, labels, d.help, origin))
    return _table(("metric", "type", "labels", "help", "origin"), rows)


GENERATORS: dict[str, Callable[[], str]] = {
    "flags": flags_table,
    "config": config_table,
    "commands": commands_table,
    "metrics": metrics_table,
}


def sections(text: str) -> list[tuple[str, str]]:
    """(name, body) of every generated section in a page."""
    return [(m.group("name"), m.group("body")) for m in _SECTION.finditer(text)]


def regenerate(text: str) -> str:
    """The page with every generated section rewritten from the code."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in GENERATORS:
            raise KeyError(f"unknown generated section {name!r}")
        return match.group(1) + GENERATORS[name]() + match.group(4)

    return _SECTION.sub(replace, text)


def main(argv: list[str]) -> int:
    write = argv == ["--write"]
    if argv and not write:
        print("usage: gen_reference.py [--write]", file=sys.stderr)
        return 2
    stale = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        fresh = regenerate(text)
        if fresh != text:
            stale.append(page)
            if write:
                page.write_text(fresh)
    for page in stale:
        print(f"{'rewrote' if write else 'stale'}: {page.relative_to(DOCS.parent)}")
    return 0 if write or not stale else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
