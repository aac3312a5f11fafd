"""Raw cgroupfs cpuset access: path resolution, the fallback writer and the drift watcher.

The NRI runtime normally applies dracpu's cpusets; this package is what dracpu does itself
when the runtime cannot (``CgroupWriter.run_fallback``) and how it keeps the kernel's view
equal to its own (``DriftWatcher``).
"""

from dracpu.cgroupfs.drift import DriftReport
from dracpu.cgroupfs.paths import CgroupLayout, CgroupPathError, detect_layout, resolve
from dracpu.cgroupfs.watcher import DriftWatcher
from dracpu.cgroupfs.writer import (
    CgroupIntentError,
    CgroupWriteError,
    CgroupWriter,
    WriteOutcome,
)

__all__ = [
    "CgroupIntentError",
    "CgroupLayout",
    "CgroupPathError",
    "CgroupWriteError",
    "CgroupWriter",
    "DriftReport",
    "DriftWatcher",
    "WriteOutcome",
    "detect_layout",
    "resolve",
]
