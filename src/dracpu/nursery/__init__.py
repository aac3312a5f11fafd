"""The daemon's root supervisor (ARCHITECTURE.md principle 3): services started in order,
restarted with backoff when they crash, readiness, and shutdown on SIGTERM/SIGINT."""

from dracpu.nursery.backoff import restart_delay
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
