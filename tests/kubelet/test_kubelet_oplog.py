"""behavior.md §16.1: each NodePrepareResources / NodeUnprepareResources call logs its lines
under one operation id: first `begin: ...`, then every claim's lines, last `end: ...`."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

from builders import claim, result
from kubelet_harness import make_node

from dracpu.kubelet.dra import ClaimRef
from dracpu.logs import setup_logging


def _capture() -> tuple[io.StringIO, Any]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    out = io.StringIO()
    setup_logging("json", 4, out)
    return out, saved


def _restore(saved: Any) -> None:
    root = logging.getLogger()
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


async def test_prepare_and_unprepare_each_carry_one_operation_id(cdi_dir: str) -> None:
    node = make_node(cdi_dir)
    node.claims.put(claim("u1", result("cpudevnuma001", 2)))
    node.claims.put(claim("u2", result("cpudevnuma001", 999)))
    refs = [ClaimRef(namespace="default", name=f"claim-{u}", uid=u) for u in ("u1", "u2")]
    out, saved = _capture()
    try:
        await node.service.prepare(refs)
        await node.service.unprepare(refs[:1])
    finally:
        _restore(saved)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    ops: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        if "opID" in line:
            ops.setdefault(line["opID"], []).append(line)
    assert len(ops) == 2
    prepare, unprepare = ops.values()
    assert prepare[0]["msg"] == "begin: preparing resource claims"
    assert prepare[1]["msg"].startswith("reserved allocation for resource claim")
    assert prepare[2]["msg"].startswith(
        "prepare of claim default/claim-u2 failed: not enough cpus available"
    )
    assert prepare[-1]["msg"] == "end: preparing resource claims"
    assert unprepare[0]["msg"] == "begin: unpreparing resource claims"
    assert unprepare[1]["msg"].startswith("unprepared claim default/claim-u1 uid=u1")
    assert unprepare[-1]["msg"] == "end: unpreparing resource claims"
    assert all(len(op_id) == 8 and int(op_id, 16) >= 0 for op_id in ops)
