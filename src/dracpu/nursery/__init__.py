"""The daemon's root supervisor (ARCHITECTURE.md principle 3): services started in order as
children of one root nursery, restarted with backoff when they crash, one readiness source,
and shutdown on SIGTERM/SIGINT."""

from dracpu.nursery.backoff import restart_delay
from dracpu.nursery.pulse import Pulse
from dracpu.nursery.readiness import Readiness, ReadinessView, ReadyFlag
from dracpu.nursery.service import (
    Service,
    ServiceBlocked,
    ServiceFailed,
    ServiceState,
    ServiceStatus,
    SupervisorStopping,
)
from dracpu.nursery.supervisor import (
    DEFAULT_GRACE_PERIOD,
    Supervisor,
    describe_error,
    run_daemon,
)

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "Pulse",
    "Readiness",
    "ReadinessView",
    "ReadyFlag",
    "Service",
    "ServiceBlocked",
    "ServiceFailed",
    "ServiceState",
    "ServiceStatus",
    "Supervisor",
    "SupervisorStopping",
    "describe_error",
    "restart_delay",
    "run_daemon",
]
