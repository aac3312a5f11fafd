"""`dracpu gatherinfo` finds the running daemon, never itself or another dracpu command,
names the PID it read, and says plainly when no daemon runs (issue 26)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from dracpu.cli import main
from dracpu.gatherinfo import driver_processes, find_driver_process, runs_daemon

FIXTURES = Path(__file__).parent.parent / "fake_sysfs"
REPO = Path(__file__).resolve().parents[2]


def _process(proc: Path, pid: int, comm: str, argv: list[str]) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "comm").write_text(comm + "\n")
    (proc / str(pid) / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))


GATHERINFO = ["/usr/bin/python3.12", "/usr/local/bin/dracpu", "gatherinfo", "--stdout"]
DAEMON = ["/usr/bin/python3.12", "/usr/local/bin/dracpu", "run", "--v=4", "--reserved-cpus=0-1"]


@pytest.mark.parametrize(
    ("argv", "daemon"),
    [
        (["/dracpu", "--reserved-cpus=0-1"], True),  # the Go driver's image
        (["/dracpu"], True),
        (["dracpu", "run"], True),
        (DAEMON, True),
        (["python3", "-m", "dracpu", "--config", "/etc/dracpu/config.yaml", "--v=4"], True),
        (["dracpu", "--config", "/etc/c.yaml", "run"], True),  # not a subcommand: --config's value
        (["dracpu", "--unknown", "x", "--v=4"], True),
        (["dracpu", "--", "run"], True),
        (["dracpu", "--"], True),
        (GATHERINFO, False),
        (["dracpu", "demo", "--output", "json"], False),
        (["dracpu", "--config", "c.yaml", "introspect", "slices"], False),
        (["dracpu", "--", "map"], False),
        (["python3", "-m", "dracpu_sim.chaos"], False),
        (["/usr/bin/other"], False),
        ([], False),
    ],
)
def test_which_command_lines_are_the_daemon(argv: list[str], daemon: bool) -> None:
    assert runs_daemon(argv) is daemon


def test_never_itself_nor_another_command_and_lowest_pid_first(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _process(proc, 1, "init", ["/sbin/init"])
    _process(proc, 100, "dracpu", GATHERINFO)  # this process, as the procfs numbers it
    (proc / "self").symlink_to("100")
    _process(proc, 7, "dracpu", ["dracpu", "demo"])
    _process(proc, 23, "dracpu", DAEMON)
    _process(proc, 9, "dracpu", DAEMON)  # sorted by number: 9 before 23 (by name, 23 < 9)
    _process(proc, 50, "python3", ["python3", "-m", "dracpu", "run"])  # comm is not dracpu
    assert [p.pid for p in driver_processes(proc)] == [9, 23]
    found = find_driver_process(proc)
    assert found is not None and found.pid == 9


def test_itself_is_skipped_even_when_its_command_line_looks_like_the_daemon(
    tmp_path: Path,
) -> None:
    proc = tmp_path / "proc"
    _process(proc, 4242, "dracpu", DAEMON)
    (proc / "self").symlink_to("4242")
    assert find_driver_process(proc) is None


def test_no_daemon_is_none(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _process(proc, 1, "init", ["/sbin/init"])
    _process(proc, 100, "dracpu", GATHERINFO)
    assert find_driver_process(proc) is None


def test_the_report_names_the_pid_and_the_other_daemons(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = tmp_path / "proc"
    _process(proc, 300, "dracpu", GATHERINFO)
    (proc / "self").symlink_to("300")
    _process(proc, 12, "dracpu", DAEMON)
    _process(proc, 140, "dracpu", ["dracpu", "--reserved-cpus=0-3"])
    monkeypatch.setenv("HOST_ROOT", str(tmp_path))
    code = main(["gatherinfo", "--stdout", "--sysfs-root", str(FIXTURES / "epyc-nps4")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == (
        f"dracpu gatherinfo: read the running driver's config from PID 12 under {proc} "
        "(more daemons run: PIDs 140)\n"
    )
    report = yaml.safe_load(out)
    assert report["driverConfigSource"] == "PID 12"
    assert report["driverConfig"]["reservedCPUs"] == "0-1"  # PID 12's, not 140's


def test_on_this_machine_it_never_reads_itself() -> None:
    # The real /proc: this gatherinfo is a process called dracpu too. Another daemon may be
    # running here (another test's); whichever PID it names is not its own and is a daemon.
    env = {k: v for k, v in os.environ.items() if k != "HOST_ROOT"}
    child = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "dracpu"), "gatherinfo", "--stdout", "--sysfs-root",
         str(FIXTURES / "epyc-nps4")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    source = yaml.safe_load(out)["driverConfigSource"]
    if source.startswith("defaults: "):
        assert "dracpu gatherinfo: no dracpu daemon is running" in err
        return
    pid = int(source.removeprefix("PID "))
    assert pid != child.pid
    assert f"from PID {pid} under /proc" in err
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return  # it ended meanwhile
    assert runs_daemon([w.decode() for w in cmdline if w])


def test_gatherinfo_help_says_where_the_config_comes_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["gatherinfo", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "its PID is printed on stderr" in out
    assert "With no daemon running, the report says so" in out
