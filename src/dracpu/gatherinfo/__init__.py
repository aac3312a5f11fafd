"""`dracpu gatherinfo`: a node-local support bundle (behavior.md §2.5).

The report is YAML: the discovered CPU details, the running driver's effective config, tool
versions and, beyond upstream, a `sysfs` section holding every sysfs file discovery reads,
keyed by absolute `/sys/...` path. That section is a valid sysfs overlay and can be turned
back into a tree (`materialize_sysfs`), so `--sysfs-root` reproduces the node's topology
anywhere. Also beyond upstream, `driverConfigSource` names the PID the config was read from,
or says that no daemon ran and `driverConfig` holds the defaults; and, when the API server
answers, `resourceSlices` holds the other drivers' ResourceSlices of this node (a GPU or NIC
driver's devices, with their `pcieRoot` and NUMA attributes) and `deviceClasses` the
cluster's DeviceClasses, so that `dracpu demo --sysfs-root <report>` replays the node with
every driver's devices (`apiObjectsSource` says where they came from, or why they are not
there).

Reaching the API server with the running driver's kubeconfig (its `--kubeconfig`, read
through `/proc/PID/root`): the files that kubeconfig names (certificate authority, client
certificate and key, token file) are the driver's too, so they are resolved the same way
(`driver_kubeconfig`); a credential plugin in it (`exec`, `auth-provider`) would run a
command found on gatherinfo's filesystem, not the driver's, so such a kubeconfig is not
used (pass `--kubeconfig`). The whole API step, credential plugins included, runs in a
child process in a session of its own, whose process group is killed when the step takes
longer than its deadline (`gather_api_objects_within`): a hung plugin or API server costs
the bundle its API objects, never the bundle.
"""

from dracpu.gatherinfo.api import (
    driver_kubeconfig,
    gather_api_objects,
    gather_api_objects_within,
    other_drivers_slices,
    read_bundle_objects,
    write_private_kubeconfig,
)
from dracpu.gatherinfo.report import (
    LAYOUT_VERSION,
    REPORT_CLASSES,
    REPORT_SLICES,
    ApiObjects,
    GatherinfoError,
    build_report,
    collect_sysfs,
    driver_processes,
    find_driver_process,
    materialize_sysfs,
    path_in_process,
    runs_daemon,
    write_report,
)

__all__ = [
    "LAYOUT_VERSION",
    "REPORT_CLASSES",
    "REPORT_SLICES",
    "ApiObjects",
    "GatherinfoError",
    "build_report",
    "collect_sysfs",
    "driver_kubeconfig",
    "driver_processes",
    "find_driver_process",
    "gather_api_objects",
    "gather_api_objects_within",
    "materialize_sysfs",
    "other_drivers_slices",
    "path_in_process",
    "read_bundle_objects",
    "runs_daemon",
    "write_private_kubeconfig",
    "write_report",
]
