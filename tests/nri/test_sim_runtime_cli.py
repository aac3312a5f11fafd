"""``python -m dracpu_sim.runtime``: the simulator on its own, as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest


def test_help_has_an_example() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dracpu_sim.runtime", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--cgroup-root" in out
    assert "example:" in out
    assert "--cgroup-version 2 --cgroup-driver systemd" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cgroup-version", "3"], "argument --cgroup-version: must be 1 or 2, got '3'"),
        (["--cgroup-driver", "sd"], "argument --cgroup-driver: invalid choice: 'sd'"),
    ],
)
def test_bad_cgroup_flags_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dracpu",
            "sim",
            "runtime",
            "--socket",
            "s",
            "--cgroup-root",
            str(tmp_path),
            *args,
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"dracpu sim runtime: {message}")


@pytest.mark.parametrize(
    ("flags", "root_file", "content"),
    [
        ([], "cpuset/cpuset.cpus", "0-3\n"),
        (["--cgroup-version", "2", "--cgroup-driver", "systemd"], "cpuset.cpus.effective", "0-3\n"),
    ],
)
def test_listens_and_stops_on_sigint(
    short_tmp: str, tmp_path: Path, flags: list[str], root_file: str, content: str
) -> None:
    socket_path = os.path.join(short_tmp, "nri.sock")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dracpu_sim.runtime",
            "--socket",
            socket_path,
            "--cgroup-root",
            str(tmp_path / "cg"),
            "--cpus",
            "0-3",
            *flags,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == f"NRI runtime simulator listening on {socket_path}\n"
        assert os.path.exists(socket_path)
        assert (tmp_path / "cg" / root_file).read_text() == content
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert not os.path.exists(socket_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
