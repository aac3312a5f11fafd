"""``SimKubelet``: the simulated node's kubelet, as far as DRA is concerned.

Two loops:

- **plugins** — polls ``<root>/plugins_registry/`` for socket files (the real kubelet uses
  inotify), registers each new or re-created socket over real gRPC (``GetInfo``, validate,
  ``NotifyRegistrationStatus``), deregisters removed ones, retries failed registrations
  with backoff, and every ``monitor_interval`` checks registered plugins with ``GetInfo``
  (two failures in a row deregister). With ``wipe_slices`` it also deletes the node's
  ResourceSlices at start, and a driver's slices ``slice_wipe_grace`` seconds after its
  last registration went away (unless it registers again in time), as the kubelet does
  (protocols.md §2.6).
- **pods** — for pods bound to this node: GETs their ResourceClaims, calls
  ``NodePrepareResources`` on the claims' drivers for claims not prepared yet, resolves the
  returned CDI ids to env entries, and asks the runtime for a sandbox and the containers.
  A failed start leaves the pod ``Pending`` with the error recorded and is retried with
  backoff. When a pod is deleted (gone, or marked with ``deletionTimestamp``) its
  containers are stopped and removed, then claims no other pod uses are unprepared, then a
  gracefully deleted pod object is finally removed.

Like the real kubelet, prepared claims are remembered (its checkpoint) and never prepared
again: after a plugin restart (its registration socket re-created) the plugin is
registered again, and only claims not prepared yet are sent to it; already prepared
claims are unprepared through the new registration when their last pod goes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import grpc
import trio

from dracpu.k8s.client import K8sError, KubeClient, NotFound
from dracpu_sim.kubelet import dra
from dracpu_sim.kubelet.dra import ClaimRef, DRACallError
from dracpu_sim.kubelet.pods import (
    Backoff,
    ContainerState,
    PodStartError,
    PodState,
    PreparedClaim,
    claim_drivers,
    claim_problem,
    container_device_ids,
    containers_of,
    pod_claim_names,
    pod_qos_class,
    spec_env,
)
from dracpu_sim.kubelet.registration import (
    DIAL_TIMEOUT,
    PluginRejected,
    RegistrationCallError,
    SocketId,
    diff_sockets,
    fetch_info,
    notify,
    scan_registry,
    validate_plugin,
)
from dracpu_sim.kubelet.runtime import ContainerRuntime

__all__ = ["RegisteredPlugin", "RegistrationEvent", "SimKubelet"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]


@dataclass
class RegisteredPlugin:
    name: str
    endpoint: str
    service: str  # "v1.DRAPlugin" or "v1beta1.DRAPlugin"
    socket: str  # its registration socket
    channel: grpc.Channel = field(repr=False)
    monitor_failures: int = 0  # consecutive failed GetInfo checks


@dataclass(frozen=True)
class RegistrationEvent:
    time: float
    socket: str
    accepted: bool
    plugin: str  # "" when GetInfo never answered
    message: str  # the rejection or failure; "registered" / "deregistered" otherwise


@dataclass
class _SocketRetry:
    failures: int
    next_attempt: float


async def _in_thread(fn: Any, *args: Any) -> Any:
    # abandon_on_cancel: shutdown must not wait for a gRPC deadline to run out.
    return await trio.to_thread.run_sync(partial(fn, *args), abandon_on_cancel=True)


class SimKubelet:
    """The kubelet of one simulated node. Constructing it does no I/O."""

    def __init__(
        self,
        kubelet_root: str,
        api: KubeClient,
        runtime: ContainerRuntime,
        node_name: str,
        *,
        cdi_dir: str = "/var/run/cdi",
        plugin_poll_interval: float = 0.1,
        pod_poll_interval: float = 0.2,
        backoff: Backoff | None = None,
        dial_timeout: float = DIAL_TIMEOUT,
        monitor_interval: float = 10.0,
        wipe_slices: bool = False,
        slice_wipe_grace: float = 30.0,
    ) -> None:
        self.kubelet_root = kubelet_root
        self.registry_dir = os.path.join(kubelet_root, "plugins_registry")
        self.api = api
        self.runtime = runtime
        self.node_name = node_name
        self.cdi_dir = cdi_dir
        self.plugin_poll_interval = plugin_poll_interval
        self.pod_poll_interval = pod_poll_interval
        self.backoff = backoff or Backoff()
        self.dial_timeout = dial_timeout
        self.monitor_interval = monitor_interval
        self.wipe_slices = wipe_slices
        self.slice_wipe_grace = slice_wipe_grace
        self._wipe_due: dict[str, float] = {}  # driver -> when its slices go
        self.plugins: dict[str, RegisteredPlugin] = {}  # by driver name
        self.registrations: list[RegistrationEvent] = []
        self.pods: dict[str, PodState] = {}  # by pod uid
        self.prepared: dict[str, PreparedClaim] = {}  # the checkpoint, by claim uid
        self.last_error: str | None = None  # of the last pod round
        self._sockets: dict[str, SocketId] = {}
        self._socket_retry: dict[str, _SocketRetry] = {}
        self._wake = trio.Event()

    # ---- public -------------------------------------------------------------------------

    def poke(self) -> None:
        """Sync pods now instead of at the next poll."""
        self._wake.set()

    def pod(self, namespace: str, name: str) -> PodState | None:
        """The state of the newest pod with this name (a name can be reused)."""
        found = [st for st in self.pods.values() if (st.namespace, st.name) == (namespace, name)]
        return found[-1] if found else None

    def snapshot(self) -> dict[str, Any]:
        """Plugins, registrations, pods (containers, env, errors) and prepared claims."""
        return {
            "plugins": {
                name: {"endpoint": p.endpoint, "service": p.service, "socket": p.socket}
                for name, p in self.plugins.items()
            },
            "registrations": [
                {
                    "socket": e.socket,
                    "plugin": e.plugin,
                    "accepted": e.accepted,
                    "message": e.message,
                }
                for e in self.registrations
            ],
            "pods": {st.ref: st.snapshot() for st in self.pods.values()},
            "prepared_claims": {
                str(c.ref): {"uid": c.ref.uid, "pods": sorted(c.pods)}
                for c in self.prepared.values()
            },
        }

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        os.makedirs(self.registry_dir, exist_ok=True)
        if self.wipe_slices:
            await self._delete_slices(None)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._plugin_loop)
                nursery.start_soon(self._pod_loop)
                task_status.started()
        finally:
            for plugin in self.plugins.values():
                plugin.channel.close()
            self.plugins.clear()

    # ---- plugin registration ------------------------------------------------------------

    async def _plugin_loop(self) -> None:
        next_check = trio.current_time() + self.monitor_interval
        while True:
            await self.sync_plugins()
            if trio.current_time() >= next_check:
                await self.monitor_plugins()
                next_check = trio.current_time() + self.monitor_interval
            await trio.sleep(self.plugin_poll_interval)

    async def monitor_plugins(self) -> None:
        """The connection monitor (protocols.md §2.5 step 7): ``GetInfo`` on every
        registered socket; two failures in a row, or a changed name or endpoint, and the
        plugin is treated as gone."""
        for plugin in list(self.plugins.values()):
            try:
                channel, info = await _in_thread(fetch_info, plugin.socket, self.dial_timeout)
                channel.close()
                problem = None
                if (info.name, info.endpoint or plugin.socket) != (plugin.name, plugin.endpoint):
                    problem = f"GetInfo now answers {info.name} at {info.endpoint}"
            except RegistrationCallError as exc:
                problem = str(exc)
            if problem is None:
                plugin.monitor_failures = 0
                continue
            plugin.monitor_failures += 1
            if plugin.monitor_failures >= 2 or problem.startswith("GetInfo now"):
                self._deregister(plugin.socket, reason=f"connection monitor: {problem}")

    async def sync_plugins(self) -> None:
        """One pass of the plugin watcher."""
        current = scan_registry(self.registry_dir)
        gone, new = diff_sockets(self._sockets, current)
        self._sockets = current
        for path in gone:
            self._socket_retry.pop(path, None)
            self._deregister(path)
        for path in new:
            await self._register(path)
        now = trio.current_time()
        for path, retry in list(self._socket_retry.items()):
            if path not in new and retry.next_attempt <= now:
                await self._register(path)
        for driver, due in list(self._wipe_due.items()):
            if driver in self.plugins:
                del self._wipe_due[driver]
            elif due <= trio.current_time():
                await self._delete_slices(driver)
                del self._wipe_due[driver]

    async def _delete_slices(self, driver: str | None) -> None:
        """Delete this node's ResourceSlices (of one driver, or all); errors are logged."""
        selector = f"spec.nodeName={self.node_name}"
        if driver is not None:
            selector += f",spec.driver={driver}"
        api = self.api
        try:
            await api.call_raw(
                api.resource.delete_collection_resource_slice, field_selector=selector
            )
        except K8sError as exc:
            log.warning("deleting ResourceSlices (%s) failed: %s", selector, exc)
            return
        log.info("deleted ResourceSlices with %s", selector)

    def _event(self, socket: str, accepted: bool, plugin: str, message: str) -> None:
        self.registrations.append(
            RegistrationEvent(trio.current_time(), socket, accepted, plugin, message)
        )
        if accepted:
            log.info("plugin %s at %s: %s", plugin, socket, message)
        else:
            log.warning("plugin %s at %s: %s", plugin or "?", socket, message)

    def _failed(self, path: str) -> None:
        retry = self._socket_retry.setdefault(path, _SocketRetry(0, 0.0))
        retry.failures += 1
        retry.next_attempt = trio.current_time() + self.backoff.delay(retry.failures)

    async def _register(self, path: str) -> None:
        try:
            channel, info = await _in_thread(fetch_info, path, self.dial_timeout)
        except RegistrationCallError as exc:
            self._event(path, False, "", str(exc))
            self._failed(path)
            return
        try:
            in_use = {p.endpoint for p in self.plugins.values() if p.socket != path}
            endpoint, service = validate_plugin(
                info, socket_path=path, kubelet_root=self.kubelet_root, endpoints_in_use=in_use
            )
        except PluginRejected as exc:
            await _in_thread(notify, channel, False, str(exc))
            channel.close()
            self._event(path, False, info.name, str(exc))
            self._failed(path)
            return
        self._deregister(path, quiet=True)
        previous = self.plugins.pop(info.name, None)
        if previous is not None:
            previous.channel.close()  # the newest registration of a driver wins
        plugin = RegisteredPlugin(
            info.name, endpoint, service, path, grpc.insecure_channel("unix:" + endpoint)
        )
        self.plugins[info.name] = plugin
        answer = await _in_thread(notify, channel, True, "")
        channel.close()
        if answer is not None:
            self.plugins.pop(info.name, None)
            plugin.channel.close()
            self._event(path, False, info.name, f"failed to send registration status: {answer}")
            self._failed(path)
            return
        self._socket_retry.pop(path, None)
        self._event(path, True, info.name, f"registered, using {service} at {endpoint}")
        # Pods waiting for this driver (to prepare or to unprepare) need not sit out
        # their backoff.
        for st in self.pods.values():
            if st.phase in ("Pending", "Terminating"):
                st.next_attempt = 0.0
        self.poke()

    def _deregister(
        self, path: str, *, quiet: bool = False, reason: str = "registration socket removed"
    ) -> None:
        for name, plugin in list(self.plugins.items()):
            if plugin.socket == path:
                del self.plugins[name]
                plugin.channel.close()
                if self.wipe_slices:
                    self._wipe_due[name] = trio.current_time() + self.slice_wipe_grace
                if not quiet:
                    self._event(path, True, name, f"deregistered: {reason}")

    # ---- pods ---------------------------------------------------------------------------

    async def _pod_loop(self) -> None:
        while True:
            try:
                await self.sync_pods()
                self.last_error = None
            except K8sError as exc:
                self.last_error = str(exc)
                log.warning("pod sync failed: %s", exc)
            with trio.move_on_after(self.pod_poll_interval):
                await self._wake.wait()
            self._wake = trio.Event()

    async def sync_pods(self) -> None:
        """One pass over the pods bound to this node."""
        api = self.api
        raw = await api.call_raw(
            api.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={self.node_name}"
        )
        pods: list[Obj] = json.loads(raw).get("items") or []
        pods.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["uid"]))
        live = {p["metadata"]["uid"]: p for p in pods}
        now = trio.current_time()
        for uid, known in list(self.pods.items()):
            gone = uid not in live and known.phase != "Terminated"
            if gone and (known.phase != "Terminating" or known.next_attempt <= now):
                await self._terminate(known, None)
        for pod in pods:
            uid = pod["metadata"]["uid"]
            st = self.pods.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                if st is None:
                    st = self.pods[uid] = PodState(
                        uid, pod["metadata"]["namespace"], pod["metadata"]["name"]
                    )
                if st.phase == "Terminated":
                    await self._finish_delete(pod)  # an earlier removal did not go through
                elif st.phase != "Terminating" or st.next_attempt <= now:
                    await self._terminate(st, pod)
                continue
            if st is None:
                st = self.pods[uid] = PodState(
                    uid, pod["metadata"]["namespace"], pod["metadata"]["name"]
                )
            if st.phase == "Pending" and st.next_attempt <= now:
                await self._start(st, pod)

    def _record_error(self, st: PodState, message: str) -> None:
        st.errors.append((trio.current_time(), message))
        st.failures += 1
        st.next_attempt = trio.current_time() + self.backoff.delay(st.failures)
        log.warning("pod %s: %s", st.ref, message)

    # ---- start --------------------------------------------------------------------------

    async def _start(self, st: PodState, pod: Obj) -> None:
        try:
            claim_uids = await self._prepare_claims(st, pod)
            envs = await self._container_envs(pod, claim_uids)
        except PodStartError as exc:
            self._record_error(st, str(exc))
            await self._report_waiting(st, pod, "FailedPrepareDynamicResources", str(exc))
            return
        try:
            await self.runtime.run_pod_sandbox(st.uid, st.namespace, st.name, pod_qos_class(pod))
            st.sandbox = True
            for container in containers_of(pod):
                name = str(container.get("name", ""))
                cid = await self.runtime.create_container(st.uid, name, envs[name])
                st.containers[name] = ContainerState(name, cid, envs[name])
        except Exception as exc:  # any runtime failure: undo and retry the whole start
            self._record_error(st, f"runtime: {exc}")
            with contextlib.suppress(Exception):  # recorded on the pod; retried at teardown
                await self._remove_containers(st)
            await self._report_waiting(st, pod, "FailedCreateContainer", f"runtime: {exc}")
            return
        st.phase = "Running"
        st.failures = 0
        await self._report_running(st)

    async def _get_claim(self, namespace: str, name: str) -> Obj:
        api = self.api
        try:
            raw = await api.call_raw(api.resource.read_namespaced_resource_claim, name, namespace)
        except NotFound:
            raise PodStartError(f"resourceclaim {namespace}/{name} not found") from None
        except K8sError as exc:
            raise PodStartError(f"fetch resourceclaim {namespace}/{name}: {exc}") from None
        claim: Obj = json.loads(raw)
        return claim

    async def _prepare_claims(self, st: PodState, pod: Obj) -> dict[str, str]:
        """Prepare the pod's claims not prepared yet; pod claim name -> claim uid."""
        names = pod_claim_names(pod)
        claim_uids: dict[str, str] = {}
        refs: list[ClaimRef] = []
        todo: dict[str, list[ClaimRef]] = {}  # driver -> claims to prepare
        drivers_of: dict[str, list[str]] = {}
        for pod_claim, name in names.items():
            claim = await self._get_claim(st.namespace, name)
            problem = claim_problem(claim, st.uid)
            if problem:
                raise PodStartError(problem)
            ref = ClaimRef(st.namespace, name, claim["metadata"]["uid"])
            claim_uids[pod_claim] = ref.uid
            refs.append(ref)
            if ref.uid in self.prepared:
                continue
            drivers_of[ref.uid] = claim_drivers(claim)
            for driver in drivers_of[ref.uid]:
                todo.setdefault(driver, []).append(ref)
            if not drivers_of[ref.uid]:
                self.prepared[ref.uid] = PreparedClaim(ref, {})
        st.claims = refs
        done: dict[str, dict[str, list[dra.PreparedDevice]]] = {}
        failures: list[str] = []
        for driver, claims in todo.items():
            try:
                devices, errors = await self._call_prepare(driver, claims)
            except PodStartError as exc:
                failures.append(str(exc))
                continue
            for ref in claims:
                if ref.uid in errors:
                    failures.append(
                        f"prepare dynamic resources: NodePrepareResources failed for claim "
                        f"{ref}: {errors[ref.uid]}"
                    )
                else:
                    done.setdefault(ref.uid, {})[driver] = devices[ref.uid]
        for ref in refs:
            wanted = drivers_of.get(ref.uid)
            if wanted and set(done.get(ref.uid, {})) == set(wanted):
                self.prepared[ref.uid] = PreparedClaim(ref, done[ref.uid])
        for ref in refs:
            if ref.uid in self.prepared:
                self.prepared[ref.uid].pods.add(st.uid)
        if failures:
            raise PodStartError("; ".join(failures))
        return claim_uids

    async def _call_prepare(
        self, driver: str, claims: Sequence[ClaimRef]
    ) -> tuple[dict[str, list[dra.PreparedDevice]], dict[str, str]]:
        plugin = self.plugins.get(driver)
        if plugin is None:
            raise PodStartError(f"prepare dynamic resources: DRA driver {driver} is not registered")
        try:
            response = await _in_thread(dra.prepare, plugin.channel, plugin.service, claims)
            return dra.read_prepare(claims, response)
        except DRACallError as exc:
            raise PodStartError(f"prepare dynamic resources: driver {driver}: {exc}") from None

    async def _container_envs(self, pod: Obj, claim_uids: dict[str, str]) -> dict[str, list[str]]:
        from dracpu import cdi  # another engineer's module; imported when first needed

        envs: dict[str, list[str]] = {}
        for container in containers_of(pod):
            name = str(container.get("name", ""))
            ids = container_device_ids(container, claim_uids, self.prepared)
            try:
                device_env = await trio.to_thread.run_sync(cdi.device_env, self.cdi_dir, ids)
            except cdi.CDIError as exc:
                raise PodStartError(f"container {name!r}: CDI: {exc}") from None
            envs[name] = spec_env(container) + list(device_env)
        return envs

    async def _report_waiting(self, st: PodState, pod: Obj, reason: str, message: str) -> None:
        """Show why the pod does not start in its status (the real kubelet also emits an
        Event; the loopback API server has no events)."""
        condition = {"type": "Ready", "status": "False", "reason": reason, "message": message}
        if condition in ((pod.get("status") or {}).get("conditions") or []):
            return  # already shown; no write per retry
        # Containers not created yet wait as "ContainerCreating", which is what `kubectl get
        # pods` then shows in STATUS (the kubelet's generateAPIPodStatus does the same).
        waiting = [
            {
                "name": str(c.get("name", "")),
                "image": str(c.get("image", "")),
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"waiting": {"reason": "ContainerCreating"}},
            }
            for c in containers_of(pod)
        ]
        status = {"phase": "Pending", "conditions": [condition], "containerStatuses": waiting}
        api = self.api
        with contextlib.suppress(K8sError):  # a status report is best effort
            await api.call_raw(
                api.core.patch_namespaced_pod_status, st.name, st.namespace, {"status": status}
            )

    async def _report_running(self, st: PodState) -> None:
        api = self.api
        status = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": c.name,
                    "containerID": f"sim://{c.id}",
                    "ready": True,
                    "state": {"running": {}},
                }
                for c in st.containers.values()
            ],
        }
        with contextlib.suppress(K8sError):  # a status report is best effort
            await api.call_raw(
                api.core.patch_namespaced_pod_status, st.name, st.namespace, {"status": status}
            )

    # ---- termination --------------------------------------------------------------------

    async def _remove_containers(self, st: PodState) -> None:
        for container in list(st.containers.values()):
            try:
                if container.running:
                    await self.runtime.stop_container(container.id)
                    container.running = False
                await self.runtime.remove_container(container.id)
            except Exception as exc:  # recorded; removal is retried with the pod
                st.errors.append((trio.current_time(), f"runtime: {exc}"))
                raise
            del st.containers[container.name]
        if st.sandbox:
            await self.runtime.remove_pod_sandbox(st.uid)
            st.sandbox = False

    async def _terminate(self, st: PodState, pod: Obj | None) -> None:
        st.phase = "Terminating"
        try:
            await self._remove_containers(st)
        except Exception:
            st.failures += 1
            st.next_attempt = trio.current_time() + self.backoff.delay(st.failures)
            return
        for ref in st.claims:
            if ref.uid in self.prepared:
                self.prepared[ref.uid].pods.discard(st.uid)
        failures = await self._unprepare_unused()
        still = [
            ref for ref in st.claims if ref.uid in self.prepared and not self.prepared[ref.uid].pods
        ]
        if still:
            self._record_error(st, "; ".join(failures) or "claims not unprepared yet")
            return
        st.phase = "Terminated"
        st.failures = 0
        if pod is not None:
            await self._finish_delete(pod)

    async def _unprepare_unused(self) -> list[str]:
        """NodeUnprepareResources for prepared claims no pod uses; the errors, if any."""
        by_driver: dict[str, list[ClaimRef]] = {}
        for claim in self.prepared.values():
            if claim.pods:
                continue
            if not claim.devices:
                continue
            for driver in claim.devices:
                by_driver.setdefault(driver, []).append(claim.ref)
        for uid in [u for u, c in self.prepared.items() if not c.pods and not c.devices]:
            del self.prepared[uid]
        failures: list[str] = []
        for driver, refs in sorted(by_driver.items()):
            plugin = self.plugins.get(driver)
            if plugin is None:
                failures.append(
                    f"unprepare dynamic resources: DRA driver {driver} is not registered"
                )
                continue
            try:
                response = await _in_thread(dra.unprepare, plugin.channel, plugin.service, refs)
                errors = dra.read_unprepare(refs, response)
            except DRACallError as exc:
                failures.append(f"unprepare dynamic resources: driver {driver}: {exc}")
                continue
            for ref in refs:
                if errors.get(ref.uid):
                    failures.append(
                        f"unprepare dynamic resources: NodeUnprepareResources failed for claim "
                        f"{ref}: {errors[ref.uid]}"
                    )
                    continue
                entry = self.prepared.get(ref.uid)
                if entry is not None:
                    entry.devices.pop(driver, None)
                    if not entry.devices:
                        del self.prepared[ref.uid]
        return failures

    async def _finish_delete(self, pod: Obj) -> None:
        """Remove a gracefully deleted pod object now that it is cleaned up."""
        api = self.api
        meta = pod["metadata"]
        with contextlib.suppress(NotFound):
            await api.call_raw(
                api.core.delete_namespaced_pod,
                meta["name"],
                meta["namespace"],
                grace_period_seconds=0,
                body={"preconditions": {"uid": meta["uid"]}},
            )
