"""Which claim wrote a request's metadata: the document is read up to 1 MiB (its size
from fstat, not a 1 MiB buffer), and one that does not fit is taken for the claim's own."""

from __future__ import annotations

import json
import os

import pytest

from dracpu.allocation.prepare import ClaimAllocation
from dracpu.allocation.store import PreparedDevice
from dracpu.kubelet.metadata import METADATA_DIR, remove_claim_metadata, write_claim_metadata

UID = "6f1c2a3e-0b5d-4c1e-9a57-1d2e3f405162"
OTHER = "0d8b3c1a-7e2f-4a65-b9c4-3f2e1d0c9b8a"
DEVICES = [PreparedDevice(pool_name="node-a", device_name="cpudevnuma000", request_names=("cpus",))]


def document_path(plugin_dir: str) -> str:
    return os.path.join(plugin_dir, METADATA_DIR, "team-a_web", "cpus", "metadata.json")


@pytest.mark.parametrize("padding", [0, 2 << 20])
def test_a_document_of_another_claim_is_kept_unless_too_big_to_read(
    plugin_cdi_dirs: tuple[str, str], padding: int
) -> None:
    plugin_dir, cdi_dir = plugin_cdi_dirs
    claim = ClaimAllocation(uid=OTHER, namespace="team-a", name="web")
    write_claim_metadata(plugin_dir, cdi_dir, claim, DEVICES, None)
    path = document_path(plugin_dir)
    with open(path) as f:
        document = json.load(f)
    # Whitespace before the document: 2 MiB of it leaves the UID past the 1 MiB read.
    with open(path, "w") as f:
        f.write(" " * padding + json.dumps(document))
    remove_claim_metadata(plugin_dir, cdi_dir, "team-a", "web", UID)
    if padding:
        assert not os.path.exists(path)  # unreadable: taken for this claim's own
    else:
        with open(path) as f:
            assert json.load(f)["metadata"]["uid"] == OTHER  # another claim's: kept
