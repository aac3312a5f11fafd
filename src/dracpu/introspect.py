"""Renderings of a discovered topology for `dracpu introspect topology` (JSON and console)."""

from __future__ import annotations

import json
from typing import Any

from dracpu.cpuset import CPUSet
from dracpu.topology.model import NO_ID, CoreType, Topology

__all__ = ["topology_document", "topology_json", "topology_text"]


def topology_document(topo: Topology) -> dict[str, Any]:
    """The stable JSON shape: cpus sorted by id, the SMT flag, PCIe roots → local CPUs."""
    cpus = [
        {
            "cpu": info.cpu,
            "core": info.core,
            "socket": info.socket,
            "die": info.die,
            "cluster": info.cluster,
            "numa": info.numa,
            "l3": info.l3,
            "coreType": str(info.core_type),
            "siblings": info.thread_siblings.format(),
        }
        for _, info in sorted(topo.cpus.items())
    ]
    return {
        "cpus": cpus,
        "smtEnabled": topo.smt_enabled,
        "pcieRoots": {name: local.format() for name, local in sorted(topo.pcie_roots.items())},
        "isolated": topo.isolated.format(),
        "nohzFull": topo.nohz_full.format(),
    }


def topology_json(topo: Topology) -> str:
    return json.dumps(topology_document(topo), indent=2) + "\n"


def _label(kind: str, ident: int) -> str:
    return f"{kind} ?" if ident == NO_ID else f"{kind} {ident}"


def topology_text(topo: Topology) -> str:
    """A console map, sockets → NUMA nodes → L3 groups → cores → CPUs (like `lstopo`)."""
    lines = [
        f"Machine: {topo.num_cpus} CPUs ({topo.online.format() or '-'} online), "
        f"{topo.num_cores} cores, {topo.num_sockets} sockets, {topo.num_numa_nodes} NUMA nodes, "
        f"{topo.num_uncore_caches} L3 caches, SMT {'on' if topo.smt_enabled else 'off'}"
    ]
    if topo.isolated:
        lines.append(f"  isolated (isolcpus=, never in the shared pool): {topo.isolated.format()}")
    if topo.nohz_full:
        lines.append(f"  nohz_full (no scheduler tick): {topo.nohz_full.format()}")
    skipped = topo.online - topo.all_cpus
    if skipped:
        lines.append(f"  online but skipped (incomplete topology): {skipped.format()}")
    infos = sorted(topo.cpus.values(), key=lambda i: i.cpu)
    for socket in sorted({i.socket for i in infos}):
        in_socket = [i for i in infos if i.socket == socket]
        lines.append(f"  Socket {socket} ({CPUSet(i.cpu for i in in_socket).format()})")
        for numa in sorted({i.numa for i in in_socket}):
            in_numa = [i for i in in_socket if i.numa == numa]
            lines.append(f"    NUMA node {numa} ({CPUSet(i.cpu for i in in_numa).format()})")
            for l3 in sorted({i.l3 for i in in_numa}):
                in_l3 = [i for i in in_numa if i.l3 == l3]
                lines.append(f"      {_label('L3', l3)} ({CPUSet(i.cpu for i in in_l3).format()})")
                cores: dict[tuple[int, int, int], list[int]] = {}
                for i in in_l3:
                    cores.setdefault(i.core_key, []).append(i.cpu)
                for key, members in sorted(cores.items(), key=lambda kv: min(kv[1])):
                    info = topo.cpus[members[0]]
                    kind = "" if info.core_type is CoreType.STANDARD else f" [{info.core_type}]"
                    cluster = "" if key[1] == NO_ID else f" cluster {key[1]}"
                    cpus = " ".join(f"CPU {c}" for c in sorted(members))
                    lines.append(f"        Core {key[2]}{cluster}{kind}: {cpus}")
    if topo.pcie_roots:
        lines.append("  PCIe roots:")
        for name, local in sorted(topo.pcie_roots.items()):
            lines.append(f"    {name}: {local.format()}")
    return "\n".join(lines) + "\n"
