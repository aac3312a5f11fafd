"""A whole simulated node around the real daemon: what `dracpu demo` and end-to-end tests run.

``SimNode`` owns a work directory and runs, in this process, the loopback API server, the
NRI runtime simulator (with its cgroup tree), the scheduler and the kubelet; the daemon
itself runs as a child process (``python -m dracpu run`` with every host path pointed into
the work directory), so it can be killed with SIGKILL and started again like the real one.

Layout of the work directory (socket paths stay well under the 107-byte limit when the
directory is a short one under /tmp)::

    kubeconfig   apiserver's kubeconfig for the daemon and for kubectl
    kubelet/     kubelet root: plugins_registry/ and plugins/dra.cpu/
    nri.sock     the runtime's NRI socket
    cgroup/      the runtime's cgroup tree: v1 (cpuset/kubepods/burstable/pod<uid>/<id>/) or v2
                 (cgroup.controllers; kubepods.slice/.../cri-containerd-<id>.scope/ with
                 the systemd driver), as ``cgroup_version`` and ``cgroup_driver`` say
    cdi/         CDI specs
    state/       the daemon's checkpoint
    dracpu.log   the daemon's log
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from dracpu.cpuset import CPUSet
from dracpu.k8s.client import K8sError, KubeClient
from dracpu_sim.apiserver import SimAPIServer
from dracpu_sim.kubelet import SimKubelet
from dracpu_sim.kubelet.pods import Backoff
from dracpu_sim.kubelet.runtime import PodRuntimeAdapter
from dracpu_sim.procfs import FakeIrqs, make_fake_procfs
from dracpu_sim.runtime.layout import check_cgroup_flavor
from dracpu_sim.runtime.simulator import RuntimeSimulator
from dracpu_sim.scheduler.shell import Scheduler

__all__ = ["DaemonProcess", "SimNode", "SimNodeError"]

DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "dra.cpu"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "dra.cpu"'}}]},
}


class SimNodeError(Exception):
    """The simulated node or its daemon did not come up; the message says what and why."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DaemonProcess:
    """One run of ``dracpu run`` as a child process."""

    process: trio.Process
    http_port: int
    debug_port: int
    log_path: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def debug_url(self) -> str:
        return f"http://127.0.0.1:{self.debug_port}"

    def running(self) -> bool:
        return self.process.returncode is None

    def kill(self) -> None:
        """SIGKILL: the daemon gets no chance to clean up (the crash-safety tests use it)."""
        if self.running():
            self.process.send_signal(signal.SIGKILL)

    async def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait; SIGKILL after ``timeout``. Returns the exit code."""
        if self.running():
            self.process.send_signal(signal.SIGTERM)
        with trio.move_on_after(timeout):
            return await self.process.wait()
        self.kill()
        return await self.process.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


@dataclass
class SimNode:
    """The simulated node's parts; ``run`` starts them, ``start_daemon`` adds the driver."""

    workdir: str
    node_cpus: str
    node_name: str = "demo-node"
    node_mems: str = "0"
    # Graceful deletion: a deleted pod's claims are unprepared before its CPUs can be
    # allocated again, as on a real cluster.
    api: SimAPIServer = field(default_factory=lambda: SimAPIServer(graceful_pod_deletion=True))
    runtime: RuntimeSimulator | None = None
    kubelet: SimKubelet | None = None
    scheduler: Scheduler | None = None
    kube: KubeClient | None = None
    daemon: DaemonProcess | None = None
    # The kubelet's retry backoff (None: its default, 1 s doubling up to 30 s).
    kubelet_backoff: Backoff | None = None
    # The runtime's cgroup hierarchy (1 or 2) and the kubelet's cgroup driver.
    cgroup_version: int = 1
    cgroup_driver: str = "cgroupfs"
    # The daemon's procfs (--proc-root), written by ``run``: its interrupts are the ones
    # claims with isolateIRQs move, never the host's.
    irqs: FakeIrqs | None = None
    # What the last start_daemon/launch_daemon was given, for restart_daemon.
    _daemon_launch: tuple[str, tuple[str, ...]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_cgroup_flavor(self.cgroup_version, self.cgroup_driver)

    def path(self, name: str) -> str:
        return os.path.join(self.workdir, name)

    @property
    def kubeconfig(self) -> str:
        return self.path("kubeconfig")

    @property
    def kubelet_root(self) -> str:
        return self.path("kubelet")

    @property
    def nri_socket(self) -> str:
        return self.path("nri.sock")

    @property
    def cgroup_root(self) -> str:
        return self.path("cgroup")

    @property
    def cdi_dir(self) -> str:
        return self.path("cdi")

    @property
    def state_dir(self) -> str:
        return self.path("state")

    @property
    def proc_root(self) -> str:
        return self.path("proc")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the API server, runtime, kubelet and scheduler; serve until cancelled."""
        for sub in ("kubelet", "cdi", "state"):
            os.makedirs(self.path(sub), exist_ok=True)
        self.irqs = make_fake_procfs(self.workdir, CPUSet.parse(self.node_cpus))
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.api.serve)
                self.api.write_kubeconfig(self.kubeconfig)
                self.api.create(
                    "nodes",
                    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node_name}},
                )
                self.api.create("deviceclasses", json.loads(json.dumps(DEVICE_CLASS)))
                self.kube = KubeClient.from_kubeconfig(self.kubeconfig)
                self.runtime = RuntimeSimulator(
                    self.nri_socket,
                    self.cgroup_root,
                    node_cpus=self.node_cpus,
                    node_mems=self.node_mems,
                    cgroup_version=self.cgroup_version,
                    cgroup_driver=self.cgroup_driver,
                )
                await nursery.start(self.runtime.run)
                self.kubelet = SimKubelet(
                    self.kubelet_root,
                    self.kube,
                    PodRuntimeAdapter(self.runtime),
                    self.node_name,
                    cdi_dir=self.cdi_dir,
                    backoff=self.kubelet_backoff,
                )
                await nursery.start(self.kubelet.run)
                self.scheduler = Scheduler(self.kube, self.node_name, poll_interval=0.2)
                await nursery.start(self.scheduler.run)
                task_status.started()
        finally:
            if self.daemon is not None and self.daemon.running():
                with trio.CancelScope(shield=True):
                    await self.daemon.stop()
            if self.kube is not None:
                self.kube.close()

    # -- the daemon -------------------------------------------------------------------------

    def daemon_args(self, *, sysfs_root: str, http_port: int, debug_port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "dracpu",
            "run",
            f"--kubeconfig={self.kubeconfig}",
            f"--hostname-override={self.node_name}",
            f"--kubelet-root-dir={self.kubelet_root}",
            f"--nri-socket={self.nri_socket}",
            f"--cdi-dir={self.cdi_dir}",
            f"--cgroup-root={self.cgroup_root}",
            f"--state-dir={self.state_dir}",
            f"--proc-root={self.proc_root}",
            f"--sysfs-root={sysfs_root}",
            f"--bind-address=127.0.0.1:{http_port}",
            f"--debug-address=127.0.0.1:{debug_port}",
            "--v=4",
        ]

    async def start_daemon(
        self,
        *,
        sysfs_root: str,
        extra_args: Sequence[str] = (),
        ready_timeout: float = 30.0,
    ) -> DaemonProcess:
        """Start ``dracpu run`` and wait until its ``/readyz`` says ready."""
        await self.launch_daemon(sysfs_root=sysfs_root, extra_args=extra_args)
        await self.wait_ready(ready_timeout)
        assert self.daemon is not None
        return self.daemon

    async def launch_daemon(
        self, *, sysfs_root: str, extra_args: Sequence[str] = ()
    ) -> DaemonProcess:
        """Start ``dracpu run`` without waiting for it to be ready."""
        self._daemon_launch = (sysfs_root, tuple(extra_args))
        http_port, debug_port = free_port(), free_port()
        args = [
            *self.daemon_args(sysfs_root=sysfs_root, http_port=http_port, debug_port=debug_port),
            *extra_args,
        ]
        log_path = self.path("dracpu.log")
        # Appending keeps the log of every run of the daemon in one file.
        with open(log_path, "ab") as log_file:
            process = await trio.lowlevel.open_process(
                args, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.daemon = DaemonProcess(process, http_port, debug_port, log_path)
        return self.daemon

    async def kill_daemon(self) -> int | None:
        """SIGKILL the running daemon and reap it; its exit code (None when none ran)."""
        daemon = self.daemon
        if daemon is None:
            return None
        daemon.kill()
        return await daemon.process.wait()

    async def restart_daemon(self, *, wait: bool = True, ready_timeout: float = 30.0) -> None:
        """SIGKILL the daemon and start it again with the arguments it was last given."""
        if self._daemon_launch is None:
            raise SimNodeError("the daemon was never started, so it cannot be restarted")
        sysfs_root, extra_args = self._daemon_launch
        await self.kill_daemon()
        await self.launch_daemon(sysfs_root=sysfs_root, extra_args=extra_args)
        if wait:
            await self.wait_ready(ready_timeout)

    async def wait_ready(self, timeout: float = 30.0) -> None:
        daemon = self.daemon
        if daemon is None:
            raise SimNodeError("the daemon is not started")
        last = ""
        with trio.move_on_after(timeout):
            while True:
                if not daemon.running():
                    raise SimNodeError(
                        f"dracpu run exited with code {daemon.process.returncode}:\n"
                        f"{daemon.log_tail()}"
                    )
                try:
                    status, body = await trio.to_thread.run_sync(
                        _get, daemon.url + "/readyz?verbose"
                    )
                except OSError as exc:
                    last = str(exc)
                else:
                    if status == 200:
                        return
                    last = body.decode(errors="replace")
                await trio.sleep(0.1)
        raise SimNodeError(
            f"dracpu run was not ready after {timeout:.0f} s: {last}\n{daemon.log_tail()}"
        )

    async def daemon_ready(self) -> bool:
        """Whether a daemon runs and its ``/readyz`` answers 200 (never raises)."""
        return (await self.readiness())[0]

    async def readiness(self) -> tuple[bool, str]:
        """(ready, why not): ``/readyz?verbose`` of the running daemon; never raises."""
        daemon = self.daemon
        if daemon is None or not daemon.running():
            return False, "the daemon is not running"
        try:
            status, body = await trio.to_thread.run_sync(_get, daemon.url + "/readyz?verbose")
        except OSError as exc:
            return False, f"/readyz: {exc}"
        text = body.decode(errors="replace").strip()
        return status == 200, text

    async def debug_state(self) -> dict[str, Any]:
        if self.daemon is None:
            raise SimNodeError("the daemon is not started")
        status, body = await trio.to_thread.run_sync(_get, self.daemon.debug_url + "/debug/state")
        if status != 200:
            raise SimNodeError(f"/debug/state answered {status}")
        state: dict[str, Any] = json.loads(body)
        return state

    # -- workloads --------------------------------------------------------------------------

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create a Pod, ResourceClaim or ResourceClaimTemplate through the real client, as
        kubectl would (``fieldValidation=Strict``). Raises ``K8sError`` when refused."""
        assert self.kube is not None
        kube = self.kube
        ns = obj["metadata"].get("namespace", "default")
        # kubectl's default: the server refuses fields the kind does not have.
        strict = {"field_validation": "Strict"}
        if obj["kind"] == "Pod":
            raw = await kube.call_raw(kube.core.create_namespaced_pod, ns, obj, **strict)
        elif obj["kind"] == "ResourceClaim":
            raw = await kube.call_raw(
                kube.resource.create_namespaced_resource_claim, ns, obj, **strict
            )
        elif obj["kind"] == "ResourceClaimTemplate":
            raw = await kube.call_raw(
                kube.resource.create_namespaced_resource_claim_template, ns, obj, **strict
            )
        else:
            raise SimNodeError(f"cannot create a {obj['kind']}")
        created: dict[str, Any] = json.loads(raw)
        self.poke()
        return created

    async def delete_pod(self, namespace: str, name: str) -> None:
        assert self.kube is not None
        kube = self.kube
        try:
            await kube.call_raw(kube.core.delete_namespaced_pod, name, namespace)
        except K8sError as exc:
            raise SimNodeError(f"delete pod {namespace}/{name}: {exc}") from exc
        self.poke()

    def poke(self) -> None:
        if self.scheduler is not None:
            self.scheduler.poke()
        if self.kubelet is not None:
            self.kubelet.poke()

    def pod_states(self) -> dict[str, dict[str, Any]]:
        """``ns/name`` -> the kubelet's view: phase, containers (id, env), errors."""
        if self.kubelet is None:
            return {}
        pods: dict[str, dict[str, Any]] = self.kubelet.snapshot()["pods"]
        return pods

    def cpuset_of(self, container_id: str) -> str:
        """A container's cpuset as the cgroup tree holds it (what the kernel would enforce)."""
        assert self.runtime is not None
        return self.runtime.cpuset_of(container_id)

    def sandbox_cpuset_of(self, pod_uid: str) -> str:
        """A pod sandbox's cpuset as the cgroup tree holds it (what the kernel would enforce)."""
        assert self.runtime is not None
        return self.runtime.sandbox_cpuset_of(pod_uid)
