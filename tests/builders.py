"""Builders the tests share: short temp dirs, cpusets, topologies, claims, pods, and the
daemon's signal and HTTP helpers.

Every test module imports it as ``builders`` (``tests/`` is on ``sys.path``, see
``tests/conftest.py``). Each builder returns a new object with the defaults most tests
want; keywords change one field at a time.

- temp dirs: :func:`short_dir` (the ``short_tmp`` fixture in ``tests/conftest.py`` gives
  each test one and removes them all when the test ends)
- cpusets: :func:`cs`
- topologies: :class:`Row`, :func:`from_rows`, :func:`grid_rows`, :func:`grid`,
  :func:`quirk_19_1` (no sysfs), :func:`machine` (a checked-in ``fake_sysfs`` tree)
- claims as the driver sees them: :func:`result` (``AllocationResult``), :func:`claim`
  (``ClaimAllocation``)
- prepare: :class:`DeviceNames` (the published names prepare resolves), :func:`allocation_store`,
  :func:`plan` and :func:`prepare_error` (``plan_claim``'s plan or error text), :func:`commit`
  (the state owner's reserve and commit of a plan), :func:`prepared_device`
- claims as API objects: :func:`claim_request`, :func:`resource_claim`,
  :func:`device_result`, :func:`allocation`, :func:`device_class`
- pods: :func:`nri_pod`, :func:`nri_container` (NRI protobufs), :func:`pod` (a v1 Pod)
- the daemon: :func:`no_signals` (a signal source that never fires), :func:`fetch` (GET)
- gRPC over h2: :func:`grpc_headers` (a call's request headers), :func:`h2_pair` (a server
  connection and an h2 client, prefaces exchanged), :class:`H2Pair` (the same, moving
  bytes both ways until quiet)
"""

from __future__ import annotations

import http.client
import tempfile
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
import trio

from dracpu.allocation import prepare as allocation_prepare
from dracpu.allocation.opaque import DeviceConfig
from dracpu.allocation.prepare import (
    AllocationResult,
    ClaimAllocation,
    ClaimPlan,
    PrepareError,
    plan_claim,
)
from dracpu.allocation.store import AllocationStore, PreparedDevice, StoreError
from dracpu.cpuset import CPUSet
from dracpu.grpc.connection import GRPCServerConnection
from dracpu.grpc.events import Event
from dracpu.proto.nri import api_pb2 as nri_pb
from dracpu.topology import discover_from_root
from dracpu.topology.model import NO_ID, CoreType, CPUInfo, Topology

FAKE_SYSFS = Path(__file__).resolve().parent / "fake_sysfs"
NODE = "node-a"
DRIVER = "dra.cpu"

# -- temp dirs ---------------------------------------------------------------------------------


def short_dir(prefix: str = "t.") -> str:
    """A new directory right under /tmp, short enough for unix socket paths below it (a
    socket path stays under 108 bytes; pytest's ``tmp_path`` is too long). The
    ``short_tmp`` fixture removes it when the test ends."""
    return tempfile.mkdtemp(dir="/tmp", prefix=prefix)


# -- cpusets -----------------------------------------------------------------------------------


def cs(text: str) -> CPUSet:
    """A cpuset from the Linux list format: ``cs("0-3,8")``."""
    return CPUSet.parse(text)


# -- topologies --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One CPU of a hand-made topology."""

    cpu: int
    socket: int
    numa: int
    core: int
    l3: int = NO_ID
    cluster: int = NO_ID
    core_type: CoreType = CoreType.STANDARD


def from_rows(
    rows: Iterable[Row],
    *,
    online: CPUSet | None = None,
    pcie_roots: Mapping[str, CPUSet] | None = None,
) -> Topology:
    """A topology with one CPU per row; CPUs of the same (socket, cluster, core) are SMT
    siblings. ``online`` defaults to every row's CPU."""
    rows = sorted(rows, key=lambda r: r.cpu)
    by_core: dict[tuple[int, int, int], list[int]] = {}
    by_numa: dict[int, list[int]] = {}
    for r in rows:
        by_core.setdefault((r.socket, r.cluster, r.core), []).append(r.cpu)
        by_numa.setdefault(r.numa, []).append(r.cpu)
    cpus: dict[int, CPUInfo] = {}
    for r in rows:
        threads = by_core[(r.socket, r.cluster, r.core)]
        sibling = NO_ID
        if len(threads) == 2:
            sibling = threads[0] if threads[1] == r.cpu else threads[1]
        cpus[r.cpu] = CPUInfo(
            cpu=r.cpu,
            socket=r.socket,
            core=r.core,
            numa=r.numa,
            cluster=r.cluster,
            numa_cpus=CPUSet(by_numa[r.numa]),
            l3=r.l3,
            core_type=r.core_type,
            sibling=sibling,
            thread_siblings=CPUSet(threads),
        )
    return Topology(
        cpus=cpus,
        online=CPUSet(cpus) if online is None else online,
        smt_enabled=len(cpus) > len(by_core),
        pcie_roots=dict(pcie_roots or {}),
    )


def grid_rows(
    sockets: int,
    numa_per_socket: int,
    cores_per_numa: int,
    threads: int = 2,
    cores_per_l3: int | None = None,
    *,
    e_cores: CPUSet | None = None,
) -> list[Row]:
    """Rows of a regular machine, numbered the way Linux does on x86: thread t of global core
    g is CPU ``t * total_cores + g`` and ``core_id`` restarts in every socket. L3 group i is
    global cores ``i * cores_per_l3 ...``; ``cores_per_l3=None`` means no L3 information at
    all. With ``e_cores`` the machine is hybrid: those CPUs are E-cores, the rest P-cores."""
    cores_per_socket = numa_per_socket * cores_per_numa
    total_cores = sockets * cores_per_socket
    rows = []
    for g in range(total_cores):
        socket, local = divmod(g, cores_per_socket)
        numa = socket * numa_per_socket + local // cores_per_numa
        l3 = NO_ID if cores_per_l3 is None else g // cores_per_l3
        for t in range(threads):
            cpu = t * total_cores + g
            core_type = CoreType.STANDARD
            if e_cores is not None:
                core_type = CoreType.E_CORE if cpu in e_cores else CoreType.P_CORE
            rows.append(
                Row(cpu=cpu, socket=socket, numa=numa, core=local, l3=l3, core_type=core_type)
            )
    return rows


def grid(
    sockets: int,
    numa_per_socket: int,
    cores_per_numa: int,
    threads: int = 2,
    cores_per_l3: int | None = None,
    *,
    online: CPUSet | None = None,
    pcie_roots: Mapping[str, CPUSet] | None = None,
    e_cores: CPUSet | None = None,
) -> Topology:
    """A regular machine (see :func:`grid_rows`); ``cores_per_l3=cores_per_numa`` gives
    every NUMA node its own L3, with the NUMA node's index as its id."""
    rows = grid_rows(
        sockets, numa_per_socket, cores_per_numa, threads, cores_per_l3, e_cores=e_cores
    )
    return from_rows(rows, online=online, pcie_roots=pcie_roots)


def quirk_19_1() -> Topology:
    """behavior.md §19.1: 16 CPUs, core_id repeats in both sockets, SMT siblings c and c+8."""
    rows = []
    for c in range(16):
        socket = (c // 4) % 2
        core = c % 4
        rows.append(Row(cpu=c, socket=socket, numa=socket, core=core, l3=2 * socket + core // 2))
    return from_rows(rows)


@cache
def machine(name: str) -> Topology:
    """The topology of the checked-in sysfs tree ``tests/fake_sysfs/<name>``, discovered
    once per run (callers must not change it)."""
    return discover_from_root(FAKE_SYSFS / name)


# -- claims as the driver sees them ------------------------------------------------------------


def result(
    device: str,
    count: int | str | None = None,
    *,
    request: str = "cpus",
    pool: str = NODE,
    driver: str = DRIVER,
    share_id: str = "",
) -> AllocationResult:
    """One allocated device of a claim; ``count`` is its consumed ``dra.cpu/cpu``."""
    capacity = {} if count is None else {"dra.cpu/cpu": str(count)}
    return AllocationResult(
        request=request,
        driver=driver,
        pool=pool,
        device=device,
        consumed_capacity=capacity,
        share_id=share_id,
    )


def claim(
    uid: str,
    *results: AllocationResult,
    name: str | None = None,
    namespace: str = "default",
    allocated: bool = True,
    configs: Sequence[DeviceConfig] = (),
) -> ClaimAllocation:
    """A claim as a claim source returns it; named ``claim-<uid>`` unless ``name``."""
    return ClaimAllocation(
        uid=uid,
        namespace=namespace,
        name=name or f"claim-{uid}",
        allocated=allocated,
        results=results,
        configs=tuple(configs),
    )


# -- prepare ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceNames:
    """The published device names prepare resolves (``allocation.prepare.DeviceNames``):
    ``cpu_of_device`` in individual mode, ``group_of_device`` in grouped numanode or
    socket mode, neither in machine mode."""

    mode: str = "grouped"
    group_by: str = "numanode"
    cpu_of_device: Mapping[str, int] = field(default_factory=dict)
    group_of_device: Mapping[str, int] = field(default_factory=dict)


def allocation_store(topo: Topology, reserved: str = "") -> AllocationStore:
    """A store of every CPU of ``topo``; ``reserved`` (a cpuset) is the pool's floor."""
    floor = CPUSet.parse(reserved)
    return AllocationStore(topo.all_cpus - floor, floor)


def plan(
    c: ClaimAllocation,
    names: allocation_prepare.DeviceNames,
    store: AllocationStore,
    topo: Topology,
    *,
    online: CPUSet | None = None,
) -> ClaimPlan:
    """``plan_claim`` of ``c``; ``online`` defaults to the topology's online CPUs."""
    return plan_claim(
        c,
        inventory=names,
        topology=topo,
        store=store,
        online=topo.online if online is None else online,
    )


def prepare_error(
    c: ClaimAllocation,
    names: allocation_prepare.DeviceNames,
    store: AllocationStore,
    topo: Topology,
    *,
    online: CPUSet | None = None,
) -> str:
    """The ``PrepareError`` text of planning ``c`` (fails the test if it plans)."""
    with pytest.raises(PrepareError) as info:
        plan(c, names, store, topo, online=online)
    return str(info.value)


def commit(store: AllocationStore, p: ClaimPlan) -> bool:
    """A prepare whose files reached the disk, on the allocation store alone: the plan's
    claim is reserved as pending, then committed, as ``NodeState.prepare`` does (its steps
    are private to ``dracpu.state``; tests/state checks them). True when the claim was new;
    the store's refusal is a ``PrepareError``, as the owner reports it."""
    if p.already_prepared or p.is_empty:
        return False
    try:
        new = store.reserve(p.record, pending=True)
    except StoreError as exc:
        raise PrepareError(str(exc)) from None
    store.commit(p.claim_uid)
    return new


def prepared_device(
    device: str, request: str = "cpus", allocated: int | None = None, *, pool: str = NODE
) -> PreparedDevice:
    """A device of a prepared claim, for ``request`` (none when empty)."""
    return PreparedDevice(
        pool_name=pool,
        device_name=device,
        request_names=(request,) if request else (),
        allocated_num_cpus=allocated,
    )


# -- claims as API objects ---------------------------------------------------------------------


def claim_request(
    name: str = "cpus",
    *,
    cpus: int | None = None,
    selector: str | None = None,
    device_class: str = DRIVER,
    **exactly: Any,
) -> dict[str, Any]:
    """One ``exactly`` device request of a ResourceClaim: ``cpus`` asks for that much
    ``dra.cpu/cpu`` capacity, ``selector`` adds one CEL selector, other keywords are more
    fields of ``exactly``."""
    body: dict[str, Any] = {"deviceClassName": device_class}
    if cpus is not None:
        body["capacity"] = {"requests": {"dra.cpu/cpu": str(cpus)}}
    if selector is not None:
        body["selectors"] = [{"cel": {"expression": selector}}]
    body.update(exactly)
    return {"name": name, "exactly": body}


def resource_claim(
    name: str,
    cpus: int | None = None,
    *,
    requests: Sequence[dict[str, Any]] = (),
    namespace: str | None = "default",
    **devices: Any,
) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaim: the given ``requests``, or one request ``cpus``
    (see :func:`claim_request`); other keywords are more fields of ``spec.devices``.
    ``namespace=None`` leaves the namespace to the call that creates it."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {"devices": {"requests": list(requests) or [claim_request(cpus=cpus)], **devices}},
    }


def device_result(
    device: str,
    cpus: int | None = None,
    *,
    share_id: str | None = None,
    request: str = "cpus",
    pool: str = NODE,
    driver: str = DRIVER,
) -> dict[str, Any]:
    """One entry of a claim's ``status.allocation.devices.results``."""
    entry: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if share_id is not None:
        entry["shareID"] = share_id
    if cpus is not None:
        entry["consumedCapacity"] = {"dra.cpu/cpu": str(cpus)}
    return entry


def allocation(*results: dict[str, Any], node: str | None = None) -> dict[str, Any]:
    """A claim's ``status.allocation`` with these results; ``node`` adds the node selector
    the scheduler writes."""
    body: dict[str, Any] = {"devices": {"results": list(results)}}
    if node is not None:
        from dracpu_sim.scheduler import node_selector  # the scheduler is slow to import

        body["nodeSelector"] = node_selector(node)
    return body


def device_class(name: str = DRIVER) -> dict[str, Any]:
    """The DeviceClass that selects every device of the driver ``name``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{name}"'}}]},
    }


# -- pods --------------------------------------------------------------------------------------


def nri_pod(uid: str, *, name: str | None = None, namespace: str = "default") -> nri_pb.PodSandbox:
    """An NRI pod sandbox ``sb-<uid>``, named ``pod-<uid>`` unless ``name``."""
    return nri_pb.PodSandbox(
        id=f"sb-{uid}", uid=uid, name=f"pod-{uid}" if name is None else name, namespace=namespace
    )


def nri_container(pod_uid: str, cid: str, *env: str, name: str | None = None) -> nri_pb.Container:
    """An NRI container ``cid`` of pod sandbox ``sb-<pod_uid>`` with these ``KEY=value``
    environment entries and a cgroupfs-style cgroups path; named ``cid`` unless ``name``."""
    return nri_pb.Container(
        id=cid,
        pod_sandbox_id=f"sb-{pod_uid}",
        name=cid if name is None else name,
        env=list(env),
        linux=nri_pb.LinuxContainer(cgroups_path=f"/kubepods/pod{pod_uid}/{cid}"),
    )


def pod(
    name: str,
    *claims: str,
    namespace: str | None = "default",
    node: str | None = None,
    container: Mapping[str, Any] | None = None,
    template: str | None = None,
) -> dict[str, Any]:
    """A v1 Pod with one container (``container``, by default ``{"name": "app"}``) that uses
    every claim: claim i is the pod's resource claim ``rc<i>``; ``template`` adds one from
    that ResourceClaimTemplate (``tpl``). ``node`` binds it; ``namespace=None`` leaves the
    namespace to the call that creates it."""
    refs: list[dict[str, str]] = [
        {"name": f"rc{i}", "resourceClaimName": c} for i, c in enumerate(claims)
    ]
    if template is not None:
        refs.append({"name": "tpl", "resourceClaimTemplateName": template})
    main = dict(container or {"name": "app"})
    spec: dict[str, Any] = {"containers": [main]}
    if refs:
        spec["resourceClaims"] = refs
        main["resources"] = {"claims": [{"name": r["name"]} for r in refs]}
    if node is not None:
        spec["nodeName"] = node
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


# -- the daemon --------------------------------------------------------------------------------


@contextmanager
def no_signals(*signals: int) -> Iterator[AsyncIterator[int]]:
    """A signal source for ``Supervisor.run_until_signal`` that never delivers one."""
    send, receive = trio.open_memory_channel[int](1)
    with send:
        yield receive


def fetch(port: int, path: str) -> tuple[int, bytes]:
    """GET ``path`` from 127.0.0.1:``port`` (blocking): the status and the body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# -- gRPC over h2 ------------------------------------------------------------------------------

GRPC_PATH = b"/p.S/M"


def grpc_headers(
    path: bytes = GRPC_PATH,
    *extra: tuple[bytes, bytes],
    method: bytes = b"POST",
    content_type: bytes = b"application/grpc",
    te: bool = True,
) -> list[tuple[bytes, bytes]]:
    """The request headers of a gRPC call, as grpc clients send them, then ``extra``;
    ``te=False`` leaves out ``te: trailers``."""
    headers = [
        (b":method", method),
        (b":scheme", b"http"),
        (b":path", path),
        (b":authority", b"localhost"),
        (b"content-type", content_type),
    ]
    if te:
        headers.append((b"te", b"trailers"))
    return [*headers, *extra]


def h2_pair(**limits: int) -> tuple[GRPCServerConnection, h2.connection.H2Connection]:
    """A gRPC server connection (``GRPCServerConnection(**limits)``) and an h2 client,
    their prefaces and SETTINGS exchanged: ready for a request."""
    server = GRPCServerConnection(**limits)
    server.initiate()
    client = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    client.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    return server, client


class H2Pair:
    """:func:`h2_pair` with the client's SETTINGS acknowledged, and helpers to move bytes
    both ways (``exchange``), open calls (``request``) and find what the client got
    (``of``)."""

    def __init__(self, **limits: int) -> None:
        self.server, self.client = h2_pair(**limits)
        self.client_events: list[h2.events.Event] = []
        self.exchange()

    def exchange(self) -> list[Event]:
        """Move bytes both ways until quiet; return the server's gRPC events."""
        events: list[Event] = []
        while True:
            to_server = self.client.data_to_send()
            if to_server:
                events += self.server.receive_data(to_server)
            to_client = self.server.data_to_send()
            if to_client:
                self.client_events += self.client.receive_data(to_client)
            if not to_server and not to_client:
                return events

    def request(
        self,
        body: bytes | None,
        extra: Sequence[tuple[bytes, bytes]] = (),
        *,
        path: bytes = GRPC_PATH,
        more: bool = False,
    ) -> int:
        """Open a call (no DATA when ``body`` is None); ``more``: the message goes on in
        later DATA frames. Nothing is sent until ``exchange``."""
        sid: int = self.client.get_next_available_stream_id()
        self.client.send_headers(sid, grpc_headers(path, *extra), end_stream=body is None)
        if body is not None:
            self.client.send_data(sid, body, end_stream=not more)
        return sid

    def of(self, kind: type[Any], sid: int) -> list[Any]:
        """The client's events of this type on stream ``sid``."""
        return [
            e
            for e in self.client_events
            if isinstance(e, kind) and getattr(e, "stream_id", 0) == sid
        ]
