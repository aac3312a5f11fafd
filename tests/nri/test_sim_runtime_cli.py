"""``python -m dracpu.sim.runtime``: the simulator on its own, as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def test_help_has_an_example() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dracpu.sim.runtime", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--cgroup-root" in out
    assert "example:" in out


def test_listens_and_stops_on_sigint(short_tmp: str, tmp_path: Path) -> None:
    socket_path = os.path.join(short_tmp, "nri.sock")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dracpu.sim.runtime",
            "--socket",
            socket_path,
            "--cgroup-root",
            str(tmp_path / "cg"),
            "--cpus",
            "0-3",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == f"NRI runtime simulator listening on {socket_path}\n"
        assert os.path.exists(socket_path)
        assert (tmp_path / "cg" / "cpuset" / "cpuset.cpus").read_text() == "0-3\n"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert not os.path.exists(socket_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
