"""What the docs state, checked against the code: generated tables, YAML examples, CEL
selectors, the attribute table, the device example, links and anchors."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from gen_reference import GENERATORS, regenerate, sections
from mdblocks import DOCS, REPO, all_blocks, blocks, marker_above, pages

from dracpu.config import load_config
from dracpu.devices import DeviceSettings, build_inventory, build_slices
from dracpu.topology import discover_from_root

K8S_VERSION = "1.34"
FIXTURES = REPO / "tests" / "fake_sysfs"
CEL_MACHINES = ("xeon-snc", "xeon-2s-ht", "epyc-nps4", "intel-hybrid", "vm-1cpu", "arm-server")
# Kinds that are not API objects, so there is no schema for them.
NOT_API_KINDS = {"KubeletConfiguration", "Kustomization"}

_BLOCKS = all_blocks()


# -- generated tables ------------------------------------------------------------------------


def test_generated_tables_match_the_code() -> None:
    used = set()
    for page in pages():
        text = page.read_text()
        used |= {name for name, _ in sections(text)}
        assert regenerate(text) == text, (
            f"{page.relative_to(REPO)} is stale: run python tests/docs/gen_reference.py --write"
        )
    assert used == set(GENERATORS)


def test_regenerate_rewrites_a_stale_table() -> None:
    stale = "x\n<!-- generated: metrics -->\n| old |\n<!-- end generated -->\ny\n"
    fresh = regenerate(stale)
    assert "| old |" not in fresh and "`dracpu_nri_reconnects_total`" in fresh
    assert fresh.startswith("x\n") and fresh.endswith("<!-- end generated -->\ny\n")
    with pytest.raises(KeyError, match="nope"):
        regenerate("<!-- generated: nope -->\n<!-- end generated -->")


# -- YAML examples -----------------------------------------------------------------------------


def _yaml_documents() -> list[tuple[str, Any]]:
    docs: list[tuple[str, Any]] = []
    for block in _BLOCKS:
        if block.lang == "yaml":
            docs += [(block.where, d) for d in yaml.safe_load_all(block.text) if d is not None]
    for path in sorted((DOCS / "examples").glob("*.yaml")):
        rel = str(path.relative_to(REPO))
        docs += [(rel, d) for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def _is_api_object(doc: Any) -> bool:
    return isinstance(doc, dict) and "kind" in doc and "apiVersion" in doc


def test_kubernetes_objects_validate() -> None:
    checked = 0
    for _where, doc in _yaml_documents():
        if not _is_api_object(doc) or doc["kind"] in NOT_API_KINDS:
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked += 1
    assert checked >= 7, "the examples went missing"


def test_examples_cover_both_modes_and_the_options() -> None:
    kinds = {
        (where.rsplit("/", 1)[-1], d["kind"]) for where, d in _yaml_documents() if _is_api_object(d)
    }
    assert ("grouped-claim.yaml", "ResourceClaim") in kinds
    assert ("individual-claim.yaml", "ResourceClaimTemplate") in kinds
    assert ("full-cores-claim.yaml", "ResourceClaim") in kinds


def test_driver_config_examples_load(tmp_path: Path) -> None:
    """Every YAML block that is a driver config (apiVersion v1alpha1, no kind) loads."""
    loaded = 0
    for _where, doc in _yaml_documents():
        if isinstance(doc, dict) and doc.get("apiVersion") == "v1alpha1" and "kind" not in doc:
            path = tmp_path / "config.yaml"
            path.write_text(yaml.safe_dump(doc))
            load_config(str(path), {})
            loaded += 1
    assert loaded >= 2


def _file_blocks() -> dict[str, str]:
    """YAML blocks whose first line names the file they are (`# my-dracpu/config.yaml`)."""
    files = {}
    for block in _BLOCKS:
        first = block.text.splitlines()[0] if block.text.strip() else ""
        match = re.fullmatch(r"# ([\w.-]+/[\w.-]+\.yaml)", first)
        if block.lang == "yaml" and match:
            files[match.group(1)] = block.text
    return files


def test_the_users_own_overlay_builds(tmp_path: Path) -> None:
    """installation.md's overlay, written next to a copy-free view of the checkout."""
    kubectl = shutil.which("kubectl") or "/usr/bin/kubectl"
    if not Path(kubectl).exists():
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is required under CI=true")
        pytest.skip("kubectl not installed")
    files = _file_blocks()
    assert set(files) == {"my-dracpu/kustomization.yaml", "my-dracpu/config.yaml"}
    (tmp_path / "deploy").symlink_to(REPO / "deploy")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    proc = subprocess.run(
        [kubectl, "kustomize", str(tmp_path / "my-dracpu")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    objects = {o["kind"]: o for o in yaml.safe_load_all(proc.stdout)}
    container = objects["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/dracpu:v0.1.0"
    (tmp_path / "rendered.yaml").write_text(objects["ConfigMap"]["data"]["config.yaml"])
    assert load_config(str(tmp_path / "rendered.yaml"), {}).reservedCPUs == "0-1"
    assert objects["ConfigMap"]["metadata"]["namespace"] == "kube-system"


# -- devices: the attribute table, the example, CEL ----------------------------------------------

_MODES = {
    "individual": DeviceSettings(mode="individual", expose_pcie_roots=True),
    "numanode": DeviceSettings(mode="grouped", group_by="numanode", expose_pcie_roots=True),
    "socket": DeviceSettings(mode="grouped", group_by="socket", expose_pcie_roots=True),
    "machine": DeviceSettings(mode="grouped", group_by="machine", expose_pcie_roots=True),
}


@cache
def _devices(machine: str, mode: str) -> list[dict[str, Any]]:
    topo = discover_from_root(FIXTURES / machine, expose_pcie_roots=True)
    slices = build_slices(
        build_inventory(topo, _MODES[mode]), node_name="node-a", node_uid="", expose_pcie_roots=True
    )
    return [device for s in slices for device in s["spec"]["devices"]]


def _attribute_table() -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the table under the `attributes` marker in devices.md."""
    lines = (DOCS / "devices.md").read_text().splitlines()
    start = next(i for i in range(len(lines)) if marker_above(lines, i) == "attributes")
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[0], rows[2:]


def test_attribute_table_matches_the_published_devices() -> None:
    header, rows = _attribute_table()
    modes = header[2:6]
    assert modes == ["individual", "numanode", "socket", "machine"]
    documented: dict[str, set[str]] = {mode: set() for mode in modes}
    kinds = {}
    for row in rows:
        name = row[0].strip("`")
        kinds[name] = row[1]
        for mode, cell in zip(modes, row[2:6], strict=True):
            if cell == "✓":
                documented[mode].add(name)
    for mode in modes:
        seen: dict[str, str] = {}
        # isolated-rt for the attributes only nodes that isolate CPUs carry.
        for fixture in ("xeon-snc", "isolated-rt"):
            for device in _devices(fixture, mode):
                for name, value in device["attributes"].items():
                    (kind,) = value
                    seen[name] = kind
        assert set(seen) == documented[mode], mode
        for name, kind in seen.items():
            assert kinds[name] == kind, name


def test_the_grouped_device_example_is_real_output() -> None:
    (block,) = [
        b for b in blocks(DOCS / "devices.md") if b.lang == "yaml" and "cpudevnuma000" in b.text
    ]
    (example,) = yaml.safe_load(block.text)
    assert example == _devices("xeon-snc", "numanode")[0]


def _cel_device(device: dict[str, Any]) -> Any:
    """A device as Kubernetes hands it to CEL: attributes and capacity by domain."""
    attributes: dict[str, dict[str, Any]] = {}
    for qualified, value in device["attributes"].items():
        domain, _, name = qualified.rpartition("/")
        (attributes.setdefault(domain, {})[name],) = value.values()
    capacity: dict[str, dict[str, Any]] = {}
    for qualified, value in device.get("capacity", {}).items():
        domain, _, name = qualified.rpartition("/")
        capacity.setdefault(domain, {})[name] = value["value"]
    return celpy.json_to_cel({"driver": "dra.cpu", "attributes": attributes, "capacity": capacity})


def _expressions(data: Any) -> list[str]:
    if isinstance(data, dict):
        found = [data["expression"]] if isinstance(data.get("expression"), str) else []
        return found + [e for v in data.values() for e in _expressions(v)]
    if isinstance(data, list):
        return [e for v in data for e in _expressions(v)]
    return []


def _cel_cases() -> list[tuple[str, str, str]]:
    """(where, mode, expression) for every selector in the docs and examples."""
    cases = []
    for block in _BLOCKS:
        if block.marker in ("cel grouped", "cel individual"):
            mode = "numanode" if block.marker == "cel grouped" else "individual"
            cases += [(block.where, mode, e) for e in _expressions(yaml.safe_load(block.text))]
    # The grouped-mode workloads.
    docs = list(yaml.safe_load_all((DOCS / "examples" / "grouped-claim.yaml").read_text()))
    docs += [yaml.safe_load(b.text) for b in blocks(DOCS / "quickstart.md") if b.lang == "yaml"]
    cases += [("grouped workloads", "numanode", e) for d in docs for e in _expressions(d)]
    return cases


_CEL = _cel_cases()


@pytest.mark.parametrize(
    ("where", "mode", "expression"), _CEL, ids=[f"{w}:{e[:40]}" for w, _, e in _CEL]
)
def test_cel_selector_evaluates_on_every_device_of_its_mode(
    where: str, mode: str, expression: str
) -> None:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    matched = 0
    for machine in CEL_MACHINES:
        for device in _devices(machine, mode):
            try:
                result = program.evaluate({"device": _cel_device(device)})
            except celpy.CELEvalError as err:
                pytest.fail(f"{where}: {expression} on {device['name']} of {machine}: {err}")
            assert isinstance(result, celpy.celtypes.BoolType), (
                f"{where}: {expression} on {device['name']} of {machine} gave {result!r}"
            )
            matched += bool(result)
    assert matched, f"{where}: {expression} matches no device of any machine"


def test_the_deviceclass_selects_every_device() -> None:
    (expression,) = _expressions(
        yaml.safe_load((REPO / "deploy" / "base" / "deviceclass.yaml").read_text())
    )
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    for mode in _MODES:
        assert all(program.evaluate({"device": _cel_device(d)}) for d in _devices("xeon-snc", mode))


def test_cel_checks_catch_a_selector_of_the_wrong_mode() -> None:
    """An attribute the device does not have is an error, as in Kubernetes."""
    env = celpy.Environment()
    program = env.program(env.compile('device.attributes["dra.cpu"].numCPUs >= 1'))
    with pytest.raises(celpy.CELEvalError, match="numCPUs"):
        program.evaluate({"device": _cel_device(_devices("vm-1cpu", "individual")[0])})


# -- links ----------------------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = page.read_text()
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@pytest.mark.parametrize("page", pages(), ids=[str(p.relative_to(REPO)) for p in pages()])
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for match in _LINK.finditer(text):
        target = match.group("target")
        if re.match(r"^[a-z]+:", target):
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        assert resolved.exists(), f"{page.relative_to(REPO)}: broken link {target}"
        if anchor:
            assert resolved.suffix == ".md", target
            assert anchor in _anchors(resolved), f"{page.relative_to(REPO)}: no anchor {target}"


def test_slugs_follow_github() -> None:
    assert _slug("The container runtime: NRI and CDI") == "the-container-runtime-nri-and-cdi"
    assert _slug("1. The demo, on one machine") == "1-the-demo-on-one-machine"
    assert _slug("Selecting devices with `CEL`") == "selecting-devices-with-cel"


def test_readme_links_every_doc_page() -> None:
    readme = (REPO / "README.md").read_text()
    linked = {m.group("target").partition("#")[0] for m in _LINK.finditer(readme)}
    missing = [str(p.relative_to(REPO)) for p in pages() if str(p.relative_to(REPO)) not in linked]
    assert not missing, f"README.md does not link: {', '.join(missing)}"


def test_configuration_page_shows_the_manifests_command_line() -> None:
    page = DOCS / "configuration.md"
    text = page.read_text()
    (block,) = [b for b in blocks(page) if b.lang == "text" and b.text.startswith("dracpu run ")]
    assert "The manifests run the daemon as" in text
    daemonset = yaml.safe_load((REPO / "deploy" / "base" / "daemonset.yaml").read_text())
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert block.text.split() == container["command"] + container["args"]
