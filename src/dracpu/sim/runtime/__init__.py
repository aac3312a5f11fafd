"""A simulated container runtime speaking NRI over the real wire format, with a cgroup tree.

`RuntimeSimulator` plays containerd's NRI side for a plugin (dracpu's `NRISession` or any
other); `CgroupTree` holds the cgroup v1 cpuset files it writes as runc would.
"""

from dracpu.sim.runtime.cgroups import CgroupTree, CgroupTreeError
from dracpu.sim.runtime.simulator import (
    ContainerCreateError,
    RuntimeSimulator,
    SimContainer,
    SimPod,
    main_runtime,
)

__all__ = [
    "CgroupTree",
    "CgroupTreeError",
    "ContainerCreateError",
    "RuntimeSimulator",
    "SimContainer",
    "SimPod",
    "main_runtime",
]
