"""The node daemon (`dracpu run`): services, their start order, and the node's state.

``lean_kubernetes_import`` is for the daemon's own process only (``dracpu.cli.run.start_daemon``
calls it before anything imports ``kubernetes``); importing this package does nothing else.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["lean_kubernetes_import"]


def lean_kubernetes_import() -> bool:
    """Let ``kubernetes.client`` and ``kubernetes.config`` be imported without running the
    ``kubernetes`` package's ``__init__``.

    That ``__init__`` eagerly imports ``dynamic`` (which pulls in ``kubernetes_validate``
    and ``jsonschema`` when they are installed), ``stream`` (``websocket``), ``utils``,
    ``leaderelection`` and ``informer``, none of which the daemon uses: about 3 MB of
    resident memory and 60 ms of start-up. The package is registered as an empty module
    with its real search path, so every submodule still imports as usual (on demand) and
    the client code the daemon runs is unchanged. Returns False, doing nothing, when
    ``kubernetes`` is already imported or not installed.
    """
    if "kubernetes" in sys.modules:
        return False
    spec = importlib.util.find_spec("kubernetes")
    if spec is None or not spec.submodule_search_locations:
        return False
    sys.modules["kubernetes"] = importlib.util.module_from_spec(spec)
    return True
