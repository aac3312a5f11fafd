"""Write the sysfs trees under tests/fake_sysfs/ (one per machine shape).

Each tree's root is a sysfs root: ``tests/fake_sysfs/<name>/devices/system/cpu/online``.
Files are laid out as Linux does: ``cpuN/topology/*``, ``cpuN/cache/indexK/*``,
``cpuN/nodeX`` (a symlink to ``../../node/nodeX``, as on a real kernel), offline CPUs with
``online`` = 0 and no ``topology``/``cache``, ``devices/system/node/nodeX/cpulist``,
``devices/cpu_atom/cpus`` on hybrid parts, and ``pci_bus/*/cpulistaffinity`` per PCIe root.

Run from the repo root: ``.venv/bin/python tools/gen_fake_sysfs.py [NAME ...]`` (all by
default). The tree is rewritten from scratch; the checked-in output is what tests read.
``--check`` (``make fixtures-check``) writes every tree into a temp dir instead and exits 1
if the checked-in trees differ from it in any file, symlink or directory. The machine
shapes are described in ``tests/fake_sysfs/README.md``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from dracpu.cpuset import CPUSet  # noqa: E402

OUT = REPO / "tests" / "fake_sysfs"
NO_CLUSTER = 65535


@dataclass(frozen=True)
class Cpu:
    """One present CPU. ``None`` for a field means the kernel does not write that file."""

    cpu: int
    socket: int
    core: int
    node: int
    die: int | None = 0
    cluster: int | None = NO_CLUSTER
    l1: int = 0  # L1 cache id (per core)
    l2: int = 0  # L2 cache id (per core, or per cluster of E-cores)
    l3: int | None = 0  # None: no level-3 cache reported


@dataclass
class Machine:
    name: str
    cpus: list[Cpu]
    online: CPUSet
    smt_control: str | None = "on"
    e_cores: CPUSet | None = None
    cache_ids: bool = True  # ARM firmware often gives caches no id
    pcie: dict[str, CPUSet] = field(default_factory=dict)
    # Kernel boot parameters isolcpus= and nohz_full= (None: the files are not written).
    isolated: CPUSet | None = None
    nohz_full: CPUSet | None = None

    @property
    def present(self) -> CPUSet:
        return CPUSet(c.cpu for c in self.cpus)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _cache_files(m: Machine, c: Cpu, online: list[Cpu]) -> Iterable[tuple[str, str]]:
    """(relative file, content) for the cache directory of one online CPU."""
    levels: list[tuple[int, str, int, Callable[[Cpu], int | None]]] = [
        (1, "Data", c.l1, lambda o: o.l1),
        (1, "Instruction", c.l1, lambda o: o.l1),
        (2, "Unified", c.l2, lambda o: o.l2),
    ]
    if c.l3 is not None:
        levels.append((3, "Unified", c.l3, lambda o: o.l3))
    for index, (level, kind, cache_id, key) in enumerate(levels):
        shared = CPUSet(o.cpu for o in online if key(o) == cache_id)
        base = f"index{index}"
        yield f"{base}/level", f"{level}\n"
        yield f"{base}/type", f"{kind}\n"
        yield f"{base}/shared_cpu_list", f"{shared}\n"
        if m.cache_ids:
            yield f"{base}/id", f"{cache_id}\n"


def write_machine(m: Machine, out: Path) -> None:
    root = out / m.name
    if root.exists():
        shutil.rmtree(root)
    cpu_dir = root / "devices/system/cpu"
    online = [c for c in m.cpus if c.cpu in m.online]
    _write(cpu_dir / "online", f"{m.online}\n")
    _write(cpu_dir / "possible", f"{m.present}\n")
    _write(cpu_dir / "present", f"{m.present}\n")
    if m.smt_control is not None:
        _write(cpu_dir / "smt/control", f"{m.smt_control}\n")
    if m.isolated is not None:
        _write(cpu_dir / "isolated", f"{m.isolated}\n")
    if m.nohz_full is not None:
        _write(cpu_dir / "nohz_full", f"{m.nohz_full}\n")
    if m.e_cores is not None:
        _write(root / "devices/cpu_atom/cpus", f"{m.e_cores}\n")
    nodes = sorted({c.node for c in m.cpus})
    for node in nodes:
        cpus = CPUSet(c.cpu for c in online if c.node == node)
        _write(root / f"devices/system/node/node{node}/cpulist", f"{cpus}\n")
    for c in m.cpus:
        d = cpu_dir / f"cpu{c.cpu}"
        d.mkdir(parents=True)
        os.symlink(f"../../node/node{c.node}", d / f"node{c.node}")
        if c.cpu != 0:  # the boot CPU cannot be taken offline, so it has no "online" file
            _write(d / "online", "1\n" if c.cpu in m.online else "0\n")
        if c.cpu not in m.online:
            continue
        t = d / "topology"
        _write(t / "physical_package_id", f"{c.socket}\n")
        _write(t / "core_id", f"{c.core}\n")
        if c.die is not None:
            _write(t / "die_id", f"{c.die}\n")
        if c.cluster is not None:
            _write(t / "cluster_id", f"{c.cluster}\n")
        for rel, text in _cache_files(m, c, online):
            _write(d / "cache" / rel, text)
    for name, cpus in m.pcie.items():
        bus = name.removeprefix("pci")
        _write(root / f"devices/{name}/pci_bus/{bus}/cpulistaffinity", f"{cpus}\n")


# -- machine shapes -------------------------------------------------------------------------


def _cpuset(text: str) -> CPUSet:
    return CPUSet.parse(text)


def xeon(name: str, *, snc: bool) -> Machine:
    """Dual Xeon Gold 6230: 20 cores/socket, HT; CPU i and i+40 share a core."""
    cpus = []
    for c in range(80):
        g = c % 40
        socket, core = divmod(g, 20)
        node = socket * 2 + core // 10 if snc else socket
        l2 = socket * 32 + core  # x86 cluster_id is the L2 id: one per core here
        cpus.append(Cpu(c, socket, core, node, cluster=l2, l1=l2, l2=l2, l3=socket))
    if snc:
        pcie = {
            "pci0000:00": _cpuset("0-9,40-49"),
            "pci0000:17": _cpuset("0-9,40-49"),
            "pci0000:3a": _cpuset("10-19,50-59"),
            "pci0000:5d": _cpuset("10-19,50-59"),
            "pci0000:80": _cpuset("20-29,60-69"),
            "pci0000:85": _cpuset("20-29,60-69"),
            "pci0000:ae": _cpuset("30-39,70-79"),
            "pci0000:d7": _cpuset("30-39,70-79"),
        }
    else:
        s0, s1 = _cpuset("0-19,40-59"), _cpuset("20-39,60-79")
        pcie = {f"pci0000:{b}": s0 for b in ("00", "17", "3a", "5d")}
        pcie |= {f"pci0000:{b}": s1 for b in ("80", "85", "ae", "d7")}
    return Machine(name, cpus, CPUSet.range(0, 79), pcie=pcie)


def epyc_7763(name: str, *, nps: int) -> Machine:
    """EPYC 7763: 64 cores in 8 CCX of 8 (one L3 each), SMT siblings i and i+64."""
    cpus = []
    for c in range(128):
        core = c % 64
        node = core // (64 // nps)
        cpus.append(Cpu(c, 0, core, node, l1=core, l2=core, l3=core // 8))
    buses = ["00", "20", "40", "60", "80", "a0", "c0", "e0"]
    pcie = {}
    for j, bus in enumerate(buses):
        node = j * nps // len(buses)
        local = CPUSet(c.cpu for c in cpus if c.node == node)
        pcie[f"pci0000:{bus}"] = local
    return Machine(name, cpus, CPUSet.range(0, 127), pcie=pcie)


def epyc_2s_768() -> Machine:
    """2 x 192-core EPYC (Zen 5c): 12 L3 of 16 cores per socket, SMT siblings i and i+384."""
    cpus = []
    for c in range(768):
        g = c % 384
        socket, core = divmod(g, 192)
        cpus.append(Cpu(c, socket, core, socket, l1=g, l2=g, l3=socket * 12 + core // 16))
    pcie = {}
    for j in range(16):
        socket = j // 8
        pcie[f"pci0000:{j * 16:02x}"] = CPUSet(c.cpu for c in cpus if c.socket == socket)
    return Machine("epyc-2s-768", cpus, CPUSet.range(0, 767), pcie=pcie)


def intel_hybrid() -> Machine:
    """Core i9-12900K: 8 HT P-cores (CPUs 0-15), 8 E-cores (16-23) in 2 clusters of 4."""
    cpus = []
    for c in range(16):
        k = c // 2
        cpus.append(Cpu(c, 0, 4 * k, 0, cluster=8 * k, l1=k, l2=k))
    for c in range(16, 24):
        j = c - 16
        cpus.append(Cpu(c, 0, 32 + j, 0, cluster=64 + 8 * (j // 4), l1=8 + j, l2=8 + j // 4))
    return Machine(
        "intel-hybrid",
        cpus,
        CPUSet.range(0, 23),
        e_cores=CPUSet.range(16, 23),
        pcie={"pci0000:00": CPUSet.range(0, 23)},
    )


def arm_server() -> Machine:
    """64-core ARM server: no SMT, clusters of 4, one L3 whose cache files carry no id."""
    cpus = [Cpu(c, 0, c, 0, die=None, cluster=c // 4, l1=c, l2=c, l3=0) for c in range(64)]
    return Machine(
        "arm-server",
        cpus,
        CPUSet.range(0, 63),
        smt_control="notsupported",
        cache_ids=False,
        pcie={"pci0000:00": CPUSet.range(0, 63), "pci0001:00": CPUSet.range(0, 63)},
    )


def vm_1cpu() -> Machine:
    """A 1-vCPU VM on an old kernel: no smt/ directory and no L3 reported."""
    cpus = [Cpu(0, 0, 0, 0, cluster=0, l3=None)]
    return Machine("vm-1cpu", cpus, CPUSet([0]), smt_control=None, pcie={"pci0000:00": CPUSet([0])})


def offline_holes() -> Machine:
    """8 HT cores (CPU c and c+8), CPUs 6,7,12,13,15 offline: online 0-5,8-11,14."""
    online = _cpuset("0-5,8-11,14")
    cpus = [Cpu(c, 0, c % 8, 0, cluster=c % 8, l1=c % 8, l2=c % 8, l3=0) for c in range(16)]
    return Machine("offline-holes", cpus, online, pcie={"pci0000:00": online})


def isolated_rt() -> Machine:
    """A low-latency node: 8 HT cores (CPU c and c+8), booted with isolcpus=2-7,10-15 and
    nohz_full=4-7,12-15; the kernel keeps 0-1,8-9 for housekeeping."""
    cpus = [Cpu(c, 0, c % 8, 0, cluster=c % 8, l1=c % 8, l2=c % 8, l3=0) for c in range(16)]
    everything = _cpuset("0-15")
    return Machine(
        "isolated-rt",
        cpus,
        everything,
        pcie={"pci0000:00": everything},
        isolated=_cpuset("2-7,10-15"),
        nohz_full=_cpuset("4-7,12-15"),
    )


MACHINES: dict[str, Callable[[], Machine]] = {
    "xeon-2s-ht": lambda: xeon("xeon-2s-ht", snc=False),
    "xeon-snc": lambda: xeon("xeon-snc", snc=True),
    "epyc-nps1": lambda: epyc_7763("epyc-nps1", nps=1),
    "epyc-nps4": lambda: epyc_7763("epyc-nps4", nps=4),
    "epyc-2s-768": epyc_2s_768,
    "intel-hybrid": intel_hybrid,
    "arm-server": arm_server,
    "vm-1cpu": vm_1cpu,
    "offline-holes": offline_holes,
    "isolated-rt": isolated_rt,
}


# -- drift check ----------------------------------------------------------------------------

# Files in the fixtures directory that no machine writes.
NOT_GENERATED = {"README.md"}


def _entries(root: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every path below ``root`` (relative) -> ("dir", "") | ("link", target) | ("file", data)."""
    found: dict[str, tuple[str, bytes | str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in dirnames + filenames:
            path = here / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                found[rel] = ("dir", "")
            else:
                found[rel] = ("file", path.read_bytes())
    return found


def _scratch_dir() -> str | None:
    """Where to write the fresh trees: /dev/shm when it has room (some 30,000 small files
    write several times faster to memory than to a busy disk), else the default temp dir."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    room = st.f_bavail * st.f_frsize >= 512 << 20 and st.f_favail >= 100_000
    return "/dev/shm" if room and os.access("/dev/shm", os.W_OK) else None


def check(names: list[str], out: Path) -> list[str]:
    """What differs between the trees under ``out`` and a fresh generation; empty if none."""
    problems: list[str] = []
    if names == list(MACHINES):
        for extra in sorted(p.name for p in out.iterdir()):
            if extra not in MACHINES and extra not in NOT_GENERATED:
                problems.append(f"{extra}: not a machine of this tool")
    with tempfile.TemporaryDirectory(prefix="fake-sysfs-", dir=_scratch_dir()) as tmp:
        for name in names:
            write_machine(MACHINES[name](), Path(tmp))
            fresh, committed = _entries(Path(tmp, name)), _entries(out / name)
            for rel in sorted(fresh.keys() | committed.keys()):
                where = f"{name}/{rel}"
                if rel not in committed:
                    problems.append(f"{where}: missing")
                elif rel not in fresh:
                    problems.append(f"{where}: not written by the tool")
                elif fresh[rel] != committed[rel]:
                    problems.append(f"{where}: {_difference(committed[rel], fresh[rel])}")
    return problems


def _difference(committed: tuple[str, bytes | str], fresh: tuple[str, bytes | str]) -> str:
    (kind, old), (fresh_kind, new) = committed, fresh
    if kind != fresh_kind:
        return f"is a {kind}, the tool writes a {fresh_kind}"
    if kind == "link":
        return f"links to {old!s}, the tool's links to {new!s}"
    return f"holds {_short(old)}, the tool writes {_short(new)}"


def _short(data: bytes | str) -> str:
    text = repr(data)
    return text if len(text) <= 40 else text[:37] + "..."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", help=f"fixtures to write (default: all of {', '.join(MACHINES)})"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="output directory")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write into a temp dir and exit 1 if the trees under --out differ from it",
    )
    args = parser.parse_args(argv)
    names = args.names or list(MACHINES)
    unknown = [n for n in names if n not in MACHINES]
    if unknown:
        parser.error(f"unknown fixture(s): {', '.join(unknown)}")
    if args.check:
        problems = check(names, args.out)
        if problems:
            print(
                f"gen_fake_sysfs: {len(problems)} path(s) drift from a fresh generation;"
                " run `.venv/bin/python tools/gen_fake_sysfs.py` and commit the result:",
                file=sys.stderr,
            )
            for line in problems[:50]:
                print(f"  {line}", file=sys.stderr)
            if len(problems) > 50:
                print(f"  ... and {len(problems) - 50} more", file=sys.stderr)
            return 1
        print(f"gen_fake_sysfs: {len(names)} sysfs trees up to date")
        return 0
    for name in names:
        write_machine(MACHINES[name](), args.out)
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
