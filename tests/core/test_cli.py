"""The command line: dispatch errors, introspection output, gatherinfo round trip."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dracpu.cli import main

FIXTURES = Path(__file__).parent.parent / "fake_sysfs"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    # `dracpu run` installs its log handler on the root logger; later tests must not write
    # to this test's captured stderr.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "version")
    assert code == 0
    assert out.startswith("dracpu ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bogus"], 'dracpu: unknown subcommand "bogus"; supported subcommands: '),
        (["introspect"], "dracpu: introspect requires a subcommand; supported subcommands: "),
        (["introspect", "nope"], 'dracpu: unknown introspect subcommand "nope"; supported'),
        (
            ["introspect", "metrics", "a", "b"],
            "dracpu: metrics does not accept positional arguments: a b",
        ),
        (["-v=2", "version"], "dracpu: root flags cannot be combined with subcommands"),
        (
            ["gatherinfo", "--stdout", "--output-dir", "/tmp/x"],
            "dracpu: --stdout and --output-dir cannot be used together",
        ),
        (["introspect", "topology", "--format", "xml"], "dracpu: introspect topology: argument"),
        (["introspect", "topology", "--sysfs-root", "/nonexistent-dir"], "dracpu: sysfs root"),
    ],
)
def test_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code != 0
    assert out == ""
    assert err.startswith(message)
    assert err.count("\n") == 1
    assert "Traceback" not in err


VM_1CPU = str(FIXTURES / "vm-1cpu")


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (
            ["introspect", "allocate", "--sysfs-root", VM_1CPU, "--count", "0"],
            2,
            "dracpu: introspect allocate: argument --count: must be 1 or more, got 0",
        ),
        (
            ["introspect", "allocate", "--sysfs-root", VM_1CPU, "--count", "-4"],
            2,
            "dracpu: introspect allocate: argument --count: must be 1 or more, got -4",
        ),
        (
            ["introspect", "allocate", "--sysfs-root", VM_1CPU, "--count=two"],
            2,
            "dracpu: introspect allocate: argument --count: 'two' is not a whole number",
        ),
        (
            ["demo", "--sysfs-root", VM_1CPU, "--reserved-cpus", "0"],
            2,
            "dracpu: --reserved-cpus 0 reserves every CPU of this node (0): nothing is left "
            "for claims or the shared pool",
        ),
    ],
)
def test_bad_input_is_one_line_and_non_zero(
    capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    got, out, err = run(capsys, *argv)
    assert (got, out, err) == (code, "", message + "\n")


def test_introspect_slices_with_every_cpu_reserved(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("reservedCPUs: '0'\n")
    got, out, err = run(
        capsys, "introspect", "slices", "--sysfs-root", VM_1CPU, "--config", str(config)
    )
    assert (got, out) == (1, "")
    assert err == (
        "dracpu: reservedCPUs 0 covers every CPU of this node (0): there is nothing to publish\n"
    )


def test_help_exits_zero_with_example(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["introspect", "topology", "-h"], ["gatherinfo", "--help"], ["version", "-h"]):
        code, out, err = run(capsys, *argv)
        assert (code, err) == (0, "")
        assert "example:" in out


def test_introspect_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "introspect", "metrics")
    assert code == 0
    assert json.loads(out)[0]["name"] == "dra_cpu_allocated_cpus"


def test_introspect_topology_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "introspect", "topology", "--sysfs-root", str(FIXTURES / "xeon-2s-ht")
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["smtEnabled"] is True
    assert [c["cpu"] for c in doc["cpus"]] == list(range(80))
    assert doc["cpus"][0] == {
        "cpu": 0,
        "core": 0,
        "socket": 0,
        "die": 0,
        "cluster": doc["cpus"][0]["cluster"],
        "numa": 0,
        "l3": doc["cpus"][0]["l3"],
        "coreType": "standard",
        "siblings": "0,40",
    }
    assert doc["cpus"][59]["socket"] == 0 and doc["cpus"][60]["socket"] == 1
    assert doc["cpus"][60]["siblings"] == "20,60"


def test_introspect_topology_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "introspect",
        "topology",
        "--sysfs-root",
        str(FIXTURES / "intel-hybrid"),
        "--format",
        "text",
    )
    assert code == 0
    assert out.splitlines()[0].startswith("Machine: 24 CPUs (0-23 online), 16 cores, 1 sockets")
    assert "  Socket 0 (0-23)" in out
    assert "[e-core]" in out and "[p-core]" in out


def _fake_procfs(root: Path, argv: list[str]) -> None:
    proc = root / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "comm").write_text("init\n")
    (proc / "1" / "cmdline").write_bytes(b"/sbin/init\0")
    (proc / "4242").mkdir()
    (proc / "4242" / "comm").write_text("dracpu\n")
    (proc / "4242" / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (proc / "self").mkdir()


def test_gatherinfo_round_trip(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = tmp_path / "host"
    _fake_procfs(host, ["/dracpu", "--reserved-cpus=0-1", "--unknown", "x", "-v=4"])
    monkeypatch.setenv("HOST_ROOT", str(host))
    sysfs = FIXTURES / "epyc-nps4"
    out_dir = tmp_path / "out"
    code, _, err = run(
        capsys, "gatherinfo", "--output-dir", str(out_dir), "--sysfs-root", str(sysfs)
    )
    assert code == 0, err
    files = list(out_dir.iterdir())
    assert len(files) == 1
    assert files[0].name.startswith("dracpu-gatherinfo-") and files[0].suffix == ".yaml"
    assert files[0].stat().st_mode & 0o777 == 0o600
    assert f"path={files[0]}" in err
    assert f"read the running driver's config from PID 4242 under {host}/proc\n" in err
    text = files[0].read_text()
    assert text.startswith("---\n")
    report = yaml.safe_load(text)
    assert report["layoutVersion"] == "v1"
    assert report["driverConfig"]["reservedCPUs"] == "0-1"
    assert report["driverConfigSource"] == "PID 4242"
    assert report["cpuDetails"]["topology"]["numCPUs"] == 128
    assert report["cpuDetails"]["topology"]["numNUMANodes"] == 4
    # the bundle reproduces the topology anywhere
    code, from_bundle, _ = run(capsys, "introspect", "topology", "--sysfs-root", str(files[0]))
    assert code == 0
    code, original, _ = run(capsys, "introspect", "topology", "--sysfs-root", str(sysfs))
    assert json.loads(from_bundle)["cpus"] == json.loads(original)["cpus"]


def test_gatherinfo_without_driver_says_so_and_reports_defaults(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "comm").write_text("init\n")
    monkeypatch.setenv("HOST_ROOT", str(tmp_path))
    sysfs = str(FIXTURES / "epyc-nps4")
    code, out, err = run(capsys, "gatherinfo", "--stdout", "--sysfs-root", sysfs)
    assert code == 0, err
    assert err == (
        f"dracpu gatherinfo: no dracpu daemon is running (none found under {tmp_path}/proc): "
        "the report's driverConfig holds the defaults, not a running driver's config\n"
    )
    report = yaml.safe_load(out)
    assert report["driverConfigSource"] == (
        f"defaults: no dracpu daemon was running (none found under {tmp_path}/proc)"
    )


def test_gatherinfo_with_an_unreadable_procfs_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOST_ROOT", str(tmp_path / "nowhere"))
    code, out, err = run(capsys, "gatherinfo", "--stdout")
    assert (code, out) == (1, "")
    assert err == f"dracpu: failed to list {tmp_path}/nowhere/proc: No such file or directory\n"


def test_bad_bundle(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bundle = tmp_path / "b.yaml"
    bundle.write_text("---\nlayoutVersion: v1\n")
    code, _, err = run(capsys, "introspect", "topology", "--sysfs-root", str(bundle))
    assert code == 1
    assert "is neither a directory nor a gatherinfo report with a sysfs section" in err


def test_introspect_allocate(capsys: pytest.CaptureFixture[str]) -> None:
    root = str(FIXTURES / "xeon-snc")
    code, out, _ = run(capsys, "introspect", "allocate", "--sysfs-root", root, "--count", "20")
    assert code == 0
    assert out == "0-9,40-49\n"
    code, out, err = run(capsys, "introspect", "allocate", "--sysfs-root", root, "--count", "81")
    assert code == 1
    assert err == (
        "dracpu: not enough cpus available to satisfy request: requested=81, available=80\n"
    )
    code, out, err = run(
        capsys,
        "introspect",
        "allocate",
        "--sysfs-root",
        root,
        "--count",
        "3",
        "--option",
        "fullPCPUsOnly=true",
    )
    assert code == 1
    assert err.startswith("dracpu: fullPCPUsOnly: requested 3 CPUs is not a multiple of 2")


def test_introspect_allocate_reserved(capsys: pytest.CaptureFixture[str]) -> None:
    root = str(FIXTURES / "xeon-snc")
    code, out, _ = run(
        capsys,
        "introspect",
        "allocate",
        "--sysfs-root",
        root,
        "--count",
        "2",
        "--reserved",
        "0,40",
        "--available",
        "0-3,40-43",
    )
    assert code == 0
    assert out == "1,41\n"
    assert os.path.isdir(root)


def test_introspect_slices_says_why_a_one_cpu_node_publishes_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Its only core is the shared pool's floor, as in the daemon.
    code, out, err = run(capsys, "introspect", "slices", "--sysfs-root", VM_1CPU)
    assert (code, out) == (0, "")
    assert err == (
        "dracpu: no devices to publish: CPUs 0 of this node are reserved, isolated or kept "
        "in the shared pool\n"
    )


def test_introspect_slices(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = str(FIXTURES / "epyc-nps4")
    code, out, err = run(
        capsys, "introspect", "slices", "--sysfs-root", root, "--node-name", "node-a"
    )
    assert code == 0, err
    (doc,) = list(yaml.safe_load_all(out))
    assert doc["metadata"]["generateName"] == "00000-dra.cpu-node-a-"
    assert [d["name"] for d in doc["spec"]["devices"]] == [
        "cpudevnuma000",
        "cpudevnuma001",
        "cpudevnuma002",
        "cpudevnuma003",
    ]
    # The daemon keeps the core of CPU 0 (CPUs 0 and 64) shared when reservedCPUs is empty.
    assert doc["spec"]["devices"][0]["capacity"] == {"dra.cpu/cpu": {"value": "30"}}
    assert doc["spec"]["devices"][1]["capacity"] == {"dra.cpu/cpu": {"value": "32"}}
    config = tmp_path / "c.yaml"
    config.write_text("cpuDeviceMode: individual\nreservedCPUs: '0'\n")
    code, out, err = run(
        capsys,
        "introspect",
        "slices",
        "--sysfs-root",
        root,
        "--node-name",
        "node-a",
        "--config",
        str(config),
        "--format",
        "json",
    )
    assert code == 0, err
    slices = json.loads(out)
    assert [len(s["spec"]["devices"]) for s in slices] == [127]
    config.write_text("groupby: socket\n")
    code, out, err = run(
        capsys, "introspect", "slices", "--sysfs-root", root, "--config", str(config)
    )
    assert code == 1
    assert err == (
        f'dracpu: cannot apply {config}: field "groupby" is spelled differently from the schema; '
        'use "groupBy"\n'
    )


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig for a server nobody listens on (the client is made, nothing connects)."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


@pytest.fixture
def no_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    """`dracpu run` resolves everything, then returns instead of running the services."""
    import dracpu.nursery.supervisor as supervisor

    async def run_daemon(startup: object) -> int:
        return 0

    monkeypatch.setattr(supervisor, "run_daemon", run_daemon)


def test_root_flags_load_and_log_the_config(
    capsys: pytest.CaptureFixture[str], kubeconfig: Path, no_daemon: None
) -> None:
    code, _, err = run(
        capsys, "--group-by=socket", "-reserved-cpus", "0-1", f"--kubeconfig={kubeconfig}"
    )
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0].startswith("W")
    assert lines[0].endswith('] "flag is deprecated" flag="group-by" driverConfigField="groupBy"')
    assert any('"configuration successfully loaded" config=<' in line for line in lines)
    assert "\tgroupBy: socket" in lines and "\treservedCPUs: 0-1" in lines


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        # No kubeconfig and no in-cluster service account.
        (
            ["--group-by=socket"],
            1,
            "dracpu: failed to create the Kubernetes client: load in-cluster config: "
            "Service host/port is not set.",
        ),
        (
            ["--kubeconfig", "/nonexistent"],
            1,
            "dracpu: failed to create the Kubernetes client: kubeconfig /nonexistent: "
            "no such file or directory",
        ),
        (
            ["run", "--kubeconfig=/"],
            1,
            "dracpu: failed to create the Kubernetes client: kubeconfig /: is a directory",
        ),
        (
            ["--reserved-cpus=x"],
            1,
            "dracpu: failed to load configuration: failed to parse reserved CPUs: "
            "invalid cpuset 'x': not a cpu id or range: 'x'",
        ),
        (
            ["--group-by=rack"],
            2,
            'dracpu: invalid value "rack" for flag -group-by: invalid value: "rack", must be '
            "socket, numanode or machine (see dracpu --help)",
        ),
        (["run", "--nope"], 2, "dracpu: flag provided but not defined: -nope (see dracpu --help)"),
        (["run", "extra"], 1, "dracpu: run does not accept positional arguments: extra"),
    ],
)
def test_daemon_start_errors_are_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    code: int,
    message: str,
) -> None:
    # Printed once (no log line repeating it) and without the config dumped first.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    got, out, err = run(capsys, *argv)
    assert got == code
    assert out == ""
    lines = [line for line in err.splitlines() if '"flag is deprecated"' not in line]
    assert lines == [message]


def test_run_takes_the_root_flags(
    capsys: pytest.CaptureFixture[str], kubeconfig: Path, no_daemon: None
) -> None:
    code, _, err = run(capsys, "run", "--group-by=machine", f"--kubeconfig={kubeconfig}")
    assert code == 0, err
    assert "\tgroupBy: machine" in err.splitlines()


def test_help_is_argparse_style_for_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["run", "-h"], ["demo", "--help"], ["sim", "apiserver", "-h"]):
        code, out, err = run(capsys, *argv)
        assert (code, err) == (0, ""), argv
        assert out.startswith("usage: dracpu"), argv
        assert "\nexample:\n  " in out, argv
    _, out, _ = run(capsys, "run", "--help")
    assert "  --kubelet-root-dir DIR  " in out
    assert "\n  -kubelet-root-dir" not in out


def test_demo_flags_all_have_help(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "demo", "--help")
    options = out.split("options:")[1].split("example:")[0]
    for flag in ("--output", "--cpu-device-mode", "--group-by", "--reserved-cpus"):
        entry = options.split(flag, 1)[1].split("\n  --", 1)[0]
        assert len(entry.split()) > 3, flag  # more than the metavar: a sentence


def test_sim_apiserver_example_does_not_chain_after_a_blocking_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = run(capsys, "sim", "apiserver", "--help")
    example = out.split("example:\n")[1]
    assert "&&" not in example
    assert example.splitlines()[0].strip().startswith("dracpu sim apiserver")


def test_ctrl_c_inside_a_nursery_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    import dracpu.cli as cli

    def interrupted(argv: object) -> int:
        raise BaseExceptionGroup("nursery", [KeyboardInterrupt()])

    monkeypatch.setattr(cli, "dispatch", interrupted)
    assert main(["version"]) == 130

    def failed(argv: object) -> int:
        raise ExceptionGroup("nursery", [ValueError("boom")])

    monkeypatch.setattr(cli, "dispatch", failed)
    with pytest.raises(ExceptionGroup):  # a real failure is not taken for Ctrl-C
        main(["version"])
