"""Harness for the simulated kubelet's tests (and a check of its own): a tiny DRA plugin
served by grpcio on unix sockets (registration + DRA v1/v1beta1) that writes CDI specs
like dracpu does (behavior.md §10.1)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from builders import DRIVER

from dracpu.proto.pluginregistration import api_pb2 as reg_pb
from dracpu_sim.demo.stand_in import dra_plugin_handlers, registration_handler


def write_cdi_spec(cdi_dir: str, claim_uid: str, cpus: str) -> str:
    os.makedirs(cdi_dir, exist_ok=True)
    spec = {
        "cdiVersion": "0.8.0",
        "kind": "dra.k8s.io/cpu",
        "devices": [
            {
                "name": f"claim-{claim_uid}",
                "containerEdits": {"env": [f"DRA_CPUSET_{claim_uid}={cpus}"]},
            }
        ],
        "containerEdits": {},
    }
    path = os.path.join(cdi_dir, f"dra.k8s.io-cpu_claim-{claim_uid}.json")
    Path(path).write_text(json.dumps(spec, separators=(",", ":")))
    return f"dra.k8s.io/cpu=claim-{claim_uid}"


@dataclass
class FakePlugin:
    """Registration + DRA servers of one plugin instance. ``start`` binds the DRA socket
    first, then the registration socket (protocols.md §2.3)."""

    root: str
    cdi_dir: str
    plugin_type: str = "DRAPlugin"
    name: str = DRIVER
    versions: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
    endpoint: str | None = None  # None: the default DRA socket path
    registration_name: str | None = None  # None: <name>-reg.sock
    cpus: str = "0-3"
    # A shared list that calls are appended to, to check ordering against the runtime.
    timeline: list[tuple[str, ...]] = field(default_factory=list)
    notifications: list[tuple[bool, str]] = field(default_factory=list)
    get_info_calls: int = 0
    prepare_calls: list[list[tuple[str, str, str]]] = field(default_factory=list)
    packages_called: list[str] = field(default_factory=list)  # "v1" / "v1beta1" per DRA call
    unprepare_calls: list[list[tuple[str, str, str]]] = field(default_factory=list)
    # Hooks returning an error text for a claim uid (per-claim error), or raising to abort.
    prepare_error: Callable[[str], str] | None = None
    unprepare_error: Callable[[str], str] | None = None
    abort_prepare: str | None = None  # whole-call failure with this message (INTERNAL)
    omit_claims: bool = False  # answer prepare with an empty map
    write_specs: bool = True
    fail_get_info: bool = False  # GetInfo answers UNAVAILABLE (a wedged plugin)
    _servers: list[grpc.Server] = field(default_factory=list)
    _paths: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def registration_socket(self) -> str:
        file_name = self.registration_name or f"{self.name or 'x'}-reg.sock"
        return os.path.join(self.root, "plugins_registry", file_name)

    @property
    def dra_socket(self) -> str:
        return os.path.join(self.root, "plugins", self.name or "x", "dra.sock")

    # ---- registration ---------------------------------------------------------------

    def _get_info(self, request: reg_pb.InfoRequest, context: Any) -> reg_pb.PluginInfo:
        with self._lock:
            self.get_info_calls += 1
        if self.fail_get_info:
            context.abort(grpc.StatusCode.UNAVAILABLE, "wedged")
        endpoint = self.dra_socket if self.endpoint is None else self.endpoint
        return reg_pb.PluginInfo(
            type=self.plugin_type,
            name=self.name,
            endpoint=endpoint,
            supported_versions=list(self.versions),
        )

    def _notify(
        self, request: reg_pb.RegistrationStatus, context: Any
    ) -> reg_pb.RegistrationStatusResponse:
        with self._lock:
            self.notifications.append((request.plugin_registered, request.error))
        if not request.plugin_registered:
            context.abort(grpc.StatusCode.UNKNOWN, f"failed registration process: {request.error}")
        return reg_pb.RegistrationStatusResponse()

    # ---- DRA ------------------------------------------------------------------------

    def _prepare(self, pb: Any) -> Callable[[Any, Any], Any]:
        def handler(request: Any, context: Any) -> Any:
            claims = [(c.namespace, c.name, c.uid) for c in request.claims]
            with self._lock:
                self.packages_called.append(pb.DESCRIPTOR.package.rsplit(".", 1)[1])
                self.prepare_calls.append(claims)
                self.timeline.append(("prepare", *[c[2] for c in claims]))
            if self.abort_prepare:
                context.abort(grpc.StatusCode.INTERNAL, self.abort_prepare)
            response = pb.NodePrepareResourcesResponse()
            if self.omit_claims:
                return response
            for _, _, uid in claims:
                error = self.prepare_error(uid) if self.prepare_error else ""
                if error:
                    response.claims[uid].error = error
                    continue
                cdi_id = (
                    write_cdi_spec(self.cdi_dir, uid, self.cpus)
                    if self.write_specs
                    else f"dra.k8s.io/cpu=claim-{uid}"
                )
                response.claims[uid].devices.add(
                    request_names=["cpus"],
                    pool_name="node-a",
                    device_name="cpudevnuma000",
                    cdi_device_ids=[cdi_id],
                )
            return response

        return handler

    def _unprepare(self, pb: Any) -> Callable[[Any, Any], Any]:
        def handler(request: Any, context: Any) -> Any:
            claims = [(c.namespace, c.name, c.uid) for c in request.claims]
            with self._lock:
                self.packages_called.append(pb.DESCRIPTOR.package.rsplit(".", 1)[1])
                self.unprepare_calls.append(claims)
                self.timeline.append(("unprepare", *[c[2] for c in claims]))
            response = pb.NodeUnprepareResourcesResponse()
            for _, _, uid in claims:
                error = self.unprepare_error(uid) if self.unprepare_error else ""
                response.claims[uid].error = error
                if not error:
                    Path(self.cdi_dir, f"dra.k8s.io-cpu_claim-{uid}.json").unlink(missing_ok=True)
            return response

        return handler

    def _dra_handlers(self) -> list[grpc.GenericRpcHandler]:
        return dra_plugin_handlers(self._prepare, self._unprepare)

    # ---- lifecycle ------------------------------------------------------------------

    def _serve(self, path: str, handlers: list[grpc.GenericRpcHandler]) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers(handlers)
        server.add_insecure_port("unix:" + path)
        server.start()
        self._servers.append(server)
        self._paths.append(path)

    def start(self, *, dra: bool = True) -> FakePlugin:
        if dra:
            self._serve(self.dra_socket, self._dra_handlers())
        registration = registration_handler(self._get_info, self._notify)
        self._serve(self.registration_socket, [registration])
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.stop(None).wait()
        self._servers.clear()
        for path in self._paths:
            if os.path.exists(path):
                os.unlink(path)
        self._paths.clear()


def test_cdi_spec_helper_matches_the_driver_format(tmp_path: Path) -> None:
    cdi_id = write_cdi_spec(str(tmp_path), "u-1", "0-3")
    assert cdi_id == "dra.k8s.io/cpu=claim-u-1"
    assert (tmp_path / "dra.k8s.io-cpu_claim-u-1.json").read_text() == (
        '{"cdiVersion":"0.8.0","kind":"dra.k8s.io/cpu","devices":[{"name":"claim-u-1",'
        '"containerEdits":{"env":["DRA_CPUSET_u-1=0-3"]}}],"containerEdits":{}}'
    )
