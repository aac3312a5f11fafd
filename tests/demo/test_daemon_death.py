"""A daemon that exits under the demo is one line: how it ended, its last log line, and
where its log is kept."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dracpu_sim.demo.runner import _daemon_death
from dracpu_sim.node import DaemonProcess


def _daemon(tmp_path: Path, returncode: int) -> DaemonProcess:
    log = tmp_path / "dracpu.log"
    log.write_text("I1203 started\nE1203 boom: the checkpoint is unreadable\n\n")
    process: Any = SimpleNamespace(pid=4242, returncode=returncode)
    return DaemonProcess(process, 1, 2, str(log))


def test_killed_daemon_keeps_its_log_outside_the_work_directory(tmp_path: Path) -> None:
    line = _daemon_death(_daemon(tmp_path, -9), keep_log=False)
    head, kept = line.rsplit("; its log: ", 1)
    assert head == (
        "dracpu run (pid 4242) was killed by SIGKILL while the demo was running; its last log "
        "line: E1203 boom: the checkpoint is unreadable"
    )
    try:
        assert kept.startswith("/tmp/dracpu-demo-daemon-")
        assert Path(kept).read_text().startswith("I1203 started")
    finally:
        Path(kept).unlink()


def test_exit_code_and_a_kept_work_directory(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path, 3)
    line = _daemon_death(daemon, keep_log=True, when="before it was ready")
    assert line.startswith("dracpu run (pid 4242) exited with code 3 before it was ready; ")
    assert line.endswith(f"; its log: {daemon.log_path}")
    assert "\n" not in line
