"""Stand-ins for other drivers' kubelet plugins in `dracpu demo`.

A scenario may hold another driver's devices (a GPU or NIC driver's ResourceSlices) so that
a claim can align CPUs with them. Once the scheduler allocates such a claim, the kubelet
calls ``NodePrepareResources`` on every driver of the claim, as the real kubelet does, and a
pod whose driver is not registered never starts. So for each other driver the demo serves a
stand-in plugin over real gRPC on the kubelet's plugin sockets (registration socket
``<kubelet root>/plugins_registry/<driver>-reg.sock``, DRA service
``<kubelet root>/plugins/<driver>/dra.sock``), registered by the simulated kubelet's plugin
watcher like any driver. It prepares a claim by naming the claim's devices of its driver
(read from ``status.allocation``) with no CDI devices, and unprepares with nothing to undo:
the demo shows where the devices land, not what a GPU driver does with them.

The gRPC servers run in grpcio's worker threads; they read claims from the simulated API
server through the Trio thread (``trio.from_thread``), which owns it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import trio

from dracpu.proto.dra.v1 import api_pb2 as dra_v1
from dracpu.proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from dracpu.proto.pluginregistration import api_pb2 as reg_pb

__all__ = [
    "StandInDriver",
    "dra_plugin_handlers",
    "registration_handler",
    "stand_in_drivers",
]

Obj = dict[str, Any]
# Reads one claim (namespace, name) in the Trio thread; raises when it is not there.
ClaimReader = Callable[[str, str], Obj]

_SERVICES = (
    ("k8s.io.kubelet.pkg.apis.dra.v1", dra_v1),
    ("k8s.io.kubelet.pkg.apis.dra.v1beta1", dra_v1beta1),
)


# One RPC handler for a DRA service's protobuf module (dra_v1 or dra_v1beta1).
HandlerFor = Callable[[Any], Callable[[Any, Any], Any]]


def dra_plugin_handlers(prepare: HandlerFor, unprepare: HandlerFor) -> list[grpc.GenericRpcHandler]:
    """The ``DRAPlugin`` service at both versions the kubelet may call (v1 and v1beta1),
    ``prepare(pb)`` and ``unprepare(pb)`` giving each version's unary handlers."""
    return [
        grpc.method_handlers_generic_handler(
            f"{package}.DRAPlugin",
            {
                "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
                    prepare(pb),
                    request_deserializer=pb.NodePrepareResourcesRequest.FromString,
                    response_serializer=pb.NodePrepareResourcesResponse.SerializeToString,
                ),
                "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
                    unprepare(pb),
                    request_deserializer=pb.NodeUnprepareResourcesRequest.FromString,
                    response_serializer=pb.NodeUnprepareResourcesResponse.SerializeToString,
                ),
            },
        )
        for package, pb in _SERVICES
    ]


def registration_handler(
    get_info: Callable[[reg_pb.InfoRequest, Any], reg_pb.PluginInfo],
    notify: Callable[[reg_pb.RegistrationStatus, Any], reg_pb.RegistrationStatusResponse],
) -> grpc.GenericRpcHandler:
    """The ``pluginregistration.Registration`` service the kubelet's plugin watcher calls."""
    return grpc.method_handlers_generic_handler(
        "pluginregistration.Registration",
        {
            "GetInfo": grpc.unary_unary_rpc_method_handler(
                get_info,
                request_deserializer=reg_pb.InfoRequest.FromString,
                response_serializer=reg_pb.PluginInfo.SerializeToString,
            ),
            "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
                notify,
                request_deserializer=reg_pb.RegistrationStatus.FromString,
                response_serializer=reg_pb.RegistrationStatusResponse.SerializeToString,
            ),
        },
    )


class StandInDriver:
    """One other driver's stand-in plugin: registration and DRA servers on unix sockets."""

    def __init__(
        self,
        driver: str,
        kubelet_root: str,
        read_claim: ClaimReader,
        token: trio.lowlevel.TrioToken,
    ) -> None:
        self.driver = driver
        self.registration_socket = os.path.join(
            kubelet_root, "plugins_registry", f"{driver}-reg.sock"
        )
        self.dra_socket = os.path.join(kubelet_root, "plugins", driver, "dra.sock")
        self._read_claim = read_claim
        self._token = token
        self._servers: list[grpc.Server] = []

    # -- registration --------------------------------------------------------------------

    def _get_info(self, request: reg_pb.InfoRequest, context: Any) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(
            type="DRAPlugin",
            name=self.driver,
            endpoint=self.dra_socket,
            supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"],
        )

    def _notify(
        self, request: reg_pb.RegistrationStatus, context: Any
    ) -> reg_pb.RegistrationStatusResponse:
        return reg_pb.RegistrationStatusResponse()

    # -- DRA -----------------------------------------------------------------------------

    def _devices(self, namespace: str, name: str, uid: str) -> list[Obj]:
        """The claim's allocation results of this driver; ValueError when the claim is
        gone, replaced (another uid) or not allocated."""
        try:
            claim = trio.from_thread.run_sync(
                self._read_claim, namespace, name, trio_token=self._token
            )
        except Exception as exc:
            raise ValueError(f"read claim {namespace}/{name}: {exc}") from None
        if (claim.get("metadata") or {}).get("uid") != uid:
            raise ValueError(f"claim {namespace}/{name} is not the one with uid {uid}")
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise ValueError(f"claim {namespace}/{name} is not allocated")
        results = (allocation.get("devices") or {}).get("results") or []
        return [r for r in results if r.get("driver") == self.driver]

    def _prepare(self, pb: Any) -> Callable[[Any, Any], Any]:
        def handler(request: Any, context: Any) -> Any:
            response = pb.NodePrepareResourcesResponse()
            for claim in request.claims:
                try:
                    devices = self._devices(claim.namespace, claim.name, claim.uid)
                except ValueError as exc:
                    response.claims[claim.uid].error = str(exc)
                    continue
                entry = response.claims[claim.uid]
                entry.SetInParent()  # a claim with no device of ours still gets an answer
                for result in devices:
                    entry.devices.add(
                        request_names=[str(result.get("request", ""))],
                        pool_name=str(result.get("pool", "")),
                        device_name=str(result.get("device", "")),
                    )
            return response

        return handler

    def _unprepare(self, pb: Any) -> Callable[[Any, Any], Any]:
        def handler(request: Any, context: Any) -> Any:
            response = pb.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                response.claims[claim.uid].SetInParent()  # nothing was set up: done
            return response

        return handler

    def _dra_handlers(self) -> list[grpc.GenericRpcHandler]:
        return dra_plugin_handlers(self._prepare, self._unprepare)

    def _registration_handlers(self) -> list[grpc.GenericRpcHandler]:
        return [registration_handler(self._get_info, self._notify)]

    # -- lifecycle -----------------------------------------------------------------------

    def _serve(self, path: str, handlers: list[grpc.GenericRpcHandler]) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers(handlers)
        if not server.add_insecure_port("unix:" + path):
            raise OSError(f"cannot listen on {path}")
        server.start()
        self._servers.append(server)

    def start(self) -> None:
        """Serve the DRA socket, then the registration socket (the watcher's cue)."""
        self._serve(self.dra_socket, self._dra_handlers())
        self._serve(self.registration_socket, self._registration_handlers())

    def stop(self) -> None:
        for server in reversed(self._servers):
            server.stop(None).wait()
        self._servers.clear()
        for path in (self.registration_socket, self.dra_socket):
            if os.path.exists(path):
                os.unlink(path)


def stand_in_drivers(slices: list[Obj], ours: str) -> list[str]:
    """The drivers (other than ``ours``) of these slices, sorted."""
    return sorted({str(s["spec"]["driver"]) for s in slices} - {ours})
