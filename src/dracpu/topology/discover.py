"""Build a ``Topology`` from sysfs, following behavior.md §4 step by step.

What is read, per online CPU N (paths under ``devices/system/cpu/cpuN``):
``topology/physical_package_id``, ``topology/cluster_id``, ``topology/core_id``, the ``node*``
entries of the CPU directory with ``devices/system/node/nodeX/cpulist``, and the first level-3
``cache/index*`` directory. Machine-wide: ``online``, ``smt/control`` and
``devices/cpu_atom/cpus`` (Intel hybrid). A CPU whose socket, core or NUMA node cannot be
determined is skipped (logged ``skipping CPU due to incomplete topology``) and stays only in
the online set.

Beyond upstream, ``topology/die_id`` fills ``CPUInfo.die`` (missing or unparsable -> 0) and
``CPUInfo.thread_siblings`` holds every kept CPU of the same (socket, cluster, core).

L3 follows upstream: a CPU without a level-3 cache entry has ``l3 = NO_ID``. The allocator
treats a socket whose CPUs carry no L3 id as a single uncore group, so machines (VMs, some
ARM servers) that do not report an L3 still get cache-aligned packing per socket.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from dracpu.cpuset import CPUSet, CPUSetParseError
from dracpu.topology.model import NO_ID, CoreType, CPUInfo, Topology
from dracpu.topology.pcie import cpus_not_local, discover_pcie_roots, pcie_supported
from dracpu.topology.sysfs import SysfsError, SysfsReader, TopologyError

__all__ = ["discover_from_root", "discover_topology"]

log = logging.getLogger(__name__)

_CPU = "devices/system/cpu"
_INT = re.compile(r"[+-]?[0-9]+")
# The kernel writes this for "no cluster" (BAD_APICID truncated to u16 on x86).
_NO_CLUSTER = 65535
_SMT_OFF = frozenset({"off", "forceoff", "notsupported", "notimplemented"})


class _Skip(Exception):
    """This CPU's topology is incomplete; the message says which file and why."""


def _parse_int(text: str) -> int | None:
    """Go ``strconv.Atoi`` of the trimmed text: optional sign, ASCII digits only."""
    text = text.strip()
    if text.isdigit() and text.isascii():  # the common case, without the regex
        return int(text)
    return int(text) if _INT.fullmatch(text) else None


def _parse_cpuset(text: str) -> CPUSet:
    return CPUSet.parse(text.strip())


# -- machine-wide files ---------------------------------------------------------------------


def read_online(reader: SysfsReader) -> CPUSet:
    rel = f"{_CPU}/online"
    try:
        text = reader.read_text(rel)
    except SysfsError as err:
        raise TopologyError(f"failed to get online CPUs: {err}") from err
    try:
        return _parse_cpuset(text)
    except CPUSetParseError as err:
        raise TopologyError(
            f"failed to get online CPUs: parse {reader.full_path(rel)}: {err}"
        ) from err


def read_kernel_cpu_list(reader: SysfsReader, name: str) -> CPUSet:
    """``isolated``, ``nohz_full`` or ``present``: the CPUs the kernel keeps away from its
    scheduler's load balancing (``isolcpus=``), from its tick (``nohz_full=``), or that
    exist at all (online or not). A missing file, an empty one and ``(null)`` (nohz_full on
    a kernel booted without it) mean none.
    Raises ``TopologyError`` naming the file when the list cannot be parsed."""
    rel = f"{_CPU}/{name}"
    if not reader.exists(rel):
        return CPUSet()
    try:
        text = reader.read_text(rel).strip()
    except SysfsError as err:
        raise TopologyError(f"failed to read {name} CPUs: {err}") from err
    if not text or text == "(null)":
        return CPUSet()
    try:
        return CPUSet.parse(text)
    except CPUSetParseError as err:
        raise TopologyError(
            f"failed to read {name} CPUs: parse {reader.full_path(rel)}: {err}"
        ) from err


def read_e_cores(reader: SysfsReader) -> CPUSet | None:
    """E-core CPUs on an Intel hybrid machine, None when the machine is not hybrid."""
    rel = "devices/cpu_atom/cpus"
    try:
        first = reader.read_first_line(rel)
    except SysfsError:
        return None
    try:
        return _parse_cpuset(first)
    except CPUSetParseError as err:
        raise TopologyError(
            f"failed to get E-core CPUs: parse {reader.full_path(rel)}: {err}"
        ) from err


def read_smt_control(reader: SysfsReader) -> bool | None:
    """True/False from ``smt/control``; None means "fall back to counting threads"."""
    try:
        value = reader.read_text(f"{_CPU}/smt/control").strip().lower()
    except SysfsError:
        return None
    if value == "on":
        return True
    if value in _SMT_OFF:
        return False
    return None


# -- one CPU --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _RawCPU:
    """What sysfs says about one CPU, before siblings are known."""

    cpu: int
    socket: int
    core: int
    numa: int
    die: int
    cluster: int
    numa_cpus: CPUSet
    l3: int


class _CPUReader:
    """Reads one CPU at a time.

    NUMA cpulists and L3 ``shared_cpu_list`` texts repeat for every CPU of a node or cache;
    their parses are cached, which is safe because sysfs does not change during discovery.
    """

    def __init__(self, reader: SysfsReader) -> None:
        self.reader = reader
        self._node_cpus: dict[int, CPUSet | None] = {}
        self._cpusets: dict[str, CPUSet] = {}

    def _int(self, rel: str) -> int:
        try:
            text = self.reader.read_text(rel)
        except SysfsError as err:
            raise _Skip(str(err)) from err
        value = _parse_int(text)
        if value is None:
            raise _Skip(f"parse {self.reader.full_path(rel)}: not an integer: {text.strip()!r}")
        return value

    def _optional_int(self, rel: str) -> int | None:
        try:
            return _parse_int(self.reader.read_text(rel))
        except SysfsError:
            return None

    def _cpuset(self, text: str) -> CPUSet:
        cpus = self._cpusets.get(text)
        if cpus is None:
            cpus = self._cpusets[text] = _parse_cpuset(text)
        return cpus

    def _node_cpulist(self, node: int) -> CPUSet | None:
        if node not in self._node_cpus:
            rel = f"devices/system/node/node{node}/cpulist"
            try:
                self._node_cpus[node] = _parse_cpuset(self.reader.read_first_line(rel))
            except (SysfsError, CPUSetParseError):
                self._node_cpus[node] = None
        return self._node_cpus[node]

    def _numa(self, cpu_dir: str) -> tuple[int, CPUSet]:
        try:
            names = self.reader.listdir(cpu_dir)
        except SysfsError as err:
            raise _Skip(str(err)) from err
        numa, numa_cpus = NO_ID, CPUSet()
        found = False
        for name in names:
            if not name.startswith("node"):
                continue
            # Atoi semantics: a sign is allowed, surrounding blanks are not.
            suffix = name[4:]
            node = _parse_int(suffix) if suffix.strip() == suffix else None
            if node is None:
                continue
            found, numa = True, node
            cpus = self._node_cpulist(node)
            if cpus is not None:
                numa_cpus = cpus
                break
        if not found:
            raise _Skip(f"no node* entry in {self.reader.full_path(cpu_dir)}")
        return numa, numa_cpus

    def _l3(self, cpu: int, cpu_dir: str) -> int:
        rel = cpu_dir + "/cache"
        read_text = self.reader.read_text
        try:
            names = self.reader.listdir(rel)
        except SysfsError as err:
            raise _Skip(str(err)) from err
        for name in names:
            if not name.startswith("index"):
                continue
            index = rel + "/" + name
            # An index* entry that is not a directory fails this read and is ignored, as the
            # spec's "directories only" rule wants, without a stat per entry.
            try:
                level = read_text(index + "/level").strip()
            except SysfsError:
                continue
            if level != "3":
                continue
            shared_rel = index + "/shared_cpu_list"
            try:
                shared = self._cpuset(read_text(shared_rel))
            except SysfsError as err:
                raise _Skip(str(err)) from err
            except CPUSetParseError as err:
                raise _Skip(f"parse {self.reader.full_path(shared_rel)}: {err}") from err
            id_rel = index + "/id"
            try:
                id_text = read_text(id_rel)
            except SysfsError:
                # No cache id (common on ARM): name the cache by its lowest CPU.
                return shared.min() if shared else cpu
            l3 = _parse_int(id_text)
            if l3 is None:
                raise _Skip(
                    f"parse {self.reader.full_path(id_rel)}: not an integer: {id_text.strip()!r}"
                )
            return l3
        return NO_ID

    def read(self, cpu: int) -> _RawCPU:
        cpu_dir = f"{_CPU}/cpu{cpu}"
        topo = cpu_dir + "/topology"
        socket = self._int(topo + "/physical_package_id")
        cluster = self._optional_int(topo + "/cluster_id")
        if cluster is None or cluster == _NO_CLUSTER:
            cluster = NO_ID
        core = self._int(topo + "/core_id")
        numa, numa_cpus = self._numa(cpu_dir)
        if socket < 0 or core < 0 or numa < 0:
            raise _Skip(f"negative id: socket={socket} core={core} numa={numa}")
        l3 = self._l3(cpu, cpu_dir)
        die = self._optional_int(topo + "/die_id")
        return _RawCPU(cpu, socket, core, numa, 0 if die is None else die, cluster, numa_cpus, l3)


# -- the machine ----------------------------------------------------------------------------


def _core_type(cpu: int, e_cores: CPUSet | None) -> CoreType:
    if e_cores is None:
        return CoreType.STANDARD
    return CoreType.E_CORE if cpu in e_cores else CoreType.P_CORE


def _build(raws: list[_RawCPU], e_cores: CPUSet | None) -> dict[int, CPUInfo]:
    """CPUInfo per kept CPU, with ``sibling`` (2-CPU cores only, as upstream) and
    ``thread_siblings`` (every CPU of the core)."""
    groups: dict[tuple[int, int, int], int] = {}
    for raw in raws:
        key = (raw.socket, raw.cluster, raw.core)
        groups[key] = groups.get(key, 0) | 1 << raw.cpu
    threads = {mask: CPUSet.from_mask(mask) for mask in groups.values()}
    result: dict[int, CPUInfo] = {}
    for raw in raws:
        mask = groups[(raw.socket, raw.cluster, raw.core)]
        sibling = NO_ID
        if mask.bit_count() == 2:
            sibling = (mask & ~(1 << raw.cpu)).bit_length() - 1
        result[raw.cpu] = CPUInfo(
            cpu=raw.cpu,
            socket=raw.socket,
            core=raw.core,
            numa=raw.numa,
            die=raw.die,
            cluster=raw.cluster,
            numa_cpus=raw.numa_cpus,
            l3=raw.l3,
            core_type=_core_type(raw.cpu, e_cores),
            sibling=sibling,
            thread_siblings=threads[mask],
        )
    return result


def discover_topology(
    reader: SysfsReader,
    *,
    expose_pcie_roots: bool = False,
    pcie_scan_supported: bool | None = None,
) -> Topology:
    """Discover the topology behind ``reader``.

    ``pcie_scan_supported`` overrides the amd64-only rule of §5 (None: ask the platform).
    Raises ``TopologyError`` (the online list, the hybrid list, or the PCIe scan failed).
    """
    online = read_online(reader)
    e_cores = read_e_cores(reader)
    cpu_reader = _CPUReader(reader)
    kept: list[_RawCPU] = []
    for cpu in online:
        try:
            kept.append(cpu_reader.read(cpu))
        except _Skip as why:
            log.info(
                "skipping CPU due to incomplete topology cpu=%d reason=%s",
                cpu,
                why,
                extra={"cpu": cpu, "reason": str(why)},
            )
    cpus = _build(kept, e_cores)
    smt = read_smt_control(reader)
    if smt is None:
        smt = len(cpus) > len({info.core_key for info in cpus.values()})
    roots: dict[str, CPUSet] = {}
    supported = pcie_supported() if pcie_scan_supported is None else pcie_scan_supported
    if expose_pcie_roots and supported:
        roots = discover_pcie_roots(reader)
        if not roots:
            log.info("no PCIe domains detected")
        elif stray := cpus_not_local(roots, online):
            log.info("detected cpus not local to any detected PCIe Root cpus=%s", stray)
    elif expose_pcie_roots:
        log.info("no PCIe domains detected (PCIe root discovery is only implemented on amd64)")
    kept_cpus = CPUSet(cpus)
    return Topology(
        cpus=cpus,
        online=online,
        smt_enabled=smt,
        pcie_roots=roots,
        isolated=read_kernel_cpu_list(reader, "isolated") & kept_cpus,
        nohz_full=read_kernel_cpu_list(reader, "nohz_full") & kept_cpus,
        present=read_kernel_cpu_list(reader, "present") | online,
    )


def discover_from_root(
    root: str | Path,
    *,
    overlay: str | Path | None = None,
    expose_pcie_roots: bool = False,
    pcie_scan_supported: bool | None = None,
) -> Topology:
    """Discover from a sysfs tree at ``root`` with an optional overlay YAML file."""
    reader = SysfsReader.with_overlay_file(root, overlay)
    return discover_topology(
        reader, expose_pcie_roots=expose_pcie_roots, pcie_scan_supported=pcie_scan_supported
    )
