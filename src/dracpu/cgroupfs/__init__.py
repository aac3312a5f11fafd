"""Raw cgroupfs cpuset access: path resolution, the one writer task and the drift watcher.

The NRI runtime normally applies dracpu's cpusets; this package is what dracpu does itself
when the runtime did not (``CgroupWriter.run``: every write, each asked of the state owner's
``IntentView`` first) and how it keeps the kernel's view equal to its own (``DriftWatcher``,
which reads and asks the writer to repair).
"""

from dracpu.cgroupfs.drift import DriftReport
from dracpu.cgroupfs.intent_view import IntentView
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
    "IntentView",
    "WriteOutcome",
    "detect_layout",
    "resolve",
]
