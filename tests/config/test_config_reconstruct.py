"""The running driver's config rebuilt from its command line (behavior.md §2.5 step 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dracpu.config import ConfigError, DriverConfig, driver_argv, reconstruct_from_cmdline


class DriverFS:
    """The driver's mount namespace as seen from gatherinfo: a directory standing in for
    /proc/<pid>/root, and a record of the paths resolved through it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.resolved: list[str] = []

    def write(self, path: str, text: str) -> None:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def resolve(self, path: str) -> str:
        self.resolved.append(path)
        return str(self.root / path.lstrip("/"))


@pytest.fixture
def driver_fs(tmp_path: Path) -> DriverFS:
    fs = DriverFS(tmp_path)
    fs.write("/etc/dracpu/config.yaml", "groupBy: socket\nreservedCPUs: '0-3'\n")
    return fs


def rebuild(fs: DriverFS, *args: str, argv0: str = "/dracpu") -> DriverConfig:
    return reconstruct_from_cmdline([argv0, *args], fs.resolve)


def test_file_then_flags(driver_fs: DriverFS) -> None:
    cfg = rebuild(driver_fs, "--config=/etc/dracpu/config.yaml", "--reserved-cpus", "0-1")
    assert cfg == DriverConfig(groupBy="socket", reservedCPUs="0-1")
    assert driver_fs.resolved == ["/etc/dracpu/config.yaml"]


@pytest.mark.parametrize("argv0", ["/usr/bin/python3", "dracpu-gatherinfo", "/dracpu2", ""])
def test_other_programs_report_defaults(driver_fs: DriverFS, argv0: str) -> None:
    assert rebuild(driver_fs, "--group-by=machine", argv0=argv0) == DriverConfig()
    assert reconstruct_from_cmdline([], driver_fs.resolve) == DriverConfig()


def test_relative_argv0_basename(driver_fs: DriverFS) -> None:
    assert rebuild(driver_fs, "--group-by=machine", argv0="./bin/dracpu").groupBy == "machine"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # unknown flags are dropped, with their next non-dash argument when they have no `=`
        (["--unknown", "value", "--group-by=socket"], DriverConfig(groupBy="socket")),
        (["--unknown=value", "--group-by=socket"], DriverConfig(groupBy="socket")),
        (["--unknown", "--group-by=socket"], DriverConfig(groupBy="socket")),
        (["-v", "4", "-vmodule", "x=1", "--group-by", "socket"], DriverConfig(groupBy="socket")),
        (["-v=4", "--reserved-cpus=7"], DriverConfig(reservedCPUs="7")),
        # a stray positional goes too, as does its following non-dash argument
        (["stray", "--group-by=socket"], DriverConfig(groupBy="socket")),
        (["stray", "word", "--group-by=socket"], DriverConfig(groupBy="socket")),
        (["a=b", "word", "--group-by=socket"], DriverConfig(groupBy="socket")),
        # parsing stops at --
        (["--", "--group-by=machine"], DriverConfig()),
        (["--group-by=socket", "--", "--group-by=machine"], DriverConfig(groupBy="socket")),
        # a bool flag does not take the next argument
        (
            ["--expose-pcie-roots", "--group-by", "socket"],
            DriverConfig(exposePCIeRoots=True, groupBy="socket"),
        ),
        (["--expose-pcie-roots=false"], DriverConfig()),
        # a value flag takes the next argument whatever it looks like
        (["--hostname-override", "-n1"], DriverConfig(hostnameOverride="-n1")),
        # flag-only host paths are config flags too
        (
            ["--sysfs-root", "/host/sys", "--state-dir=/s"],
            DriverConfig(sysfsRoot="/host/sys", stateDir="/s"),
        ),
        # -h is not a config flag: dropped, not a help request
        (["-h", "--group-by=machine"], DriverConfig(groupBy="machine")),
    ],
)
def test_known_flags_only(driver_fs: DriverFS, args: list[str], expected: DriverConfig) -> None:
    assert rebuild(driver_fs, *args) == expected


@pytest.mark.parametrize(
    "args",
    [
        ["--group-by=rack", "--reserved-cpus=1"],
        ["--expose-pcie-roots=maybe", "--reserved-cpus=1"],
        ["--reserved-cpus"],
        ["---reserved-cpus=1"],
    ],
)
def test_a_parse_failure_keeps_the_defaults(driver_fs: DriverFS, args: list[str]) -> None:
    assert rebuild(driver_fs, "--config=/etc/dracpu/config.yaml", *args) == DriverConfig()
    assert driver_fs.resolved == []


@pytest.mark.parametrize(
    "text",
    [
        "groupBy: [\n",
        "apiVersion: v9\ngroupBy: machine\n",
        "groupby: machine\n",
        "bindAddress: ':1'\ngroupBy: machine\n",
    ],
)
def test_file_errors_are_ignored(driver_fs: DriverFS, text: str) -> None:
    driver_fs.write("/etc/dracpu/bad.yaml", text)
    cfg = rebuild(driver_fs, "--config", "/etc/dracpu/bad.yaml", "--reserved-cpus=2")
    assert cfg == DriverConfig(reservedCPUs="2")


def test_missing_file_is_ignored(driver_fs: DriverFS) -> None:
    assert rebuild(driver_fs, "--config=/nowhere.yaml") == DriverConfig()
    assert driver_fs.resolved == ["/nowhere.yaml"]


def test_decode_problems_skip_only_the_bad_keys(driver_fs: DriverFS) -> None:
    driver_fs.write("/c.yaml", "aaa: 1\nreservedCPUs: 5\ngroupBy: socket\nkubeconfig: /k\n")
    assert rebuild(driver_fs, "--config=/c.yaml") == DriverConfig(groupBy="socket", kubeconfig="/k")


def test_an_unmarshalable_file_applies_nothing(driver_fs: DriverFS) -> None:
    driver_fs.write("/c.yaml", "groupBy: socket\nzzz: .inf\n")
    assert rebuild(driver_fs, "--config=/c.yaml") == DriverConfig()


def test_relative_config_path_is_passed_to_the_resolver(driver_fs: DriverFS) -> None:
    driver_fs.write("conf/c.yaml", "cpuDeviceMode: individual\n")
    assert rebuild(driver_fs, "-config", "conf/c.yaml").cpuDeviceMode == "individual"
    assert driver_fs.resolved == ["conf/c.yaml"]


def test_validation_failure_is_an_error(driver_fs: DriverFS) -> None:
    with pytest.raises(ConfigError) as info:
        rebuild(driver_fs, "--kubelet-root-dir=rel")
    assert str(info.value) == (
        'failed to resolve driver config: cannot validate config: invalid kubeletRootDir "rel": '
        "must be an absolute path"
    )
    driver_fs.write("/g.yaml", "groupBy: rack\n")
    with pytest.raises(ConfigError) as info:
        rebuild(driver_fs, "--config=/g.yaml")
    assert str(info.value) == (
        'failed to resolve driver config: cannot validate config: invalid groupBy "rack": must '
        'be "socket", "numanode", or "machine"'
    )


def test_kubelet_root_is_cleaned(driver_fs: DriverFS) -> None:
    assert rebuild(driver_fs, "--kubelet-root-dir", "/mnt/a/../kubelet//").kubeletRootDir == (
        "/mnt/kubelet"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["/usr/local/bin/python3.11", "/usr/local/bin/dracpu", "run", "--group-by=socket"],
        ["python3", "-m", "dracpu", "run", "--group-by", "socket"],
        ["/dracpu", "--group-by=socket"],
    ],
)
def test_python_entry_point_command_lines_are_read(argv: list[str]) -> None:
    # In the image the daemon is a Python script: its cmdline starts with the interpreter.
    cfg = reconstruct_from_cmdline(argv, lambda p: p)
    assert cfg.groupBy == "socket"


def test_driver_argv_leaves_other_programs_alone() -> None:
    assert driver_argv(["python3", "other.py", "--group-by=socket"]) == [
        "python3",
        "other.py",
        "--group-by=socket",
    ]
    assert driver_argv(["python3"]) == ["python3"]
    assert driver_argv([]) == []
