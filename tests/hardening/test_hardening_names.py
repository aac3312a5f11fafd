"""Names from claims never become paths outside the driver's directories.

Claim UIDs become CDI spec file names (``cdi.check_claim_uid``); namespace, claim name and
request names become device-metadata directories under the plugin dir, and the UID and
request the metadata CDI spec's file name. All of them are held to what the API server
itself accepts before any of them reaches the filesystem. (Cgroup paths that escape the
cgroup root are refused by ``cgroupfs.paths``: tests/cgroupfs/test_cgroupfs_paths.py.)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from dracpu.allocation.prepare import ClaimAllocation
from dracpu.allocation.store import PreparedDevice
from dracpu.cdi import CDIError, check_claim_uid, claim_spec_path
from dracpu.kubelet.metadata import remove_claim_metadata, write_claim_metadata

UID = "6f1c2a3e-0b5d-4c1e-9a57-1d2e3f405162"


@pytest.mark.parametrize(
    ("uid", "problem"),
    [
        ("", "must not be empty"),
        ("../../etc/passwd", "must not contain '/', '..' or NUL"),
        ("a/b", "must not contain '/', '..' or NUL"),
        ("a..b", "must not contain '/', '..' or NUL"),
        ("a\x00b", "must not contain '/', '..' or NUL"),
        ("x" * 129, "must be at most 128 characters, got 129"),
        (".hidden", "must start and end with a letter or digit"),
        ("a b", "must start and end with a letter or digit"),
        ("a*", "must start and end with a letter or digit"),
    ],
)
def test_claim_uid_refused_before_it_is_a_file_name(uid: str, problem: str) -> None:
    with pytest.raises(CDIError, match="invalid claim UID") as info:
        claim_spec_path("/var/run/cdi", uid)
    assert problem in str(info.value)


def test_a_real_uid_is_accepted() -> None:
    check_claim_uid(UID)
    assert claim_spec_path("/cdi", UID) == f"/cdi/dra.k8s.io-cpu_claim-{UID}.json"


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """plugin dir and CDI dir side by side, with a sentinel file an escape would reach."""
    plugin_dir, cdi_dir = tmp_path / "plugin", tmp_path / "cdi"
    plugin_dir.mkdir()
    cdi_dir.mkdir()
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    (sentinel / "keep").write_text("x")
    yield plugin_dir, cdi_dir, sentinel
    shutil.rmtree(tmp_path, ignore_errors=True)


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def device(*requests: str) -> PreparedDevice:
    return PreparedDevice(pool_name="node-a", device_name="cpudevnuma000", request_names=requests)


@pytest.mark.parametrize(
    ("namespace", "name", "uid", "request_name"),
    [
        ("..", "sentinel", UID, "cpus"),
        ("default", "../../sentinel", UID, "cpus"),
        ("default", "..", UID, "cpus"),
        ("default", "a/b", UID, "cpus"),
        ("default", "c", UID, ".."),
        ("default", "c", UID, "../../../sentinel/x"),
        ("default", "c", "../../sentinel/x", "cpus"),
        ("default", "c", UID, "cpus\x00"),
        ("Default", "c", UID, "cpus"),  # not a DNS label
        ("a_b", "c", UID, "cpus"),  # "_" would make <ns>_<name> ambiguous
        ("default", "x" * 254, UID, "cpus"),
    ],
)
def test_device_metadata_refuses_names_that_could_escape(
    tree: tuple[Path, Path, Path], namespace: str, name: str, uid: str, request_name: str
) -> None:
    plugin_dir, cdi_dir, sentinel = tree
    claim = ClaimAllocation(uid=uid, namespace=namespace, name=name)
    devices = [device(request_name)]
    written = write_claim_metadata(str(plugin_dir), str(cdi_dir), claim, devices, None)
    assert written == {}
    assert files_under(plugin_dir.parent) == {"sentinel/keep"}
    remove_claim_metadata(str(plugin_dir), str(cdi_dir), namespace, name, uid)
    assert (sentinel / "keep").read_text() == "x"


def test_device_metadata_for_valid_names_stays_inside(tree: tuple[Path, Path, Path]) -> None:
    plugin_dir, cdi_dir, sentinel = tree
    claim = ClaimAllocation(uid=UID, namespace="team-a", name="my.claim-1")
    written = write_claim_metadata(
        str(plugin_dir), str(cdi_dir), claim, [device("cpus/sub", "other")], None
    )
    assert written == {
        "cpus": f"dra.cpu/metadata={UID}_cpus",
        "other": f"dra.cpu/metadata={UID}_other",
    }
    assert files_under(plugin_dir) == {
        "dra-device-metadata/team-a_my.claim-1/cpus/metadata.json",
        "dra-device-metadata/team-a_my.claim-1/other/metadata.json",
    }
    assert files_under(cdi_dir) == {
        f"dra.cpu_metadata_{UID}_cpus.json",
        f"dra.cpu_metadata_{UID}_other.json",
    }
    remove_claim_metadata(str(plugin_dir), str(cdi_dir), "team-a", "my.claim-1", UID)
    assert files_under(plugin_dir) == set() and files_under(cdi_dir) == set()
    assert os.listdir(sentinel) == ["keep"]
