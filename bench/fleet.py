"""A small simulated fleet (docs/scale.md has the large ones): 200 grouped 768-CPU nodes
against one loopback API server, through the daemon's own slice reconciler.

- ``idle_requests_per_node_hour``: what a node costs the API server at rest (watch
  renewals only; the resync answers from the watch's cache);
- ``topology_change_p99_ms``: a node losing a CPU until its slices are written;
- ``restart_converged_s`` / ``restart_max_node_requests``: after an API server restart,
  until every node's pool is right and watched again, and the most any node sent;
- ``rollout_peak_rps``: every node restarting over 2 s.

``dracpu sim fleet --nodes 1000 --duration 60`` is the full run.
"""

from __future__ import annotations

import logging

import trio

from dracpu_sim.fleet import FleetOptions, run_fleet

NODES = 200


def main() -> None:
    logging.disable(logging.WARNING)
    opts = FleetOptions(
        nodes=NODES,
        duration=10.0,
        resync_interval=5.0,
        reconnect_spread=2.0,
        restart_downtime=2.0,
    )
    r = trio.run(run_fleet, opts)
    assert r.restart is not None and r.rollout is not None
    print(f"nodes: {NODES}")
    print(f"startup_s: {r.startup_s:.1f} s")
    print(f"idle_requests_per_node_hour: {r.requests_per_node_hour_idle:.2f} requests/h")
    print(f"idle_lists_per_node_hour: {r.idle_per_node_hour['list']:.2f} requests/h")
    print(f"topology_change_p99_ms: {r.topology_change_p99_s * 1000:.1f} ms")
    print(f"restart_converged_s: {r.restart_converged_s:.1f} s")
    print(f"restart_max_node_requests: {r.restart.max_per_agent} requests")
    print(f"rollout_peak_rps: {r.rollout.peak_rps:.0f} requests/s")
    print(f"wall_s: {r.wall_s:.1f} s")


if __name__ == "__main__":
    main()
