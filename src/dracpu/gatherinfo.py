"""`dracpu gatherinfo`: a node-local support bundle (behavior.md §2.5).

The report is YAML: the discovered CPU details, the running driver's effective config, tool
versions and, beyond upstream, a `sysfs` section holding every sysfs file discovery reads,
keyed by absolute `/sys/...` path. That section is a valid sysfs overlay and can be turned
back into a tree (`materialize_sysfs`), so `--sysfs-root` reproduces the node's topology
anywhere. Also beyond upstream, `driverConfigSource` names the PID the config was read from,
or says that no daemon ran and `driverConfig` holds the defaults; and, when the API server
answers, `resourceSlices` holds the other drivers' ResourceSlices of this node (a GPU or NIC
driver's devices, with their `pcieRoot` and NUMA attributes) and `deviceClasses` the
cluster's DeviceClasses, so that `dracpu demo --sysfs-root <report>` replays the node with
every driver's devices (`apiObjectsSource` says where they came from, or why they are not
there).

Reaching the API server with the running driver's kubeconfig (its `--kubeconfig`, read
through `/proc/PID/root`): the files that kubeconfig names (certificate authority, client
certificate and key, token file) are the driver's too, so they are resolved the same way
(`driver_kubeconfig`); a credential plugin in it (`exec`, `auth-provider`) would run a
command found on gatherinfo's filesystem, not the driver's, so such a kubeconfig is not
used (pass `--kubeconfig`). The whole API step, credential plugins included, runs in a
child process in a session of its own, whose process group is killed when the step takes
longer than its deadline (`gather_api_objects_within`): a hung plugin or API server costs
the bundle its API objects, never the bundle.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import yaml

from dracpu import RESOURCE_API_VERSION, __version__
from dracpu.topology.model import NO_ID, Topology

__all__ = [
    "ApiObjects",
    "GatherinfoError",
    "build_report",
    "collect_sysfs",
    "driver_kubeconfig",
    "driver_processes",
    "find_driver_process",
    "gather_api_objects",
    "gather_api_objects_within",
    "materialize_sysfs",
    "other_drivers_slices",
    "read_bundle_objects",
    "runs_daemon",
    "write_private_kubeconfig",
    "write_report",
]

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


def read_bundle_objects(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A report's other drivers' ResourceSlices and the cluster's DeviceClasses, as
    gathered (``resourceSlices``, ``deviceClasses``); empty lists when the report has none
    (gathered without an API server, or by an older dracpu). ``path`` is read as
    ``sysfs_root`` reads a report; a section that is not a list of mappings is an error."""
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as err:
        raise GatherinfoError(f"read gatherinfo report {path}: {err}") from err
    report = docs[0] if len(docs) == 1 and isinstance(docs[0], dict) else {}
    out: list[list[dict[str, Any]]] = []
    for key in (REPORT_SLICES, REPORT_CLASSES):
        section = report.get(key) or []
        if not isinstance(section, list) or not all(isinstance(o, dict) for o in section):
            raise GatherinfoError(f"{path}: {key} must be a list of objects")
        out.append(section)
    return out[0], out[1]


@dataclass(frozen=True)
class ApiObjects:
    """What the report holds from the API server, and a line saying where it came from."""

    slices: list[dict[str, Any]]
    classes: list[dict[str, Any]]
    source: str


def _as_gathered(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object without the metadata its API server set (uid, resourceVersion, owner
    references to a Node of that cluster, managed fields, ...): what another API server
    accepts as a new object."""
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion", RESOURCE_API_VERSION),
        "kind": obj.get("kind"),
        "metadata": {k: meta[k] for k in ("name", "labels", "annotations") if meta.get(k)},
        "spec": obj.get("spec") or {},
    }


def other_drivers_slices(
    slices: Sequence[Mapping[str, Any]], node_name: str, driver: str
) -> list[dict[str, Any]]:
    """The slices of this node (``spec.nodeName``) that another driver than ``driver``
    published, by name, as gathered (``_as_gathered``). Slices for all nodes or chosen by
    a node selector are the cluster's, not this node's, and are left out."""
    out = [
        _as_gathered({"kind": "ResourceSlice", **s})
        for s in slices
        if (s.get("spec") or {}).get("nodeName") == node_name
        and (s.get("spec") or {}).get("driver") != driver
    ]
    return sorted(out, key=lambda s: str(s["metadata"].get("name", "")))


def gather_api_objects(
    api_client: Any, node_name: str, driver: str, *, timeout: float = 10.0
) -> ApiObjects:
    """Other drivers' ResourceSlices on ``node_name`` and every DeviceClass, read through
    ``api_client`` (a ``kubernetes`` ``ApiClient``). The slices are listed with the
    ``spec.nodeName`` field selector the API server offers for ResourceSlices. Raises
    GatherinfoError when listing the slices fails (unreachable, forbidden, ...); when only
    the DeviceClasses cannot be listed, the source says so."""
    from kubernetes import client as k8s_client

    from dracpu.k8s.client import translate_error

    api = k8s_client.ResourceV1Api(api_client)

    def listed(what: str, fn: Any, **kwargs: Any) -> list[dict[str, Any]]:
        try:
            response = fn(_preload_content=False, _request_timeout=timeout, **kwargs)
            body = json.loads(response.data)
        except Exception as exc:  # the client's errors vary by transport: translate them
            raise GatherinfoError(f"list {what}: {translate_error(exc)}") from None
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise GatherinfoError(f"list {what}: the API server's answer has no items list")
        return [i for i in items if isinstance(i, dict)]

    raw_slices = listed(
        "ResourceSlices", api.list_resource_slice, field_selector=f"spec.nodeName={node_name}"
    )
    slices = other_drivers_slices(raw_slices, node_name, driver)
    # The driver's own ServiceAccount may list ResourceSlices but not DeviceClasses
    # (deploy/base/rbac.yaml grants what the daemon needs): the slices still count.
    try:
        listed_classes = listed("DeviceClasses", api.list_device_class)
        classes_text = f", {len(listed_classes)} DeviceClass(es)"
    except GatherinfoError as err:
        listed_classes = []
        classes_text = f"; no DeviceClasses: {err}"
    classes = sorted(
        (_as_gathered({"kind": "DeviceClass", **c}) for c in listed_classes),
        key=lambda c: str(c["metadata"].get("name", "")),
    )
    drivers = sorted({str(s["spec"].get("driver")) for s in slices})
    source = (
        f"API server {api_client.configuration.host}: {len(slices)} ResourceSlice(s) of "
        f"other drivers on node {node_name}"
        + (f" ({', '.join(drivers)})" if drivers else "")
        + classes_text
    )
    return ApiObjects(slices=slices, classes=classes, source=source)


# Per kubeconfig section: the entry's body and the keys naming files (client-go's
# ResolvePaths list for clusters and users; the kubernetes Python client reads these).
_KUBECONFIG_FILES = (
    ("clusters", "cluster", ("certificate-authority",)),
    ("users", "user", ("client-certificate", "client-key", "tokenFile")),
)
# Ways a kubeconfig user gets credentials by running something.
_CREDENTIAL_PLUGINS = ("exec", "auth-provider")


def driver_kubeconfig(path: str, resolve: Callable[[str], str]) -> dict[str, Any]:
    """The running driver's kubeconfig, ``path`` as the driver names it, with every file
    it names resolved as the driver sees it (``resolve``, ``path_in_process``). A relative
    file is relative to the kubeconfig's own directory, as client-go and the Python client
    read it. Raises GatherinfoError when it cannot be read, is no kubeconfig, or a user gets
    credentials from a plugin (it would run here, on gatherinfo's filesystem)."""
    seen = resolve(path)
    try:
        config = yaml.safe_load(Path(seen).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        why = err.strerror if isinstance(err, OSError) else str(err)
        raise GatherinfoError(f"read the running driver's kubeconfig {path}: {why}") from None
    if not isinstance(config, dict):
        raise GatherinfoError(f"the running driver's kubeconfig {path} is not a kubeconfig")
    base = os.path.dirname(path)
    for section, body_key, file_keys in _KUBECONFIG_FILES:
        entries = config.get(section) or []
        for entry in entries if isinstance(entries, list) else ():
            body = entry.get(body_key) if isinstance(entry, dict) else None
            if not isinstance(body, dict):
                continue
            plugin = next((p for p in _CREDENTIAL_PLUGINS if p in body), None)
            if plugin is not None:
                raise GatherinfoError(
                    f"the running driver's kubeconfig {path} gets user "
                    f"{entry.get('name', '')!r}'s credentials from a plugin ({plugin}), "
                    "which would run here rather than in the driver's filesystem; pass "
                    "--kubeconfig"
                )
            for key in file_keys:
                value = body.get(key)
                if isinstance(value, str) and value:
                    body[key] = resolve(os.path.join(base, value))
    return config


def write_private_kubeconfig(config: Mapping[str, Any]) -> Path:
    """``config`` in a new temporary file only this user can read (it may hold keys or
    tokens inline); the caller removes it."""
    fd, name = tempfile.mkstemp(prefix="dracpu-gatherinfo-kubeconfig-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w") as out:
            yaml.safe_dump(dict(config), out)
    except OSError as err:
        os.unlink(name)
        raise GatherinfoError(f"write a temporary kubeconfig: {err}") from err
    return Path(name)


def _api_step_main() -> None:
    """The child process of ``gather_api_objects_within``: its request as JSON on stdin,
    its outcome as JSON on stdout (``{"ok": {...}}`` or ``{"error": "..."}``)."""
    from dracpu.k8s.client import K8sError, load_api_client

    request = json.load(sys.stdin)
    outcome: dict[str, Any]
    try:
        # No retries: a node without a reachable API server should not hold the report up.
        api_client = load_api_client(request["kubeconfig"], retries=0)
        try:
            found = gather_api_objects(
                api_client, request["node"], request["driver"], timeout=request["timeout"]
            )
        finally:
            api_client.close()  # type: ignore[no-untyped-call]
        outcome = {"ok": {"slices": found.slices, "classes": found.classes, "source": found.source}}
    except (GatherinfoError, K8sError) as err:
        outcome = {"error": str(err)}
    json.dump(outcome, sys.stdout)


def gather_api_objects_within(
    kubeconfig: str | None,
    node_name: str,
    driver: str,
    *,
    deadline: float,
    request_timeout: float = 10.0,
) -> ApiObjects:
    """``gather_api_objects`` through a client loaded from ``kubeconfig`` (None: in-cluster
    config), all of it, credential plugins included, in a child process of its own session
    (so of its own process group) given ``deadline`` seconds: past it the group is killed,
    plugins with it, and GatherinfoError says so, as it does for every failure of the step.
    A new interpreter rather than a fork: the caller may hold threads, and nothing of the
    caller's ``__main__`` is run again."""
    if not deadline > 0:
        raise GatherinfoError(f"the API step's time limit must be > 0 seconds, got {deadline}")
    request = {
        "kubeconfig": kubeconfig,
        "node": node_name,
        "driver": driver,
        "timeout": min(request_timeout, deadline),
    }
    argv = [sys.executable, "-c", "from dracpu.gatherinfo import _api_step_main; _api_step_main()"]
    try:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as err:
        raise GatherinfoError(f"start the API step: {err}") from err
    try:
        out, err_text = child.communicate(json.dumps(request).encode(), timeout=deadline)
    except subprocess.TimeoutExpired:
        raise GatherinfoError(
            f"the API step did not finish within {deadline:g} s (API server or credential "
            "plugin not answering); stopped it"
        ) from None
    finally:
        _stop(child)
    try:
        outcome = json.loads(out)
        if "ok" in outcome:
            found = outcome["ok"]
            return ApiObjects(
                slices=found["slices"], classes=found["classes"], source=found["source"]
            )
        message = str(outcome["error"])
    except (ValueError, KeyError, TypeError):
        last = err_text.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        message = f"the API step failed (exit code {child.returncode}): {last[0]}"
    raise GatherinfoError(message)


def _stop(child: subprocess.Popen[bytes]) -> None:
    """A child not reaped yet (the step ran out of time): kill its process group (the
    child, and what it started: a credential plugin) and reap it. The group's ID is the
    child's PID, which stays ours until the child is reaped, so no stranger is signalled.
    A plugin that left the group and keeps the pipes open is not waited for long."""
    if child.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.communicate(timeout=5)
    child.kill()
    child.wait()


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
