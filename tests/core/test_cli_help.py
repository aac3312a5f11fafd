"""Help on stdout with exit 0 for every command, `--version` as `version`, every command
listed wherever commands are listed, and a closed stdout ending quietly (issue 26)."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest

import dracpu.cli as cli
from dracpu import __version__
from dracpu.cli import EXIT_CLOSED_STDOUT, SUBCOMMANDS, main
from dracpu.cli.introspect import INTROSPECT_SUBCOMMANDS
from dracpu.cli.sim import SIM_SUBCOMMANDS
from dracpu.flags import COMMANDS, usage_text

REPO = Path(__file__).resolve().parents[2]

EVERY_COMMAND = [
    [],
    ["run"],
    ["demo"],
    ["map"],
    ["gatherinfo"],
    ["version"],
    ["introspect"],
    *(["introspect", name] for name in INTROSPECT_SUBCOMMANDS),
    ["sim"],
    *(["sim", name] for name in SIM_SUBCOMMANDS),
]


def _ids(argv: list[str]) -> str:
    return " ".join(argv) or "dracpu"


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=_ids)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_is_on_stdout_with_exit_0(
    capsys: pytest.CaptureFixture[str], command: list[str], flag: str
) -> None:
    code = main([*command, flag])
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), (command, err)
    assert out.startswith("usage: "), (command, out[:200])
    assert "example:" in out or "example: " in out, command


def test_chaos_help_is_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    from dracpu_sim.chaos.cli import main as chaos_main

    with pytest.raises(SystemExit) as done:
        chaos_main(["--help"])
    out, err = capsys.readouterr()
    assert (done.value.code, err) == (0, "")
    assert out.startswith("usage: python -m dracpu_sim.chaos")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nope"], "dracpu: flag provided but not defined: -nope (see dracpu --help)\n"),
        (["demo", "--nope"], "dracpu: demo: unrecognized arguments: --nope\n"),
        (["--version=yes"], "dracpu: flag -version takes no value: --version=yes (see dracpu"),
        (["sim", "nope"], 'dracpu: unknown sim subcommand "nope"; supported subcommands: '),
    ],
)
def test_errors_stay_on_stderr(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code = main(argv)
    out, err = capsys.readouterr()
    assert (code != 0, out) == (True, ""), argv
    assert err.startswith(message), err


def test_sim_without_a_subcommand_is_an_error_with_its_usage_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["sim"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.startswith("usage: dracpu sim {apiserver,runtime,fleet} [flags]\n")
    assert err.endswith(
        "dracpu: sim requires a subcommand; supported subcommands: apiserver, runtime, fleet\n"
    )


# -- the version ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv", [["--version"], ["-version"], ["run", "--version"], ["--v=4", "--version"]]
)
def test_version_flag_prints_what_version_prints(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert main(["version"]) == 0
    expected = capsys.readouterr().out
    assert expected == f"dracpu {__version__}\n"
    code = main(argv)
    out, err = capsys.readouterr()
    assert (code, out, err) == (0, expected, "")


def test_version_is_in_the_root_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert "  dracpu --version " in usage_text()


# -- every command is listed wherever commands are -----------------------------------------


def _synopses() -> list[str]:
    return [synopsis for synopsis, _ in COMMANDS]


def test_every_subcommand_is_in_the_command_table() -> None:
    words = {synopsis.split()[1] for synopsis in _synopses() if len(synopsis.split()) > 1}
    assert set(SUBCOMMANDS) <= words | {"[flags]"}
    for name in SIM_SUBCOMMANDS:
        assert f"dracpu sim {name} [flags]" in _synopses(), name
    for name in INTROSPECT_SUBCOMMANDS:
        assert any(s.startswith(f"dracpu introspect {name}") for s in _synopses()), name


@pytest.mark.parametrize("name", list(SIM_SUBCOMMANDS))
def test_every_sim_part_is_listed(capsys: pytest.CaptureFixture[str], name: str) -> None:
    assert f"  dracpu sim {name} [flags]" in usage_text()
    main(["sim", "--help"])
    sim_help = capsys.readouterr().out
    assert name in sim_help.splitlines()[0]
    readme = (REPO / "README.md").read_text()
    commands = readme.split("## Commands")[1].split("\n## ")[0]
    assert re.search(rf"`dracpu sim [a-z|]*\b{name}\b", commands), name
    configuration = (REPO / "docs" / "configuration.md").read_text()
    assert f"| `dracpu sim {name} [flags]` |" in configuration


# -- a closed stdout -------------------------------------------------------------------------


class _ClosedPipe(io.StringIO):
    """stdout whose reader is gone, unbuffered: every write is EPIPE (a flush with nothing
    buffered writes nothing, so it is not)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


class _ClosedAtFlush(io.StringIO):
    """stdout that buffers (a pipe is block-buffered) and finds the pipe closed on flush."""

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize(
    "argv",
    [["introspect", "metrics"], ["--help"], ["demo", "--help"], ["version"], ["--version"]],
    ids=_ids,
)
def test_a_closed_stdout_ends_quietly_with_141(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    # A pipe is block-buffered: the writes go to the buffer, the flush meets the closed
    # pipe. (argparse swallows an OSError of its own help write; the flush does not.)
    # Patched in the test body: capsys puts its own stdout in place after fixtures ran.
    monkeypatch.setattr("sys.stdout", _ClosedAtFlush())
    assert main(argv) == EXIT_CLOSED_STDOUT == 141
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [["introspect", "metrics"], ["version"]], ids=_ids)
def test_a_write_to_a_closed_stdout_ends_quietly_with_141(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    monkeypatch.setattr("sys.stdout", _ClosedPipe())
    assert main(argv) == 141
    assert capsys.readouterr().err == ""


def test_a_closed_stdout_inside_a_nursery_ends_quietly(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def report(argv: object) -> int:
        raise ExceptionGroup("nursery", [BrokenPipeError(32, "Broken pipe")])

    monkeypatch.setattr(cli, "dispatch", report)
    assert main(["demo"]) == 141
    assert capsys.readouterr().err == ""

    def failed(argv: object) -> int:
        raise ExceptionGroup("nursery", [BrokenPipeError(32, "Broken pipe"), ValueError("x")])

    monkeypatch.setattr(cli, "dispatch", failed)
    with pytest.raises(ExceptionGroup):  # a real failure beside it is not hidden
        main(["demo"])


def test_stderr_errors_still_print_when_stdout_is_closed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdout", _ClosedPipe())
    assert main(["bogus"]) == 1
    assert capsys.readouterr().err.startswith('dracpu: unknown subcommand "bogus"')


def test_a_broken_pipe_that_is_not_stdout_keeps_its_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # stdout is a pipe whose reader is still there: the BrokenPipeError came from another
    # pipe or socket, a real error that must not pass for a closed stdout.
    def other_pipe(argv: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "dispatch", other_pipe)
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as stdout, os.fdopen(read_end) as _reader:
        monkeypatch.setattr("sys.stdout", stdout)
        with pytest.raises(BrokenPipeError):
            main(["demo"])

        def in_a_group(argv: object) -> int:
            raise ExceptionGroup("nursery", [BrokenPipeError(32, "Broken pipe")])

        monkeypatch.setattr(cli, "dispatch", in_a_group)
        with pytest.raises(ExceptionGroup):
            main(["demo"])


def test_a_broken_pipe_on_a_closed_stdout_pipe_ends_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def writes(argv: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "dispatch", writes)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (`head -2`) is gone
    with os.fdopen(write_end, "w") as stdout:
        monkeypatch.setattr("sys.stdout", stdout)
        assert main(["demo"]) == 141
