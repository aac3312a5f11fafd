"""tools/gen_proto.py and the generated modules' wire names."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dracpu.proto.dra.v1 import api_grpc as dra_v1_grpc
from dracpu.proto.dra.v1 import api_pb2 as dra_v1
from dracpu.proto.dra.v1beta1 import api_grpc as dra_v1beta1_grpc
from dracpu.proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from dracpu.proto.health.v1 import api_grpc as health_v1_grpc
from dracpu.proto.health.v1alpha1 import api_grpc as health_v1alpha1_grpc
from dracpu.proto.health.v1alpha1 import api_pb2 as health_v1alpha1
from dracpu.proto.pluginregistration import api_grpc as reg_grpc
from dracpu.proto.pluginregistration import api_pb2 as reg

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "gen_proto.py"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_proto", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_proto = load_tool()


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, check=False
    )


def test_committed_modules_match_sources() -> None:
    result = run_tool("--check")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("gen_proto: ")
    assert result.stdout.endswith(" generated files up to date\n")


def test_rewrite_imports() -> None:
    modules = {"a.x_pb2", "a.y_pb2", "a.x_grpc", "top_pb2"}
    text = (
        "from a import y_pb2 as a_dot_y__pb2\n"
        "import a.x_pb2\n"
        "x = a.x_pb2.Msg\n"
        "_builder.Build(DESCRIPTOR, 'a.x_pb2', _globals)\n"
        "from google.protobuf import descriptor as _descriptor\n"
        "import top_pb2 as top__pb2\n"
        "keep = dracpu.proto.a.x_pb2\n"
    )
    assert gen_proto.rewrite_imports(text, modules) == (
        "from dracpu.proto.a import y_pb2 as a_dot_y__pb2\n"
        "import dracpu.proto.a.x_pb2\n"
        "x = dracpu.proto.a.x_pb2.Msg\n"
        "_builder.Build(DESCRIPTOR, 'dracpu.proto.a.x_pb2', _globals)\n"
        "from google.protobuf import descriptor as _descriptor\n"
        "import dracpu.proto.top_pb2 as top__pb2\n"
        "keep = dracpu.proto.a.x_pb2\n"
    )


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "proto"
    (root / "a").mkdir(parents=True)
    (root / "a" / "y.proto").write_text(
        'syntax = "proto3";\npackage t.a;\nmessage Y { int32 v = 1; }\n'
    )
    (root / "a" / "x.proto").write_text(
        'syntax = "proto3";\npackage t.a;\nimport "a/y.proto";\n'
        "message X { Y y = 1; }\nservice S { rpc Get(X) returns (Y); }\n"
    )
    return root


def test_generate_check_and_drift(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    first = run_tool("--root", str(root), "--check")
    assert first.returncode == 1
    assert "  missing: a/x_pb2.py\n" in first.stderr
    assert "  missing: a/__init__.py\n" in first.stderr

    assert run_tool("--root", str(root)).returncode == 0
    x_pb2 = (root / "a" / "x_pb2.py").read_text()
    assert "from dracpu.proto.a import y_pb2 as a_dot_y__pb2\n" in x_pb2
    assert "import dracpu.proto.a.x_pb2\n" in (root / "a" / "x_grpc.py").read_text()
    assert run_tool("--root", str(root), "--check").returncode == 0

    (root / "a" / "y_pb2.pyi").write_text("# edited\n")
    (root / "a" / "old_pb2.py").write_text("# left behind\n")
    drift = run_tool("--root", str(root), "--check")
    assert drift.returncode == 1
    assert "  differs: a/y_pb2.pyi (" in drift.stderr
    assert "  stale (no .proto source): a/old_pb2.py\n" in drift.stderr

    assert run_tool("--root", str(root)).returncode == 0
    assert not (root / "a" / "old_pb2.py").exists()
    assert run_tool("--root", str(root), "--check").returncode == 0


def test_protoc_error_is_reported(tmp_path: Path) -> None:
    root = tmp_path / "proto"
    root.mkdir()
    (root / "bad.proto").write_text('syntax = "proto3";\nmessage {\n')
    result = run_tool("--root", str(root))
    assert result.returncode == 2
    assert result.stderr == (
        f"gen_proto: protoc failed (1):\n{root / 'bad.proto'}:2:9: Expected message name.\n"
    )


@pytest.mark.parametrize(
    ("mapping", "paths"),
    [
        (
            dra_v1_grpc.DRAPluginBase,
            [
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
            ],
        ),
        (
            dra_v1beta1_grpc.DRAPluginBase,
            [
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
            ],
        ),
        (health_v1_grpc.DRAResourceHealthBase, ["/v1.DRAResourceHealth/NodeWatchResources"]),
        (
            health_v1alpha1_grpc.DRAResourceHealthBase,
            ["/v1alpha1.DRAResourceHealth/NodeWatchResources"],
        ),
        (
            reg_grpc.RegistrationBase,
            [
                "/pluginregistration.Registration/GetInfo",
                "/pluginregistration.Registration/NotifyRegistrationStatus",
            ],
        ),
    ],
)
def test_grpc_paths(mapping: type, paths: list[str]) -> None:
    abstract: frozenset[str] = mapping.__abstractmethods__  # type: ignore[attr-defined]
    base: dict[str, object] = dict.fromkeys(abstract)
    concrete = type("Impl", (mapping,), base)
    assert sorted(concrete().__mapping__()) == paths


def _fields(message: type) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_field_numbers() -> None:
    assert _fields(reg.PluginInfo) == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert _fields(reg.RegistrationStatus) == {"plugin_registered": 1, "error": 2}
    assert _fields(dra_v1.Claim) == {"namespace": 1, "uid": 2, "name": 3}
    assert _fields(dra_v1.Device) == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert "share_id" not in _fields(dra_v1beta1.Device)
    assert _fields(dra_v1.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
    assert _fields(dra_v1.NodeUnprepareResourceResponse) == {"error": 1}
    assert _fields(health_v1alpha1.DeviceHealth) == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    assert health_v1alpha1.HealthStatus.Name(2) == "UNHEALTHY"


def test_share_id_has_presence_and_known_bytes() -> None:
    device = dra_v1.Device(pool_name="p", device_name="d")
    assert not device.HasField("share_id")
    device.share_id = ""
    assert device.HasField("share_id")
    assert device.SerializeToString() == b"\x12\x01p\x1a\x01d*\x00"


def test_distinct_descriptor_file_names() -> None:
    names = [m.DESCRIPTOR.name for m in (dra_v1, dra_v1beta1, health_v1alpha1, reg)]
    assert names == [
        "dra/v1/api.proto",
        "dra/v1beta1/api.proto",
        "health/v1alpha1/api.proto",
        "pluginregistration/api.proto",
    ]
