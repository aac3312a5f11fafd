"""A simulated fleet: many nodes' ResourceSlice publishers against one API server.

N copies of the daemon's own ``k8s.slices.SliceReconciler``, each with its own node
name, machine shape (``tests/fake_sysfs``) and ``kubernetes`` client, run in one Trio
process against one loopback API server (``sim.apiserver``) that logs every request,
limits its rate (429 with Retry-After), drops every watch, restarts, and sees the whole
fleet roll out. What that costs the control plane is in docs/scale.md.

- ``report``: the figures and the arithmetic over the request log (pure);
- ``shapes``: machine shapes and the nodes' desired slices;
- ``node``: one simulated node (restartable);
- ``run``: the phases (``run_fleet``);
- ``cli``: ``main(argv)``, for ``python -m dracpu_sim.fleet`` and ``dracpu sim fleet``.
"""

from __future__ import annotations

from dracpu_sim.fleet.cli import build_parser, main
from dracpu_sim.fleet.report import FleetResult
from dracpu_sim.fleet.run import FleetOptions, run_fleet

__all__ = ["FleetOptions", "FleetResult", "build_parser", "main", "run_fleet"]
