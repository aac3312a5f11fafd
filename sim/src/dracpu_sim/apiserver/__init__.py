"""A loopback Kubernetes API server for the simulated node (protocols.md §4).

The pure core (``store``, ``selectors``, ``validation``, ``update_rules``, ``deployments``,
``patch``, ``strategic``, ``apply``, ``handler``, ``faults``, ``discovery``, ``openapi``)
holds objects and decides answers; every write (create, update, JSON / merge / strategic
merge patch, server-side apply) passes the same checks. ``http`` is the Trio + h11 shell
and ``server`` ties them into ``SimAPIServer``.
"""

from __future__ import annotations

from dracpu_sim.apiserver.errors import ApiError
from dracpu_sim.apiserver.faults import CallCounter, FaultInjector, RequestLog
from dracpu_sim.apiserver.server import (
    SimAPIServer,
    kubeconfig_document,
    main_apiserver,
    serve,
    write_kubeconfig,
)
from dracpu_sim.apiserver.store import ObjectStore

__all__ = [
    "ApiError",
    "CallCounter",
    "FaultInjector",
    "ObjectStore",
    "RequestLog",
    "SimAPIServer",
    "kubeconfig_document",
    "main_apiserver",
    "serve",
    "write_kubeconfig",
]
