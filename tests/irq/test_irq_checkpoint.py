"""isolateIRQs in the checkpoint: kept when set, left out at its default so checkpoints
written before the option existed keep their checksum."""

from __future__ import annotations

import hashlib
import json

from dracpu.allocation.checkpoint import (
    CHECKPOINT_VERSION,
    Checkpoint,
    decode_checkpoint,
    encode_checkpoint,
)
from dracpu.allocation.options import AllocationOptions
from dracpu.allocation.store import ClaimRecord
from dracpu.cpuset import CPUSet


def checkpoint(options: AllocationOptions) -> Checkpoint:
    record = ClaimRecord(uid="u1", cpus=CPUSet.parse("2-3"), options={"main": options})
    return Checkpoint(
        version=CHECKPOINT_VERSION, boot_id="b", config_fingerprint="f", claims=(record,)
    )


def test_a_checkpoint_from_before_the_option_still_verifies() -> None:
    # What a dracpu without isolateIRQs wrote for a claim with options: no isolate_irqs key.
    payload = (
        b'{"version":1,"boot_id":"b","config_fingerprint":"f","claims":[{"uid":"u1",'
        b'"cpus":"2-3","namespace":"","name":"","devices":[],"options":{"main":'
        b'{"strategy":"packed","prefer_align_by_uncore_cache":true,"full_pcpus_only":false,'
        b'"distribute_across_numa":false,"shared_pool_access":true}}}]}'
    )
    checksum = "sha256:" + hashlib.sha256(payload).hexdigest()
    data = payload[:-1] + f',"checksum":"{checksum}"}}'.encode()
    cp = decode_checkpoint(data)
    assert cp.claims[0].options["main"] == AllocationOptions(shared_pool_access=True)
    assert encode_checkpoint(cp) == data


def test_the_option_at_its_default_is_not_written() -> None:
    data = encode_checkpoint(checkpoint(AllocationOptions(shared_pool_access=True)))
    assert b"isolate_irqs" not in data
    assert decode_checkpoint(data).claims[0].options["main"].shared_pool_access


def test_the_option_set_round_trips() -> None:
    data = encode_checkpoint(checkpoint(AllocationOptions(isolate_irqs=True)))
    assert json.loads(data)["claims"][0]["options"]["main"]["isolate_irqs"] is True
    assert decode_checkpoint(data).claims[0].options["main"].isolate_irqs
