"""The node's allocation state: its one owner (``owner.NodeState``) and what makes it
durable (``durable.CheckpointFile``: the checkpoint writer task and start-up restore)."""

from dracpu.state.durable import CHECKPOINT_FILE, CheckpointFile, read_boot_id
from dracpu.state.owner import NodeState, StateFileError

__all__ = ["CHECKPOINT_FILE", "CheckpointFile", "NodeState", "StateFileError", "read_boot_id"]
