"""A simulated container runtime speaking NRI over the real wire format, with a cgroup tree.

`RuntimeSimulator` plays containerd's NRI side for a plugin (dracpu's `NRISession` or any
other); `CgroupTree` holds the cpuset files (cgroup v1 or v2) it writes as runc would;
`layout` names the pod, sandbox and container cgroups for the cgroupfs and systemd drivers.
"""

from dracpu_sim.runtime.cgroups import CgroupTree, CgroupTreeError
from dracpu_sim.runtime.layout import (
    CGROUP_DRIVERS,
    CGROUP_VERSIONS,
    QOS_CLASSES,
    CgroupLayoutError,
    container_cgroups_path,
    pod_cgroup_parent,
)
from dracpu_sim.runtime.simulator import (
    ContainerCreateError,
    PodSandboxError,
    RuntimeSimulator,
    SimContainer,
    SimPod,
    main_runtime,
)

__all__ = [
    "CGROUP_DRIVERS",
    "CGROUP_VERSIONS",
    "QOS_CLASSES",
    "CgroupLayoutError",
    "CgroupTree",
    "CgroupTreeError",
    "ContainerCreateError",
    "PodSandboxError",
    "RuntimeSimulator",
    "SimContainer",
    "SimPod",
    "container_cgroups_path",
    "main_runtime",
    "pod_cgroup_parent",
]
