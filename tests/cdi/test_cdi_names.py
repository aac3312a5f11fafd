"""A claim's CDI names (behavior.md §8.5, §10.1, §10.3) and the package's one rule of
shape: ``dracpu.cdi`` imports nothing from ``dracpu.allocation``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dracpu.cdi
from dracpu.cdi import CDIError, claim_spec_path
from dracpu.cdi.metadata import (
    cdi_metadata_id,
    metadata_spec,
    metadata_spec_name,
    metadata_spec_prefix,
)
from dracpu.cdi.names import cdi_device_id, cdi_device_name
from dracpu.cdi.spec import is_claim_spec_name

UID = "6f1c2a3e-0b5d-4c1e-9a57-1d2e3f405162"


def test_claim_device_name_id_and_spec_file() -> None:
    assert cdi_device_name(UID) == f"claim-{UID}"
    assert cdi_device_id(UID) == f"dra.k8s.io/cpu=claim-{UID}"
    path = claim_spec_path("/var/run/cdi", UID)
    assert path == f"/var/run/cdi/dra.k8s.io-cpu_claim-{UID}.json"
    assert is_claim_spec_name(Path(path).name)


@pytest.mark.parametrize(
    "name",
    [
        f"dra.k8s.io-cpu_{UID}.json",  # no "claim-"
        f"dra.k8s.io-cpu_claim-{UID}.yaml",
        f"dra.cpu_metadata_{UID}_cpus.json",  # a metadata spec, not a claim spec
        f"other.vendor-cpu_claim-{UID}.json",
    ],
)
def test_other_files_are_not_claim_specs(name: str) -> None:
    assert not is_claim_spec_name(name)


@pytest.mark.parametrize("uid", ["", "a/b", "..", "a b", "x" * 129, "-a"])
def test_a_spec_path_refuses_an_unusable_uid(uid: str) -> None:
    with pytest.raises(CDIError, match="invalid claim UID"):
        claim_spec_path("/var/run/cdi", uid)


def test_metadata_names_and_spec() -> None:
    assert cdi_metadata_id(UID, "cpus") == f"dra.cpu/metadata={UID}_cpus"
    assert metadata_spec_name(UID, "cpus") == f"dra.cpu_metadata_{UID}_cpus.json"
    assert metadata_spec_name(UID, "cpus").startswith(metadata_spec_prefix(UID))
    spec = metadata_spec(UID, "my-claim", "cpus", "/plugin/meta/ns_my-claim/cpus/metadata.json")
    assert spec == {
        "cdiVersion": "0.5.0",
        "kind": "dra.cpu/metadata",
        "devices": [
            {
                "name": f"{UID}_cpus",
                "containerEdits": {
                    "mounts": [
                        {
                            "hostPath": "/plugin/meta/ns_my-claim/cpus/metadata.json",
                            "containerPath": "/var/run/kubernetes.io/dra-device-attributes/"
                            "resourceclaims/my-claim/cpus/dra.cpu-metadata.json",
                            "options": ["ro", "bind"],
                        }
                    ]
                },
            }
        ],
    }
    # The id the kubelet is handed names the spec's one device.
    assert cdi_metadata_id(UID, "cpus") == f"{spec['kind']}={spec['devices'][0]['name']}"


def test_cdi_imports_nothing_from_allocation() -> None:
    package = Path(dracpu.cdi.__file__).parent
    imported: list[tuple[str, str]] = []
    for source in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.append((source.name, node.module))
            elif isinstance(node, ast.Import):
                imported += [(source.name, alias.name) for alias in node.names]
    assert imported, "no imports found: the walk looked in the wrong place"
    assert [(f, m) for f, m in imported if m.startswith("dracpu.allocation")] == []
