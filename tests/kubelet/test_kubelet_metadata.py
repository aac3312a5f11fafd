"""Device metadata files and their CDI specs (behavior.md §7 step 4, §8.5 step 3, §10.3,
§20)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from builders import claim, result
from kubelet_harness import NODE, in_thread, make_node, prepare_request, prepare_stub, serving

from dracpu.atomicfile import atomic_write
from dracpu.cdi import device_env, on_memory_filesystem
from dracpu.kubelet import ClaimRef, dra, metadata, metadata_tree
from dracpu.kubelet.metadata_proc import MetadataProcess
from dracpu.proto.dra.v1 import api_pb2 as dra_v1


@pytest.fixture
def dirs(short_tmp: str, cdi_dir: str) -> tuple[str, str]:
    """The CDI directory and the plugin's data directory."""
    plugin_dir = os.path.join(short_tmp, "plug")
    os.mkdir(plugin_dir)
    return cdi_dir, plugin_dir


@pytest.fixture(params=["thread", "process"])
async def writer(
    request: pytest.FixtureRequest, nursery: trio.Nursery, dirs: tuple[str, str]
) -> dict[str, Any]:
    """The ``DRAService`` options for device metadata in the plugin dir: the files
    written in a worker thread, or by the writer process as `dracpu run` has them."""
    plugin_dir = dirs[1]
    if request.param == "thread":
        return {"plugin_data_dir": plugin_dir}
    process = MetadataProcess(plugin_dir)
    await nursery.start(process.run)
    return {"plugin_data_dir": plugin_dir, "metadata_process": process}


async def test_prepare_reply_and_files_match_section_20(
    nursery: trio.Nursery, dirs: tuple[str, str], writer: dict[str, Any]
) -> None:
    cdi_dir, plugin_dir = dirs
    node = make_node(cdi_dir)
    service = node.restart(**writer)
    c = claim("uid-1", result("cpudevnuma001", 2), name="my-claim")
    node.claims.put(c)
    async with serving(nursery, service) as (_, ch):
        reply = await in_thread(lambda: prepare_stub(ch)(prepare_request("v1", c), timeout=5))
    assert reply == dra_v1.NodePrepareResourcesResponse(
        claims={
            "uid-1": dra_v1.NodePrepareResourceResponse(
                devices=[
                    dra_v1.Device(
                        request_names=["cpus"],
                        pool_name=NODE,
                        device_name="cpudevnuma001",
                        cdi_device_ids=[
                            "dra.k8s.io/cpu=claim-uid-1",
                            "dra.cpu/metadata=uid-1_cpus",
                        ],
                    )
                ]
            )
        }
    )
    meta_path = Path(plugin_dir, "dra-device-metadata", "default_my-claim", "cpus", "metadata.json")
    text = meta_path.read_text()
    assert text.endswith("}\n") and text.count("\n") == 1  # a one-document JSON stream
    attributes = node.inventory.attributes_of("cpudevnuma001")
    attributes["dra.cpu/allocatedNumCPUs"] = {"int": 2}
    assert json.loads(text) == {
        "apiVersion": "metadata.resource.k8s.io/v1beta1",
        "kind": "DeviceMetadata",
        "metadata": {"name": "my-claim", "namespace": "default", "uid": "uid-1", "generation": 1},
        "requests": [
            {
                "name": "cpus",
                "devices": [
                    {
                        "driver": "dra.cpu",
                        "pool": NODE,
                        "name": "cpudevnuma001",
                        "attributes": attributes,
                    }
                ],
            }
        ],
    }
    assert list(json.loads(text)["requests"][0]["devices"][0]["attributes"])[-1] == (
        "dra.cpu/allocatedNumCPUs"
    )
    assert stat.S_IMODE(meta_path.stat().st_mode) == 0o644
    spec_path = Path(cdi_dir, "dra.cpu_metadata_uid-1_cpus.json")
    spec_text = spec_path.read_text()
    assert spec_text.startswith('{\n  "cdiVersion": "0.5.0",\n  "kind": "dra.cpu/metadata",')
    assert json.loads(spec_text)["devices"] == [
        {
            "name": "uid-1_cpus",
            "containerEdits": {
                "mounts": [
                    {
                        "hostPath": str(meta_path),
                        "containerPath": "/var/run/kubernetes.io/dra-device-attributes/"
                        "resourceclaims/my-claim/cpus/dra.cpu-metadata.json",
                        "options": ["ro", "bind"],
                    }
                ]
            },
        }
    ]
    # Both ids resolve the way a runtime resolves them.
    assert device_env(cdi_dir, list(reply.claims["uid-1"].devices[0].cdi_device_ids)) == [
        "DRA_CPUSET_uid-1=" + str(node.view.cpus_of("uid-1"))
    ]


async def test_sub_requests_share_one_file_and_unprepare_removes_all(
    dirs: tuple[str, str], writer: dict[str, Any]
) -> None:
    cdi_dir, plugin_dir = dirs
    node = make_node(cdi_dir)
    service = node.restart(**writer)
    c = claim(
        "uid-2",
        result("cpudevnuma000", 1, request="main/a"),
        result("cpudevnuma002", 2, request="main/b"),
        result("cpudevnuma003", 1, request="solo"),
        name="multi",
    )
    node.claims.put(c)
    ref = ClaimRef(namespace="default", name="multi", uid="uid-2")
    devices = (await service.prepare([ref]))["uid-2"].devices
    assert [d.cdi_device_ids for d in devices] == [
        ("dra.k8s.io/cpu=claim-uid-2", "dra.cpu/metadata=uid-2_main"),
        ("dra.k8s.io/cpu=claim-uid-2",),
        ("dra.k8s.io/cpu=claim-uid-2", "dra.cpu/metadata=uid-2_solo"),
    ]
    claim_dir = Path(plugin_dir, "dra-device-metadata", "default_multi")
    doc = json.loads((claim_dir / "main" / "metadata.json").read_text())
    assert [(r["name"], [d["name"] for d in r["devices"]]) for r in doc["requests"]] == [
        ("main/a", ["cpudevnuma000"]),
        ("main/b", ["cpudevnuma002"]),
    ]
    assert sorted(os.listdir(cdi_dir)) == [
        "dra.cpu_metadata_uid-2_main.json",
        "dra.cpu_metadata_uid-2_solo.json",
        "dra.k8s.io-cpu_claim-uid-2.json",
    ]
    assert (await service.unprepare([ref]))["uid-2"].error == ""
    assert os.listdir(cdi_dir) == []
    assert not claim_dir.exists()


async def test_metadata_failure_is_only_logged(
    dirs: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    cdi_dir, plugin_dir = dirs
    blocked = os.path.join(plugin_dir, "file")
    Path(blocked).write_text("not a directory")
    node = make_node(cdi_dir)
    service = node.restart(plugin_data_dir=blocked)
    node.claims.put(claim("uid-3", result("cpudevnuma000", 1), name="web"))
    ref = ClaimRef(namespace="default", name="web", uid="uid-3")
    with caplog.at_level(logging.WARNING, logger="dracpu.kubelet.metadata"):
        got = (await service.prepare([ref]))["uid-3"]
    assert got.error == ""
    assert got.devices[0].cdi_device_ids == ("dra.k8s.io/cpu=claim-uid-3",)
    assert "failed to write device metadata for claim default/web request cpus" in caplog.text
    assert os.listdir(cdi_dir) == ["dra.k8s.io-cpu_claim-uid-3.json"]


async def test_no_metadata_without_plugin_dir(dirs: tuple[str, str]) -> None:
    cdi_dir, _ = dirs
    node = make_node(cdi_dir)
    node.claims.put(claim("uid-4", result("cpudevnuma000", 1), name="web"))
    ref = ClaimRef(namespace="default", name="web", uid="uid-4")
    got = (await node.service.prepare([ref]))["uid-4"]
    assert got.devices[0].cdi_device_ids == ("dra.k8s.io/cpu=claim-uid-4",)
    assert os.listdir(cdi_dir) == ["dra.k8s.io-cpu_claim-uid-4.json"]


@pytest.mark.parametrize("plugin_on_tmpfs", [False, True])
async def test_metadata_files_leave_the_event_loop_unless_both_dirs_are_tmpfs(
    monkeypatch: pytest.MonkeyPatch, short_tmp: str, plugin_on_tmpfs: bool
) -> None:
    # A CDI dir on tmpfs lets spec writes run inline; the metadata file goes to the
    # plugin's data dir, which on a real node is on disk and fsynced: a worker thread then.
    if not os.path.isdir("/dev/shm"):
        pytest.skip("needs a tmpfs at /dev/shm")
    if not plugin_on_tmpfs and on_memory_filesystem(short_tmp):
        pytest.skip("needs a temp dir on disk")
    cdi_dir = tempfile.mkdtemp(dir="/dev/shm", prefix="dracpu-cdi.")
    plugin_dir = tempfile.mkdtemp(dir="/dev/shm" if plugin_on_tmpfs else short_tmp)
    seen: dict[str, tuple[bool, object]] = {}
    durable: dict[str, bool] = {}

    def recorded_write(path: str, data: bytes, **kw: Any) -> None:
        durable[os.path.basename(path)] = kw.get("durable", True)
        atomic_write(path, data, **kw)

    def recorded_in_place(path: str, data: bytes, *, durable: bool) -> None:
        durable_of[os.path.basename(path)] = durable
        write_in_place(path, data, durable=durable)

    durable_of, write_in_place = durable, metadata_tree._write_in_place
    monkeypatch.setattr(metadata, "atomic_write", recorded_write)
    monkeypatch.setattr(metadata_tree, "_write_in_place", recorded_in_place)

    def watched(name: str, fn: object) -> object:
        def call(*args: object, **kw: object) -> object:
            seen[name] = (threading.current_thread() is threading.main_thread(), kw)
            return fn(*args, **kw)  # type: ignore[operator]

        return call

    for step in (
        "write_claim_files",
        "write_metadata_specs",
        "remove_metadata_files",
        "remove_metadata_specs",
    ):
        monkeypatch.setattr(dra, step, watched(step, getattr(dra, step)))
    try:
        node = make_node(cdi_dir)
        service = node.restart(plugin_data_dir=plugin_dir)
        node.claims.put(claim("uid-t", result("cpudevnuma001", 2), name="t"))
        ref = ClaimRef(namespace="default", name="t", uid="uid-t")
        assert (await service.prepare([ref]))["uid-t"].error == ""
        assert os.path.exists(os.path.join(cdi_dir, "dra.cpu_metadata_uid-t_cpus.json"))
        assert (await service.unprepare([ref]))["uid-t"].error == ""
        assert os.listdir(cdi_dir) == []
        # The files on the Trio thread only with both dirs on tmpfs; the specs are on the
        # Trio thread either way (the CDI dir is a tmpfs), and written without fsyncs.
        assert service.metadata_purger is not None
        spares = service.metadata_purger.spares
        files_written, files_removed = seen["write_claim_files"], seen["remove_metadata_files"]
        assert files_written == (plugin_on_tmpfs, {"durable": False, "spares": spares})
        assert files_removed == (plugin_on_tmpfs, {"purge": False, "spares": spares})
        assert seen["write_metadata_specs"] == (True, {"durable": False})
        assert seen["remove_metadata_specs"] == (True, {})
        # The metadata file is as durable as the spec that mounts it: no fsync either.
        assert durable == {"metadata.json": False, "dra.cpu_metadata_uid-t_cpus.json": False}
    finally:
        shutil.rmtree(cdi_dir, ignore_errors=True)
        shutil.rmtree(plugin_dir, ignore_errors=True)


async def test_prepares_and_unprepares_reply_while_trios_default_threads_are_all_held(
    dirs: tuple[str, str],
) -> None:
    # The review's scenario: threads abandoned in Trio's shared pool (a hung cgroupfs
    # check per new container, before it had a limiter of its own) hold every token. The
    # spec and metadata I/O take their threads from the service's own limiters, so calls
    # still reply, an unknown claim's unprepare included.
    cdi_dir, plugin_dir = dirs
    node = make_node(cdi_dir, offload_io=True)  # every file step in a worker thread
    service = node.restart(plugin_data_dir=plugin_dir, offload_io=True)
    node.claims.put(claim("uid-h", result("cpudevnuma001", 2), name="h"))
    ref = ClaimRef(namespace="default", name="h", uid="uid-h")
    unknown = ClaimRef(namespace="default", name="never", uid="uid-never")
    default = trio.to_thread.current_default_thread_limiter()
    saved, release = default.total_tokens, threading.Event()
    default.total_tokens = 1
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, release.wait, 30)
            await trio.testing.wait_all_tasks_blocked()
            assert default.available_tokens == 0
            with trio.fail_after(10):
                assert (await service.prepare([ref]))["uid-h"].error == ""
                assert os.path.exists(os.path.join(cdi_dir, "dra.cpu_metadata_uid-h_cpus.json"))
                assert (await service.unprepare([ref, unknown]))["uid-h"].error == ""
            assert os.listdir(cdi_dir) == []
            release.set()
    finally:
        release.set()
        default.total_tokens = saved
