"""The support bundle's report: the driver's process and config, the CPU details and the
sysfs files discovery reads (``dracpu.gatherinfo`` says what a report holds)."""

from __future__ import annotations

import os
import platform
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import yaml

from dracpu import __version__
from dracpu.topology.model import NO_ID, Topology

LAYOUT_VERSION = "v1"
# Report keys of what the API server holds for this node (gather_api_objects).
REPORT_SLICES = "resourceSlices"
REPORT_CLASSES = "deviceClasses"
# The files topology and PCIe discovery read, relative to the sysfs root.
_SYSFS_PATTERNS = (
    "devices/system/cpu/online",
    "devices/system/cpu/possible",
    "devices/system/cpu/present",
    "devices/system/cpu/smt/control",
    "devices/cpu_atom/cpus",
    "devices/system/node/node*/cpulist",
    "devices/system/cpu/cpu*/online",
    "devices/system/cpu/cpu*/topology/physical_package_id",
    "devices/system/cpu/cpu*/topology/core_id",
    "devices/system/cpu/cpu*/topology/die_id",
    "devices/system/cpu/cpu*/topology/cluster_id",
    "devices/system/cpu/cpu*/cache/index*/level",
    "devices/system/cpu/cpu*/cache/index*/id",
    "devices/system/cpu/cpu*/cache/index*/type",
    "devices/system/cpu/cpu*/cache/index*/shared_cpu_list",
    "devices/pci*/pci_bus/*/cpulistaffinity",
)
_CPU_DIR = re.compile(r"cpu\d+")
_NODE_ENTRY = re.compile(r"node\d+")


class GatherinfoError(Exception):
    """A gatherinfo step failed; the message is what the user sees after `dracpu: `."""


@dataclass(frozen=True, slots=True)
class DriverProcess:
    pid: int
    argv: list[str]


def find_driver_process(procfs: Path) -> DriverProcess | None:
    """The running driver: the lowest PID whose `comm` is `dracpu` and whose command line
    runs the daemon (`dracpu [flags]` or `dracpu run ...`), never this process. None when
    no daemon runs. Other `dracpu` commands (this gatherinfo among them: a console script's
    `comm` is `dracpu` too) are not the driver and have no config to read."""
    found = driver_processes(procfs)
    return found[0] if found else None


def driver_processes(procfs: Path) -> list[DriverProcess]:
    """Every daemon process under `procfs`, by PID (see `find_driver_process`)."""
    try:
        names = os.listdir(procfs)
    except OSError as err:
        raise GatherinfoError(f"failed to list {procfs}: {err.strerror}") from err
    me = _own_pid(procfs)
    found = []
    for pid in sorted(int(name) for name in names if name.isdigit()):
        if pid == me:
            continue
        try:
            comm = (procfs / str(pid) / "comm").read_text().strip()
            if comm != "dracpu":
                continue
            raw = (procfs / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        argv = [arg.decode(errors="replace") for arg in raw.split(b"\0")]
        if argv and argv[-1] == "":
            argv.pop()
        if runs_daemon(argv):
            found.append(DriverProcess(pid=pid, argv=argv))
    return found


def _own_pid(procfs: Path) -> int | None:
    """This process's PID as `procfs` numbers it (`$HOST_ROOT/proc` may be another PID
    namespace's, where `os.getpid()` names someone else)."""
    try:
        return int(os.readlink(procfs / "self"))
    except (OSError, ValueError):
        return None


def runs_daemon(argv: list[str]) -> bool:
    """Whether a `dracpu` command line is the daemon's: flags only, or `run`. Go's flag
    parsing stops at the first word that is not a flag or a flag's value, so that word is
    the subcommand (the Go driver has none). As `reconstruct_from_cmdline`, an unknown flag
    without `=` is taken to have a value when a word that is no flag follows it."""
    from dracpu.config import driver_argv
    from dracpu.flags import flag_spec

    words = driver_argv(argv)
    if not words or os.path.basename(words[0]) != "dracpu":
        return False
    rest = words[1:]
    i = 0
    while i < len(rest):
        word = rest[i]
        i += 1
        if word == "--":
            return i == len(rest) or rest[i] == "run"
        if not word.startswith("-") or word == "-":
            return word == "run"
        name, has_value, _ = word.lstrip("-").partition("=")
        if has_value:
            continue
        try:
            takes_value = flag_spec(name).kind != "bool"
        except KeyError:
            takes_value = i < len(rest) and not rest[i].startswith("-")
        if takes_value:
            i += 1
    return True


def path_in_process(procfs: Path, pid: int) -> Callable[[str], str]:
    """Resolve a path as the driver sees it, through its root or working directory."""

    def resolve(path: str) -> str:
        if os.path.isabs(path):
            return str(procfs / str(pid) / "root" / path.lstrip("/"))
        return str(procfs / str(pid) / "cwd" / path)

    return resolve


def _iter_sysfs_files(root: Path) -> Iterator[Path]:
    seen: set[Path] = set()
    for pattern in _SYSFS_PATTERNS:
        for path in sorted(root.glob(pattern)):
            if path.is_file() and path not in seen:
                seen.add(path)
                yield path


def collect_sysfs(root: Path) -> dict[str, str]:
    """Every sysfs file discovery reads, keyed `/sys/<relative path>`, plus NUMA links."""
    files: dict[str, str] = {}
    for path in _iter_sysfs_files(root):
        try:
            files["/sys/" + path.relative_to(root).as_posix()] = path.read_text()
        except OSError:
            continue  # unreadable files are reported by discovery itself
    cpu_dir = root / "devices/system/cpu"
    for entry in sorted(cpu_dir.iterdir()) if cpu_dir.is_dir() else []:
        if not _CPU_DIR.fullmatch(entry.name):
            continue
        for child in sorted(entry.iterdir()):
            if _NODE_ENTRY.fullmatch(child.name):
                files[f"/sys/devices/system/cpu/{entry.name}/{child.name}"] = ""
                break  # the overlay format allows one NUMA node per CPU directory
    return dict(sorted(files.items()))


def materialize_sysfs(files: Mapping[str, str], dest: Path) -> Path:
    """Write a gatherinfo `sysfs` section as a tree under ``dest``; returns the sysfs root."""
    for key, content in files.items():
        if not key.startswith("/sys/"):
            raise GatherinfoError(f'sysfs path "{key}" must be beneath /sys')
        rel = Path(key.removeprefix("/sys/"))
        if rel.is_absolute() or ".." in rel.parts:
            raise GatherinfoError(f'invalid sysfs path "{key}"')
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    return dest


@dataclass(frozen=True)
class ApiObjects:
    """What the report holds from the API server, and a line saying where it came from."""

    slices: list[dict[str, Any]]
    classes: list[dict[str, Any]]
    source: str


def cpu_details(topo: Topology) -> dict[str, Any]:
    cpus = []
    for _, info in sorted(topo.cpus.items()):
        entry: dict[str, Any] = {
            "clusterID": info.cluster,
            "coreID": info.core,
            "coreType": str(info.core_type),
            "cpuID": info.cpu,
            "numaNodeID": info.numa,
            "sibling": info.sibling,
            "socketID": info.socket,
            "uncoreCacheID": info.l3 if info.l3 != NO_ID else -1,
        }
        if info.numa_cpus:
            entry["numaNodeCPUSet"] = info.numa_cpus.format()
        cpus.append(dict(sorted(entry.items())))
    return {
        "cpus": cpus,
        "topology": {
            "numCPUs": topo.num_cpus,
            "numCores": topo.num_cores,
            "numNUMANodes": topo.num_numa_nodes,
            "numSockets": topo.num_sockets,
            "numUncoreCache": topo.num_uncore_caches,
            "smtEnabled": topo.smt_enabled,
        },
    }


def _omit_empty(config: object) -> dict[str, Any]:
    """Config with Go's omitempty semantics: zero values are left out."""
    raw = msgspec.to_builtins(config)
    return {k: v for k, v in sorted(raw.items()) if v not in ("", 0, False, None, [], {})}


def build_report(
    topo: Topology,
    config: object,
    sysfs_files: Mapping[str, str],
    *,
    config_source: str = "",
    api_objects: ApiObjects | None = None,
) -> str:
    """The report's YAML. ``config_source`` says where ``driverConfig`` came from (the PID
    of the running driver, or that none ran and these are the defaults); empty leaves the
    key out. ``api_objects``: other drivers' slices and the device classes, with where
    they came from (or only why they are not there)."""
    report: dict[str, object] = {
        "cpuDetails": cpu_details(topo),
        "driverConfig": _omit_empty(config),
        "layoutVersion": LAYOUT_VERSION,
        "sysfs": dict(sysfs_files),
        "toolVersion": {"dracpuVersion": __version__, "pythonVersion": platform.python_version()},
    }
    if config_source:
        report["driverConfigSource"] = config_source
    if api_objects is not None:
        report["apiObjectsSource"] = api_objects.source
        if api_objects.slices:
            report[REPORT_SLICES] = api_objects.slices
        if api_objects.classes:
            report[REPORT_CLASSES] = api_objects.classes
    return "---\n" + yaml.safe_dump(report, sort_keys=True, default_flow_style=False)


def write_report(text: str, *, output_dir: str | None, now: float | None = None) -> Path:
    """Write the report to a new file; the file is removed again on a write failure."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    if output_dir:
        directory = Path(os.path.normpath(output_dir))
        try:
            directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            path = directory / f"dracpu-gatherinfo-{stamp}-{os.getpid()}.yaml"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError as err:
            raise GatherinfoError(f"output file already exists: {err.filename}") from err
        except OSError as err:
            raise GatherinfoError(f"create output file: {err}") from err
    else:
        fd, name = tempfile.mkstemp(prefix="dracpu-gatherinfo-", suffix=".yaml")
        path = Path(name)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
    except OSError as err:
        path.unlink(missing_ok=True)
        raise GatherinfoError(f"write {path}: {err}") from err
    return path
