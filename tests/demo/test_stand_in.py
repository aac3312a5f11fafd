"""The demo's stand-in plugin for another driver: prepare names the claim's devices of its
driver (no CDI devices); a claim it cannot read, that was replaced or is not allocated is a
per-claim error; unprepare has nothing to undo."""

from __future__ import annotations

from typing import Any

import trio

from dracpu.proto.dra.v1 import api_pb2 as dra_v1
from dracpu_sim.demo.stand_in import StandInDriver, stand_in_drivers

CLAIMS: dict[tuple[str, str], dict[str, Any]] = {
    ("default", "aligned"): {
        "metadata": {"uid": "u-1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "cpus", "driver": "dra.cpu", "pool": "n", "device": "c0"},
                        {
                            "request": "gpu",
                            "driver": "gpu.example.com",
                            "pool": "n",
                            "device": "g1",
                        },
                    ]
                }
            }
        },
    },
    ("default", "pending"): {"metadata": {"uid": "u-2"}, "status": {}},
}


def read_claim(namespace: str, name: str) -> dict[str, Any]:
    try:
        return CLAIMS[(namespace, name)]
    except KeyError:
        raise LookupError(f"resourceclaims {name!r} not found") from None


def claim(name: str, uid: str) -> Any:
    return dra_v1.Claim(namespace="default", name=name, uid=uid)


async def test_prepare_names_its_devices_and_refuses_what_it_cannot_read() -> None:
    plugin = StandInDriver(
        "gpu.example.com", "/nonexistent", read_claim, trio.lowlevel.current_trio_token()
    )
    request = dra_v1.NodePrepareResourcesRequest(
        claims=[
            claim("aligned", "u-1"),
            claim("aligned", "u-old"),
            claim("pending", "u-2"),
            claim("gone", "u-3"),
        ]
    )
    handler = plugin._prepare(dra_v1)
    response = await trio.to_thread.run_sync(handler, request, None)
    ok = response.claims["u-1"]
    assert ok.error == ""
    assert [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
            for d in ok.devices] == [(["gpu"], "n", "g1", [])]  # fmt: skip
    assert response.claims["u-old"].error == "claim default/aligned is not the one with uid u-old"
    assert response.claims["u-2"].error == "claim default/pending is not allocated"
    assert (
        response.claims["u-3"].error == "read claim default/gone: resourceclaims 'gone' not found"
    )
    unprepared = plugin._unprepare(dra_v1)(
        dra_v1.NodeUnprepareResourcesRequest(claims=[claim("aligned", "u-1")]), None
    )
    assert list(unprepared.claims) == ["u-1"] and unprepared.claims["u-1"].error == ""


def test_sockets_are_where_the_kubelet_looks_and_ours_is_not_stood_in() -> None:
    plugin = StandInDriver("dra.net", "/k", read_claim, None)  # type: ignore[arg-type]
    assert plugin.registration_socket == "/k/plugins_registry/dra.net-reg.sock"
    assert plugin.dra_socket == "/k/plugins/dra.net/dra.sock"
    slices = [{"spec": {"driver": d}} for d in ("gpu.example.com", "dra.cpu", "dra.net", "dra.net")]
    assert stand_in_drivers(slices, "dra.cpu") == ["dra.net", "gpu.example.com"]
