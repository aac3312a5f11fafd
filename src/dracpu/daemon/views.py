"""Read-only views of a running daemon, for the HTTP endpoints.

``/readyz`` reads the supervisor's readiness (``Readiness.view()``) and ``/debug/state``
reads a ``DaemonView``: both get an object they can only read, never the daemon's
callables, so what the endpoints show is whatever the services last reported, and
nothing an endpoint does can change the daemon.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dracpu.introspect import topology_document

if TYPE_CHECKING:
    from dracpu.daemon.app import Daemon

__all__ = ["DaemonView"]


class DaemonView:
    """What ``/debug/state`` shows of one daemon (also what `dracpu map` draws)."""

    __slots__ = ("_daemon",)

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    def readiness(self) -> dict[str, bool]:
        """Each readiness component and whether it is ready ({} before start-up)."""
        sup = self._daemon.supervisor
        return sup.readiness.components() if sup is not None else {}

    def debug_state(self) -> dict[str, Any]:
        """The JSON document of ``/debug/state``."""
        d = self._daemon
        doc: dict[str, Any] = {"node": d.node_name, "ready": self.readiness()}
        if d.topology is not None:
            topo = d.topology
            doc["topology"] = topology_document(topo)
            doc["summary"] = {
                "cpus": topo.num_cpus,
                "cores": topo.num_cores,
                "sockets": topo.num_sockets,
                "numaNodes": topo.num_numa_nodes,
                "l3Caches": topo.num_uncore_caches,
                "smt": topo.smt_enabled,
            }
        if d.state is not None:
            doc.update(d.state.describe())
            doc["keptShared"] = d.floor.cpus.format() if d.floor.kept else None
        if d.checkpoint is not None:
            doc["checkpoint"] = {
                "writes": d.checkpoint.writes,
                "lastError": d.checkpoint.last_error or None,
            }
        doc["claimStatus"] = d.claim_status.describe()
        if d.plugin is not None:
            doc["containers"] = [
                {
                    "id": i.container_id,
                    "podUID": i.pod_uid,
                    "name": i.name,
                    "cpus": i.cpus,
                    "cgroupsPath": i.cgroups_path,
                    **({"sandbox": True} if i.sandbox else {}),
                }
                for i in d.plugin.intents()
            ]
        if d.recovery is not None:
            doc["recovery"] = {"source": str(d.recovery.source), "notes": d.recovery.notes}
        if d.watcher is not None:
            doc["drift"] = d.watcher.state()
        if d.irq is not None:
            doc["irq"] = d.irq.describe()
        if d.slices is not None:
            doc["slices"] = d.slices.status()
        if d.session is not None:
            doc["nri"] = d.session.describe()
        if d.kubelet is not None:
            reg = d.kubelet.registration
            doc["registration"] = {"registered": reg.registered, "lastError": reg.last_error}
            doc["health"] = {"unhealthy": dict(d.kubelet.health.report().unhealthy)}
        if d.supervisor is not None:
            doc["services"] = d.supervisor.status()
        return doc
