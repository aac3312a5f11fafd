"""The simulated kubelet's QoS class of a pod (``GetPodQOS``), which picks the pod's cgroup,
and that it reaches the runtime with the sandbox."""

from __future__ import annotations

from typing import Any

import pytest

from dracpu_sim.kubelet.pods import pod_qos_class
from dracpu_sim.kubelet.runtime import MemoryRuntime, PodRuntimeAdapter


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": f"c{i}", **c} for i, c in enumerate(containers)]
    }
    if init:
        spec["initContainers"] = [{"name": f"i{i}", **c} for i, c in enumerate(init)]
    return {"spec": spec}


def res(
    requests: dict[str, str] | None = None, limits: dict[str, str] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if requests is not None:
        out["requests"] = requests
    if limits is not None:
        out["limits"] = limits
    return {"resources": out}


FULL = {"cpu": "2", "memory": "1Gi"}


@pytest.mark.parametrize(
    ("obj", "qos"),
    [
        (pod({}), "besteffort"),
        (pod({}, {}), "besteffort"),
        (pod(res(requests={"cpu": "0"})), "besteffort"),  # zero counts as unset
        (pod(res(limits=FULL)), "guaranteed"),  # requests default to the limits
        (pod(res(requests={"cpu": "2000m", "memory": "1024Mi"}, limits=FULL)), "guaranteed"),
        (pod(res(limits=FULL), res(limits=FULL)), "guaranteed"),
        (pod(res(limits=FULL), {}), "burstable"),  # one container without limits
        (pod(res(requests={"cpu": "1"}, limits=FULL)), "burstable"),
        (pod(res(limits={"cpu": "2"})), "burstable"),  # no memory limit
        (pod(res(requests={"memory": "1Gi"})), "burstable"),
        (pod(res(limits=FULL), init=({},)), "burstable"),  # init containers count
        (pod(res(limits={"cpu": "2", "memory": "1Gi", "dra.cpu/x": "1"})), "guaranteed"),
    ],
)
def test_pod_qos_class(obj: dict[str, Any], qos: str) -> None:
    assert pod_qos_class(obj) == qos


async def test_the_sandbox_is_run_with_the_class() -> None:
    runtime = MemoryRuntime()
    await runtime.run_pod_sandbox("u1", "ns", "web", "guaranteed")
    assert runtime.qos == {"u1": "guaranteed"}
    seen: list[tuple[str, str | None]] = []

    class Recorder:
        async def create_pod(
            self, pod_uid: str, name: str, namespace: str = "default", *, qos: str | None = None
        ) -> str:
            seen.append((pod_uid, qos))
            return "sb"

    adapter = PodRuntimeAdapter(Recorder())  # type: ignore[arg-type]
    await adapter.run_pod_sandbox("u2", "ns", "web", "besteffort")
    assert seen == [("u2", "besteffort")]
