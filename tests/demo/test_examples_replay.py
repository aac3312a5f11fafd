"""Every workload in docs/examples replays in `dracpu demo`, with the command its header
gives: every claim is allocated, every container runs on its claim's CPUs."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dracpu.cpuset import CPUSet

REPO = Path(__file__).parents[2]
EXAMPLES = sorted((REPO / "docs" / "examples").glob("*.yaml"))


def _demo_command(example: Path) -> list[str]:
    """The `dracpu demo ...` line of the example's header comment."""
    for line in example.read_text().splitlines():
        if not line.startswith("#"):
            break
        command = line.lstrip("# ")
        if command.startswith("dracpu demo "):
            return shlex.split(command)[2:]
    raise AssertionError(f"{example.name}: the header names no `dracpu demo` command")


def test_there_are_examples() -> None:
    assert {"full-cores-claim.yaml", "grouped-claim.yaml", "individual-claim.yaml"} <= {
        e.name for e in EXAMPLES
    }


@pytest.mark.parametrize(
    "cgroup",
    [("--cgroup-version", "1", "--cgroup-driver", "cgroupfs"), ()],
    ids=["v1-cgroupfs", "default-v2-systemd"],
)
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_replays_in_the_demo(example: Path, cgroup: tuple[str, ...]) -> None:
    args = _demo_command(example)
    assert args[args.index("--scenario") + 1] == f"docs/examples/{example.name}"
    proc = subprocess.run(
        [sys.executable, "-m", "dracpu", "demo", *args, *cgroup, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = json.loads(proc.stdout)
    assert doc["claims"], "the example has claims"
    for key, claim in doc["claims"].items():
        assert claim["error"] is None, key
        assert claim["cpus"], key
    by_pod: dict[str, CPUSet] = {}
    for claim in doc["claims"].values():
        if "pod" in claim:
            by_pod[claim["pod"]] = CPUSet.parse(claim["cpus"])
    for ctr, cpus in doc["containers"].items():
        pod = ctr.rsplit("/", 1)[0]
        if pod in by_pod:
            # Exactly the claim's CPUs, or more with sharedPoolAccess.
            assert by_pod[pod] <= CPUSet.parse(cpus), ctr
    # Claims made by hand and claims generated from templates are both reported.
    if example.name == "individual-claim.yaml":
        generated = [k for k, c in doc["claims"].items() if c.get("template")]
        assert len(generated) == 2
        assert all(k.startswith("default/pinned-workers-") for k in generated)
        assert {c["pod"] for c in doc["claims"].values()} == {
            "default/pinned-workers-0",
            "default/pinned-workers-1",
        }
