"""The node's allocation state: its one owner (``owner.NodeState``), the read-only view
everyone else gets (``view.NodeView``), the kubelet's transactions (``claims``) and what
makes the state durable (``durable.CheckpointFile``: the checkpoint writer task and
start-up restore)."""

from dracpu.state.durable import CHECKPOINT_FILE, CheckpointFile, read_boot_id
from dracpu.state.owner import NodeState
from dracpu.state.steps import (
    AdmissionError,
    CheckpointOutcomeUnknown,
    ClaimSteps,
    CreateDecision,
    PrepareOutcome,
    StateFileError,
    UnprepareOutcome,
)
from dracpu.state.view import EMPTY_SHARED_POOL, NodeView

__all__ = [
    "CHECKPOINT_FILE",
    "EMPTY_SHARED_POOL",
    "AdmissionError",
    "CheckpointFile",
    "CheckpointOutcomeUnknown",
    "ClaimSteps",
    "CreateDecision",
    "NodeState",
    "NodeView",
    "PrepareOutcome",
    "StateFileError",
    "UnprepareOutcome",
    "read_boot_id",
]
